"""Finding and reading run directories, tolerating what a live or killed run leaves behind.

A *run* is a training run (``metrics.jsonl``, written by ``marl train`` or a population
member) or an evaluation (``summary.json`` + ``episodes.jsonl``, written by ``marl run`` or
a sweep cell). Any other directory is searched two levels deep for runs, so a sweep, a
population or a folder of runs can be passed whole; a sweep's ``cells.jsonl`` and a
population's ``population.json`` add each run's swept or mutated values.

Nothing here raises on a damaged run: what could not be read becomes a note on the run (or
a problem of the analysis), and the rest is still read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_EVAL = re.compile(r"^eval_(\d+)\.jsonl$")


@dataclass
class Run:
    """One run directory, as far as it could be read."""

    path: Path
    kind: str  # "train" | "eval"
    label: str
    group: str | None = None  # the sweep / population / folder it was found in
    values: dict[str, Any] = field(default_factory=dict)  # swept or mutated settings
    rows: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl
    summary: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    # Evaluations in order: (0, the warm-up's last), then (iteration, file) of RL.
    evals: list[tuple[int, Path]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be read, and why

    @property
    def finished(self) -> bool:
        """Whether the run wrote its summary after its last metrics row."""
        if self.summary is None:
            return False
        if self.kind == "eval":
            return True
        last = self.rows[-1]["iteration"] if self.rows else 0
        return self.summary.get("iterations", -1) >= last

    @property
    def scenario_file(self) -> Path | None:
        """The scenario as the run played it (``scenario.yaml``), if the run kept it."""
        path = self.path / "scenario.yaml"
        return path if path.is_file() else None

    @property
    def episodes_file(self) -> Path | None:
        """The episodes that describe the run's final behaviour: an evaluation's
        ``episodes.jsonl``, or a training run's last evaluation."""
        if self.kind == "eval":
            path = self.path / "episodes.jsonl"
            return path if path.is_file() else None
        return self.evals[-1][1] if self.evals else None


def read_jsonl(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    """Every readable row of a JSON-lines file; each unreadable line becomes a note (a cut
    last line is what a run being written, or killed mid-write, leaves)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        notes.append(f"{path.name}: cannot be read ({exc.strerror}).")
        return []
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            where = "its last line is cut short (a run still being written, or killed)" \
                if i == len(lines) - 1 else f"line {i + 1} is not a JSON object; skipped"
            notes.append(f"{path.name}: {where}.")
            continue
        rows.append(row)
    return rows


def _read_json(path: Path, notes: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        notes.append(f"{path.name} is not valid JSON (being written, or damaged); ignored.")
        return None
    return data if isinstance(data, dict) else None


def _read_yaml(path: Path, notes: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        notes.append(f"{path.name} is not valid YAML; ignored.")
        return None
    return data if isinstance(data, dict) else None


def is_run(path: Path) -> bool:
    return (path / "metrics.jsonl").is_file() or (
        (path / "summary.json").is_file() and (path / "episodes.jsonl").is_file())


def load_run(path: Path, label: str | None = None, group: str | None = None) -> Run:
    """Read one run directory (see :func:`is_run`)."""
    path = Path(path)
    kind = "train" if (path / "metrics.jsonl").is_file() else "eval"
    run = Run(path=path, kind=kind, label=label or path.name, group=group)
    run.summary = _read_json(path / "summary.json", run.notes)
    if kind == "train":
        run.rows = read_jsonl(path / "metrics.jsonl", run.notes)
        run.config = _read_yaml(path / "config.yaml", run.notes)
        evals = [(int(m.group(1)), f) for f in (path / "episodes").glob("eval_*.jsonl")
                 if (m := _EVAL.match(f.name))]
        warmup = sorted((path / "episodes").glob("eval_warmup_*.jsonl"))
        # The team as the warm-up left it, before any reward: iteration 0.
        run.evals = ([(0, warmup[-1])] if warmup else []) + sorted(evals)
        if not run.rows:
            run.notes.append("metrics.jsonl has no rows yet.")
        if not run.finished:
            run.notes.append("no summary.json after the last metrics row: the run is still "
                             "being written, or was stopped; figures are as far as it got.")
    return run


def _annotations(path: Path, notes: list[str]) -> dict[str, dict[str, Any]]:
    """Swept values by run directory name: a sweep's cells or a population's members."""
    values: dict[str, dict[str, Any]] = {}
    if (path / "cells.jsonl").is_file():
        for cell in read_jsonl(path / "cells.jsonl", notes):
            if cell.get("status") == "done" and "id" in cell:
                values[str(cell["id"])] = dict(cell.get("values", {}))
            elif cell.get("status") == "invalid":
                notes.append(f"sweep cell {cell.get('id')} {cell.get('values')} was invalid: "
                             f"{cell.get('error', 'no reason recorded')}")
    population = _read_json(path / "population.json", notes)
    for member in (population or {}).get("members", []):
        history = member.get("history") if isinstance(member, dict) else None
        if history and isinstance(history[-1].get("settings"), dict):
            values[str(member["id"])] = dict(history[-1]["settings"])  # its last settings
    return values


def discover(paths: list[Path]) -> tuple[list[Run], list[str]]:
    """Every run under ``paths`` (a run itself, or a directory holding runs up to two levels
    down), and the problems found: paths that hold no run at all."""
    runs: list[Run] = []
    problems: list[str] = []
    for path in map(Path, paths):
        if not path.is_dir():
            problems.append(f"{path}: no such directory; pass run directories written by "
                            "marl train, marl run, marl sweep or marl population.")
            continue
        if is_run(path):
            runs.append(load_run(path))
            continue
        notes: list[str] = []
        values = _annotations(path, notes)
        found = sorted({p.parent for p in [*path.glob("*/metrics.jsonl"),
                                           *path.glob("*/*/metrics.jsonl"),
                                           *path.glob("*/summary.json"),
                                           *path.glob("*/*/summary.json")] if is_run(p.parent)})
        problems += [f"{path}: {n}" for n in notes]
        if not found:
            problems.append(f"{path} is not a run directory: it has no metrics.jsonl, no "
                            "summary.json with episodes.jsonl, and no run below it; pass "
                            "directories written by marl train, run, sweep or population.")
            continue
        for sub in found:
            runs.append(load_run(sub, label=f"{path.name}/{sub.name}", group=path.name))
            runs[-1].values = values.get(sub.name, {})
    return runs, problems
