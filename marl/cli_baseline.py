"""``marl baseline``: a classic MARL baseline (RLlib PPO over symbol agents) on a scenario."""

from __future__ import annotations

from pathlib import Path

import typer

from marl.cli_shared import err, guarded, need_ray_extra, out, progress_bar
from marl.errors import MarlError

#: What the baseline needs beyond the core: RLlib (Ray with its rllib extra) and dm-tree.
RLLIB_MODULES = ("ray", "tree", "scipy")
#: RLlib algorithms ``--algo`` accepts.
ALGORITHMS = ("ppo",)


@guarded
def baseline(
    scenario: Path,
    algo: str = typer.Option("ppo", help="RLlib algorithm (ppo)."),
    iterations: int | None = typer.Option(None, min=1, help="RLlib iterations (overrides "
                                                            "the config)."),
    config: Path | None = typer.Option(None, help="YAML file of baseline setting overrides "
                                                  "(key: value, as --set)."),
    sets: list[str] = typer.Option([], "--set", help="Baseline config override key=value."),
    address: str | None = typer.Option(None, help="Ray cluster to join (default: RAY_ADDRESS, "
                                                  "else a local Ray on this machine)."),
    out_dir: Path | None = typer.Option(None, "--out", help="Run directory (default "
                                                            "runs/NAME-rllib-ALGO)."),
) -> None:
    """Train small neural agents that exchange discrete symbols (RLlib) on the scenario's
    task and topology: the classic MARL baseline beside an LLM team (marl analyze)."""
    if algo not in ALGORITHMS:
        raise MarlError(f"--algo {algo!r}: the baselines built are {', '.join(ALGORITHMS)}.")
    need_ray_extra("marl baseline", extra="rllib", modules=RLLIB_MODULES)
    from marl.team import load_team
    from populations.baseline import describe, run_baseline
    from populations.baseline_config import load_baseline_config

    team = load_team(scenario)
    cfg = load_baseline_config(config, [*sets, f"algo={algo}",
                                        *([f"iterations={iterations}"] if iterations else [])])
    target = out_dir or Path("runs") / f"{team.name}-rllib-{cfg.algo}"
    out.print(f"{describe(team, cfg)}; writing {target}", highlight=False)
    with progress_bar("baseline", cfg.iterations, transient=False) as tick:
        summary = run_baseline(scenario, cfg, target, address=address,
                               log=lambda msg: err.print(msg, highlight=False),
                               progress=lambda row: tick(row["iteration"], _row_text(row)))
    best = summary["best"]
    found = (f"best eval success {best['eval_success_rate']:.3f} at iteration "
             f"{best['iteration']}" if best["iteration"] is not None else "no evaluation yet")
    held = {k: v for k, v in (summary["final"] or {}).items()
            if k.startswith("eval_") and k.endswith("_success_rate")
            and k != "eval_success_rate"}
    found += "".join(f"; final {k.removeprefix('eval_').removesuffix('_success_rate')} "
                     f"success {v:.3f}" for k, v in held.items())
    out.print(f"done: {summary['iterations']} iterations in {summary['wall_s']:.0f} s; {found}; "
              f"checkpoint in {target / 'checkpoints' / 'final'}", highlight=False)
    if summary.get("stopped") == "interrupted":
        err.print(f"interrupted after iteration {summary['iterations']}; what ran is kept in "
                  f"{target}", highlight=False)
        raise typer.Exit(130)


def _row_text(row: dict) -> str:
    text = f"iter {row['iteration']}: "
    if row.get("success_rate") is not None:
        text += (f"success {row['success_rate']:.3f} reward {row['reward_mean']:.3f} "
                 f"symbols/ep {row['tokens_per_episode']:.1f} ")
    text += f"{row['samples_per_s']:.0f} steps/s"
    if "eval_success_rate" in row:
        text += f" | eval success {row['eval_success_rate']:.3f}"
        text += "".join(f", {k.removeprefix('eval_').removesuffix('_success_rate')} {v:.3f}"
                        for k, v in row.items() if k.startswith("eval_")
                        and k.endswith("_success_rate") and k != "eval_success_rate")
    return text
