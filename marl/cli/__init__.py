"""The ``marl`` command line: one module per command group, assembled here.

The CLI is the top layer: the one part of ``marl`` that reaches into ``populations/``
(``marl population``, ``marl sweep --ray``), lazily and only after checking the extra.
"""

from __future__ import annotations

import typer

from marl.cli import analyze, baseline, scenario, sweep, train
from marl.cli.population import population_app

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="llm-marl: simulate, price and train teams of LLM agents.")
topology_app = typer.Typer(no_args_is_help=True, help="Inspect topology generators.")
app.command()(scenario.validate)
app.command()(scenario.cost)
app.command()(scenario.run)
app.command()(sweep.sweep)
app.command()(train.train)
app.command()(analyze.analyze)
app.command("baseline")(baseline.baseline)
topology_app.command("show")(scenario.topology_show)
app.add_typer(topology_app, name="topology")
app.add_typer(population_app, name="population")


def main() -> None:
    app()


__all__ = ["app", "main"]
