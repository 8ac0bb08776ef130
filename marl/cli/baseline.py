"""``marl baseline``: a classic MARL baseline (RLlib PPO over symbol agents) on a scenario."""

from __future__ import annotations

from pathlib import Path

import typer

from marl.cli.shared import (
    err,
    eval_text,
    guarded,
    need_ray_extra,
    out,
    progress_bar,
    split_rates,
)
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
    from marl.baseline.config import load_baseline_config
    from marl.baseline.rllib import describe, run_baseline
    from marl.team import load_team

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
    found += "".join(f"; final {split} success {v:.3f}"
                     for split, v in split_rates(summary["final"] or {}).items())
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
    return text + f"{row['samples_per_s']:.0f} steps/s" + eval_text(row)
