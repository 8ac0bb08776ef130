"""``marl sweep``: the same task across a grid of scenario variants, evaluated or trained."""

from __future__ import annotations

import functools
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from marl.cli.shared import err, guarded, need_ray_extra, out


@guarded
def sweep(
    scenario: Path,
    grids: list[str] = typer.Option(..., "--grid", help="key=v1,v2,...: a scenario field by "
                                    "its dotted path (topology.kind, agents.1.count) or, with "
                                    "--train, train.SETTING; repeat for a product."),
    policy: str | None = typer.Option(None, help="Override every policy's backend: "
                                                 "scripted | random | tiny | hf."),
    train: Path | None = typer.Option(None, help="Train every cell with this training config "
                                                 "(e.g. configs/algorithm/magrpo.yaml)."),
    sets: list[str] = typer.Option([], "--set", help="Training config override key=value "
                                                     "(with --train)."),
    episodes: int | None = typer.Option(None, min=1, help="Episodes per cell (default 32)."),
    seed: int | None = typer.Option(None, min=0, help="Seed (default: the scenario's)."),
    workers: int | None = typer.Option(None, min=1, help="Worker processes (default: "
                                                         "min(cells, CPUs); 1: in-process)."),
    out_dir: Path | None = typer.Option(None, "--out", help="Sweep directory (default "
                                                            "runs/sweep-NAME)."),
    ray: bool = typer.Option(False, "--ray", help="Run the cells as Ray tasks (a local Ray, "
                                                  "or RAY_ADDRESS) instead of processes."),
    address: str | None = typer.Option(None, help="Ray cluster to run the cells on "
                                                   "(implies --ray)."),
    cache: Path | None = typer.Option(None, help="API policies: store responses here by "
                                                 "request hash and answer repeats from it."),
) -> None:
    """Evaluate (or train) every cell of a grid over scenario fields; write cells.jsonl,
    table.md, table.csv and pareto.png. Run it again to resume."""
    from marl.sweep import run_sweep
    from marl.sweep.tables import table_rows

    executor, where = None, "an executor"
    if ray or address:
        need_ray_extra("marl sweep --ray")
        from populations.cells import execute_on_ray

        executor = functools.partial(execute_on_ray, address=address)
        where = f"Ray ({address or 'RAY_ADDRESS or a local Ray'})"
    try:
        report = run_sweep(scenario, grids, policy=policy, train=train, sets=sets,
                           episodes=episodes, seed=seed, workers=workers, out=out_dir,
                           executor=executor, where=where, cache=cache,
                           log=lambda msg: err.print(msg, markup=False, highlight=False))
    except KeyboardInterrupt:
        err.print("interrupted; finished cells are kept in cells.jsonl: run the same command "
                  "again to resume.", highlight=False)
        raise typer.Exit(130) from None
    header, rows = table_rows(report.cells, report.rows)
    table = Table(title=f"{len(report.cells)} cells: {report.ran} run, {report.skipped} "
                        "skipped (done before)")
    for i, col in enumerate(header[:-1]):  # errors are printed above and kept in table.md
        table.add_column(col, justify="right" if i > len(report.cells[0].values) else "left")
    for row in rows:
        table.add_row(*map(escape, row[:-1]))
    out.print(table)
    out.print("wrote " + ", ".join(str(p) for p in [report.out / "cells.jsonl", *report.paths])
              + f" and {report.out / 'cells'}/", highlight=False)
