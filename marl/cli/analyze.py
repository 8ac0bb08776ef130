"""``marl analyze``: what success costs, and how the agents came to collaborate."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from marl.cli.shared import err, guarded, out
from marl.errors import MarlError


@guarded
def analyze(
    runs: list[Path] = typer.Argument(..., help="Run, sweep or population directories."),
    report: Path | None = typer.Option(None, "--out", help="HTML report (default: "
                                       "RUN/report.html for one run, else ./report.html)."),
    as_json: bool = typer.Option(False, "--json", help="Print the numbers as JSON."),
    figures_dir: Path | None = typer.Option(None, "--figures", help="Also write every figure "
                                            "as a PNG into this folder."),
    points: int = typer.Option(20, min=1, help="Evaluations per run in the emergence curves."),
    replay: bool = typer.Option(False, help="Replay every kept checkpoint to measure causal "
                                "influence and counterfactual importance (costs tokens; "
                                "cached in RUN/analysis/)."),
    replay_episodes: int = typer.Option(64, min=1, help="Episodes per replay."),
    replay_samples: int = typer.Option(8, min=1, help="Listener samples per intervention."),
    seed: int = typer.Option(0, min=0, help="Seed of the replays."),
) -> None:
    """Report on runs: learning against cost, Pareto fronts, where tokens go, and how the
    agents came to collaborate (emergence metrics)."""
    from marl.analysis.analyze import analyze as numbers
    from marl.analysis.report import export_pngs, figures, html_report, text_summary
    from marl.io import atomic_write_text

    data = numbers(runs, points)
    if not data["runs"]:
        raise MarlError("no run to analyze:\n  " + "\n  ".join(data["problems"]))
    if replay:
        from marl.analysis.replay import replay_run

        for run in data["runs"]:
            if run.get("tokens_are") == "symbols":
                err.print(f"{run['label']}: an RLlib baseline (symbol agents, no language "
                          "model checkpoints); its interventions are not replayed",
                          highlight=False)
            elif run["kind"] == "train" and run["edges"] is not None:
                run["interventions"] = replay_run(Path(run["path"]), replay_episodes,
                                                  replay_samples, seed,
                                                  log=lambda m: err.print(m, highlight=False))
    figs = figures(data)
    target = report or (runs[0] / "report.html" if len(runs) == 1 and data["runs"][0][
        "path"] == str(runs[0]) else Path("report.html"))
    atomic_write_text(target, html_report(data, figs))
    written = export_pngs(figs, figures_dir) if figures_dir is not None else []
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        out.print(escape(text_summary(data)), highlight=False)
    err.print(f"wrote {target}" + (f" and {len(written)} PNG(s) in {figures_dir}"
                                   if written else ""), highlight=False)
