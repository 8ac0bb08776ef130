"""``marl population pbt`` and ``marl population league``: populations of teams on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from marl.cli.shared import err, guarded, need_ray_extra, out

population_app = typer.Typer(no_args_is_help=True, help="Populations of teams on Ray.")


@population_app.command("pbt")
@guarded
def population_pbt(
    scenario: Path,
    config: Path | None = typer.Option(None, help="Population config (e.g. "
                                                  "configs/population/pbt.yaml)."),
    sets: list[str] = typer.Option([], "--set", help="Population config override key=value."),
    members: int | None = typer.Option(None, min=2, help="Members (overrides the config)."),
    address: str | None = typer.Option(None, help="Ray cluster to join (default: RAY_ADDRESS, "
                                                  "else a local Ray on this machine)."),
    out_dir: Path | None = typer.Option(None, "--out", help="Population directory (default "
                                                            "runs/NAME-pbt)."),
    resume: bool = typer.Option(False, help="Continue the population in --out."),
) -> None:
    """Population-based training (Ray Tune PBT) over settings and topologies."""
    need_ray_extra()
    from marl.team import load_team
    from populations.config import load_pbt_config
    from populations.pbt import run_pbt

    team = load_team(scenario)
    cfg = load_pbt_config(config, [*sets, *([f"members={members}"] if members else [])])
    target = out_dir or Path("runs") / f"{team.name}-pbt"
    searched = ", ".join(cfg.mutations)
    out.print(f"{team.name}: {cfg.members} members x {cfg.budget_steps} steps, reports every "
              f"{cfg.perturbation_interval} steps, objective {cfg.objective}, searching "
              f"{searched}; {cfg.resources.cpus:g} CPU / {cfg.resources.gpus:g} GPU per "
              f"member; writing {target}", highlight=False)
    population = run_pbt(scenario, cfg, target, address=address, resume=resume,
                         log=lambda msg: err.print(msg, highlight=False))
    table = Table("member", "steps", "objective", "cost USD", *cfg.mutations)
    for m in population["members"]:
        settings = m["history"][-1]["settings"] if m["history"] else {}
        table.add_row(m["id"], str(m["steps"]),
                      f"{m['final']['objective']:.3f}" if m["final"] else "-",
                      f"{m['cost_usd']:.4f}", *(_setting(settings.get(k)) for k in cfg.mutations))
    out.print(table)
    best = population["best"]
    out.print(f"{population['exploits']} exploits (exploits.jsonl); best member "
              f"{best['id']} with objective {best['final']['objective']:.3f}, checkpoint "
              f"{best['checkpoint']} (marl run {scenario} --checkpoint {best['checkpoint']})",
              highlight=False)


@population_app.command("league")
@guarded
def population_league(
    scenario: Path,
    config: Path | None = typer.Option(None, help="League config (e.g. "
                                                  "configs/population/league.yaml)."),
    sets: list[str] = typer.Option([], "--set", help="League config override key=value."),
    address: str | None = typer.Option(None, help="Ray cluster to join (default: RAY_ADDRESS, "
                                                  "else a local Ray on this machine)."),
    out_dir: Path | None = typer.Option(None, "--out", help="League directory (default "
                                                            "runs/NAME-league)."),
) -> None:
    """Self-play league on a competitive scenario: PFSP opponents, snapshots, ratings."""
    need_ray_extra()
    from marl.team import load_team
    from populations.config import load_league_config
    from populations.league import check_two_teams, run_league

    team = load_team(scenario)
    check_two_teams(team)
    cfg = load_league_config(config, sets)
    target = out_dir or Path("runs") / f"{team.name}-league"
    out.print(f"{team.name}: league of teams {', '.join(team.sides)}; {cfg.generations} "
              f"generations x {cfg.iterations_per_generation} iterations, matches of "
              f"{2 * cfg.match_episodes} games, PFSP {cfg.pfsp}; writing {target}",
              highlight=False)
    result = run_league(scenario, cfg, target, address=address,
                        log=lambda msg: out.print(msg, highlight=False))
    table = Table("snapshot", "mu", "sigma", "ordinal")
    for name, r in result["ratings"].items():
        table.add_row(name, f"{r['mu']:.2f}", f"{r['sigma']:.2f}", f"{r['ordinal']:.2f}")
    out.print(table)
    out.print(f"wrote {target / 'ratings.json'}, {target / 'winrates.json'} and "
              f"{target / 'league.png'}", highlight=False)


def _setting(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
