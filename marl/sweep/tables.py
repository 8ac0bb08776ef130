"""The tables and the Pareto plot of a sweep (``table.md``, ``table.csv``, ``pareto.png``),
rebuilt from ``cells.jsonl`` rows; see :mod:`marl.sweep`."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marl.analysis.spend import pareto_front
from marl.io import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    from marl.sweep.grid import Cell

#: Table columns after the swept values: (heading, cells.jsonl key, format).
METRICS = (("success", "success_rate", "{:.3f}"), ("reward", "reward_mean", "{:.4f}"),
           ("tokens/episode", "tokens_per_episode", "{:,.1f}"),
           ("USD/episode", "cost_usd_per_episode", "{:.8f}"),
           ("predicted tokens/episode", "predicted_tokens_per_episode", "{:,.1f}"),
           ("predicted USD/episode", "predicted_cost_usd_per_episode", "{:.8f}"))



def figure(fmt: str, value: Any) -> str:
    return "-" if value is None else fmt.format(value)


def show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def one_line(text: str) -> str:
    return " ".join(text.split())


def table_rows(cells: Sequence[Cell], rows: dict[str, dict[str, Any]],
               formatted: bool = True) -> tuple[list[str], list[list[Any]]]:
    """Header and one row per cell in grid order: the swept values, status, the figures
    (formatted, or raw numbers for CSV) and the error of an invalid or failed cell."""
    header = [*cells[0].values, "status", *(name for name, _, _ in METRICS), "error"]
    body = []
    for cell in cells:
        row = rows.get(cell.id, {"status": "pending"})
        figures = [row.get(key) for _, key, _ in METRICS]
        if formatted:
            figures = [figure(fmt, v) for (_, _, fmt), v in zip(METRICS, figures, strict=True)]
        body.append([*map(show, cell.values.values()), row["status"], *figures,
                     one_line(row.get("error", ""))])
    return header, body


def write_tables(out: Path, cells: Sequence[Cell], rows: dict[str, dict[str, Any]]
                 ) -> list[Path]:
    """``table.md``, ``table.csv`` and (when a cell is done) ``pareto.png``."""
    header, body = table_rows(cells, rows)
    lines = [header, ["---"] * len(header), *body]
    md = "".join("| " + " | ".join(str(c).replace("|", "\\|") for c in line) + " |\n"
                 for line in lines)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(table_rows(cells, rows, formatted=False)[1])
    paths = [atomic_write_text(out / "table.md", md),
             atomic_write_text(out / "table.csv", buffer.getvalue())]
    done = [c for c in cells if rows.get(c.id, {}).get("status") == "done"]
    if done:
        paths.append(plot_pareto(out / "pareto.png",
                                 [", ".join(map(show, c.values.values())) for c in done],
                                 [rows[c.id] for c in done]))
    return paths


def plot_pareto(path: Path, labels: Sequence[str], rows: Sequence[dict[str, Any]]) -> Path:
    """USD per episode (x) against success rate (y), every cell a labelled point, the
    Pareto front as a step line; rendered on an Agg canvas, written atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    nan = float("nan")
    costs = [nan if r["cost_usd_per_episode"] is None else r["cost_usd_per_episode"]
             for r in rows]
    success = [nan if r["success_rate"] is None else r["success_rate"] for r in rows]
    front = pareto_front(costs, success)
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.scatter(costs, success, color="#2b5d8a", zorder=2)
    for label, x, y in zip(labels, costs, success, strict=True):
        note = ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4),
                           fontsize=7, annotation_clip=True)
        note.set_in_layout(False)
    if front:  # a front point's success holds up to the dearest cell: extend the last step
        xs = [costs[i] for i in front] + [max(c for c in costs if c == c)]
        ys = [success[i] for i in front] + [success[front[-1]]]
        ax.plot(xs, ys, drawstyle="steps-post", color="#c0392b", label="Pareto front",
                zorder=1)
        ax.legend(loc="best")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("USD per episode")
    ax.set_ylabel("success rate")
    ax.set_title(f"{len(rows)} cells: cost against success")
    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=100)
    return atomic_write_bytes(path, data.getvalue())
