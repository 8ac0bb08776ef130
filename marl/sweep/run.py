"""Grid sweeps over scenario fields and training settings (``marl sweep``).

Each ``--grid key=v1,v2`` names a scenario field by its dotted path into the scenario's
YAML mapping (``topology.kind``, ``costs.penalty_per_1k``; a number indexes a list, as in
``agents.1.count``) or, with ``--train``, a training setting (``train.lr``). The cells are
the Cartesian product of the grids, the first grid varying slowest; they run in worker
processes, or wherever an executor sends them (``marl sweep --ray`` passes
:func:`populations.cells.execute_on_ray`: Ray lives in the layer above this one). A cell
is applied with :func:`marl.training.curriculum.merge` (so ``topology.kind=chain`` on a
star drops the star's ``hub``), validated, then evaluated like ``marl run`` or trained
like ``marl train``.

Sweep directory::

    sweep.json     the sweep's arguments; a rerun with other arguments is refused
    cells.jsonl    one row per finished cell, appended as each finishes: the resume log
    cells/<id>/    each cell's run directory, as ``marl run --out`` / ``marl train`` write it
    table.md, table.csv   one row per cell in grid order, rewritten from cells.jsonl
    pareto.png     USD per episode against success rate, with the Pareto front

A rerun with the same arguments skips every cell whose latest row is ``done``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from marl.errors import ConfigError, MarlError, ScenarioError
from marl.io import append_jsonl, atomic_write_json, read_jsonl
from marl.scenario import problems_from, read_yaml
from marl.sweep.grid import Cell, apply_cell, expand, parse_grids
from marl.sweep.tables import METRICS, figure, one_line, write_tables
from marl.team import Team, load_team
from orchestration.hints import did_you_mean, listing


@dataclass(frozen=True)
class Job:
    """What a worker needs to run one valid cell (plain data, so it pickles)."""

    id: str
    values: dict[str, Any]
    scenario: dict[str, Any]
    source: str
    out: Path
    train: dict[str, Any] | None = None
    policy: str | None = None
    episodes: int = 32
    seed: int | None = None
    cache: Path | None = None  # API policies' response cache (marl run --cache)


#: Runs sweep jobs somewhere and yields their rows as they finish.
Executor = Callable[[Sequence[Job]], Iterator[dict[str, Any]]]


@dataclass
class SweepReport:
    """A finished sweep: the cells, the latest row of each, and what this call did."""

    out: Path
    cells: list[Cell]
    rows: dict[str, dict[str, Any]]
    ran: int
    skipped: int
    paths: list[Path]


def train_settings(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The training config of a cell: ``base`` (the keys set by the file and ``--set``)
    with its ``train.*`` values, validated; a bad value is a :class:`ConfigError`."""
    from marl.algorithms.config import TrainConfig

    data = {**base, **{k.removeprefix("train."): v for k, v in values.items()
                       if k.startswith("train.")}}
    try:
        TrainConfig.model_validate(data)
    except ValidationError as exc:
        problems = problems_from(exc, TrainConfig)
        raise ConfigError("invalid training setting:\n" + "\n".join(
            "  " + p.render("--grid train.*") for p in problems)) from None
    return data


def run_cell(job: Job) -> dict[str, Any]:
    """Evaluate or train one cell into ``job.out`` and return its ``cells.jsonl`` row; a
    :class:`MarlError` while running makes the row ``failed`` (a rerun retries it)."""
    from marl.cost.predict import predict_team, prediction_json

    start = time.perf_counter()
    row: dict[str, Any] = {"id": job.id, "values": job.values}
    team = load_team(job.scenario, source=job.source)
    try:
        figures = _train(job, team) if job.train is not None else _evaluate(job, team)
    except MarlError as exc:
        return {**row, "status": "failed", "error": str(exc),
                "wall_s": time.perf_counter() - start}
    predicted = prediction_json(team, predict_team(team, backend=job.policy),
                                backend=job.policy)
    return {**row, "status": "done", **figures,
            "predicted_tokens_per_episode": predicted["tokens_per_episode"]["total"],
            "predicted_cost_usd_per_episode": predicted["cost_usd_per_episode"],
            "predicted_exact": predicted["exact"],
            "run_dir": f"cells/{job.id}", "wall_s": time.perf_counter() - start}


def _tokens(per_episode: dict[str, float]) -> dict[str, float]:
    return {"tokens_per_episode": per_episode["total"],
            **{f"{k}_tokens_per_episode": per_episode[k]
               for k in ("prompt", "cached", "completion")}}


def _evaluate(job: Job, team: Team) -> dict[str, Any]:
    """Play the cell like ``marl run --out`` and write the same run directory."""
    from marl.runner import run, summarize, write_run

    result = run(team, job.episodes, seed=job.seed, policy=job.policy, cache=job.cache)
    summary = summarize(result, job.policy)
    write_run(job.out, result, summary)
    return {"success_rate": summary["success_rate"], "reward_mean": summary["reward_mean"],
            **_tokens(summary["tokens_per_episode"]),
            "cost_usd_per_episode": summary["cost_usd_per_episode"]}


def _train(job: Job, team: Team) -> dict[str, Any]:
    """Train the cell like ``marl train --out`` (continuing a run a killed sweep left);
    figures are the final evaluation's, tokens and cost from its episodes' ledgers."""
    from marl.algorithms.config import TrainConfig
    from marl.analysis.spend import token_breakdown
    from marl.training.trainer import Trainer

    cfg = TrainConfig.model_validate(job.train)
    trainer = Trainer(team, cfg, job.out, resume=(job.out / "metrics.jsonl").exists(),
                      log=lambda msg: print(f"{job.id}: {msg}", file=sys.stderr))
    summary = trainer.train()
    final = summary["final"] or read_jsonl(job.out / "metrics.jsonl")[-1]
    evals = sorted((job.out / "episodes").glob("eval_[0-9]*.jsonl"))
    totals = token_breakdown(e["ledger"] for e in read_jsonl(evals[-1]))["total"] if evals \
        else dict.fromkeys(("prompt", "cached", "completion", "cost_usd", "tokens"))
    return {"success_rate": final.get("eval_success_rate"),
            "reward_mean": final.get("eval_reward_mean"),
            **_tokens({**totals, "total": totals["tokens"]}),
            "cost_usd_per_episode": totals["cost_usd"],
            "best_eval_success_rate": summary["best"]["eval_success_rate"]
            if summary["best"]["iteration"] is not None else None,
            "best_iteration": summary["best"]["iteration"],
            "iterations": summary["iterations"], "warmup_steps": summary["warmup_steps"]}


def _init_worker() -> None:
    """Several cells share the machine: one torch thread each. Ctrl-C ends a worker at
    once (its writes are atomic, and a training cell resumes from its checkpoint), where
    a KeyboardInterrupt would leave it to run the next queued cell to the end."""
    import signal

    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))


def execute(jobs: Sequence[Job], workers: int) -> Iterator[dict[str, Any]]:
    """Rows of the jobs as they finish: in this process with one worker, else in a pool of
    spawned worker processes."""
    if workers <= 1:
        yield from map(run_cell, jobs)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker) as pool:
        futures = [pool.submit(run_cell, job) for job in jobs]
        try:
            for future in as_completed(futures):
                yield future.result()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def run_sweep(scenario: Path, grid_flags: Sequence[str], *, policy: str | None = None,
              train: Path | None = None, sets: Sequence[str] = (),
              episodes: int | None = None, seed: int | None = None,
              workers: int | None = None, out: Path | None = None,
              executor: Executor | None = None, where: str = "an executor",
              cache: Path | None = None, log: Callable[[str], None] = print) -> SweepReport:
    """Run every cell not done yet, append its row to ``cells.jsonl``, and rewrite the
    tables and the plot; every cell invalid is a :class:`MarlError` (after the tables).
    The cells run in ``workers`` processes, or through ``executor`` (described in the log
    as ``where``)."""
    raw, base_train, settings = _inputs(scenario, policy, train, sets, episodes, seed)
    grids = parse_grids(grid_flags, raw, settings)
    cells = expand(grids)
    out = out or Path("runs") / f"sweep-{raw.get('name', Path(scenario).stem)}"
    _claim(out, {"scenario": str(Path(scenario).resolve()),
                 "scenario_sha1": hashlib.sha1(Path(scenario).read_bytes()).hexdigest(),
                 "grids": [{"key": g.key, "values": list(g.values)} for g in grids],
                 "policy": policy, "episodes": None if train else episodes or 32,
                 "seed": seed, "train": None if train is None else {
                     "config": str(train.resolve()), "settings": base_train}})
    latest = {r["id"]: r for r in read_jsonl(out / "cells.jsonl")}
    todo = [c for c in cells if latest.get(c.id, {}).get("status") != "done"]
    log(f"{raw.get('name')}: {len(cells)} cells ({' × '.join(str(len(g.values)) for g in grids)})"
        + (f"; skipping {len(cells) - len(todo)} done before (cells.jsonl)"
           if len(todo) < len(cells) else "") + f"; writing {out}")
    jobs = []
    for cell in todo:
        job = _job(cell, raw, str(scenario), out, base_train, policy, episodes or 32, seed)
        if isinstance(job, Job):
            jobs.append(replace(job, cache=None if cache is None else Path(cache).resolve()))
            continue
        if latest.get(cell.id) != job:  # an unchanged invalid row is not repeated
            append_jsonl(out / "cells.jsonl", job)
        latest[cell.id] = job
        log(f"{cell.id} {cell.label}: invalid: {one_line(job['error'])}")
    n = min(len(jobs), workers or os.cpu_count() or 1)
    if executor is not None:
        rows = executor(jobs)
    else:
        rows = execute(jobs, n)
        where = f"{n} worker{'s' if n > 1 else ''}"
    if jobs:
        log(f"running {len(jobs)} cells on {where}")
    for done, row in enumerate(rows, 1):
        append_jsonl(out / "cells.jsonl", row)
        latest[row["id"]] = row
        log(f"[{done}/{len(jobs)}] {_progress(row)}")
    paths = write_tables(out, cells, latest)
    if all(latest.get(c.id, {}).get("status") == "invalid" for c in cells):
        raise MarlError(f"every one of the {len(cells)} cells is invalid (errors above and "
                        f"in {out / 'table.md'}); change the --grid values.")
    return SweepReport(out, cells, latest, len(jobs), len(cells) - len(todo), paths)


def _inputs(scenario: Path, policy: str | None, train: Path | None, sets: Sequence[str],
            episodes: int | None, seed: int | None
            ) -> tuple[dict[str, Any], dict | None, list[str] | None]:
    """The scenario file's mapping and, with ``--train``, the keys of the training config
    that the file and ``--set`` give and the names of all settings; options that do not
    apply are errors."""
    from marl.policies import BACKENDS

    if policy is not None and policy not in BACKENDS:
        raise ConfigError(f"unknown --policy {policy!r}.{did_you_mean(policy, list(BACKENDS))}"
                          f" Valid: {listing(list(BACKENDS))}.")
    if train is None and sets:
        raise ConfigError("--set overrides the training config, which needs --train CONFIG; "
                          "to fix a scenario field, give it a one-value --grid key=value.")
    if train is not None:
        given = [f for f, v in (("--policy", policy), ("--episodes", episodes),
                                ("--seed", seed)) if v is not None]
        if given:
            raise ConfigError(f"{', '.join(given)} only apply to evaluation sweeps; with "
                              "--train the training config decides (e.g. --set "
                              "eval_episodes=64, --set seed=1 or --grid train.seed=0,1).")
    raw, _ = read_yaml(scenario)
    if not isinstance(raw, dict):
        load_team(scenario)  # raises the loader's own error for a file that is no mapping
    if train is None:
        return raw, None, None
    from marl.algorithms.config import TrainConfig, load_config

    cfg = load_config(train, list(sets))
    return raw, cfg.model_dump(mode="json", exclude_unset=True), list(TrainConfig.model_fields)


def _claim(out: Path, record: dict[str, Any]) -> None:
    """Write ``sweep.json``, or check that the one there describes the same sweep."""
    record = json.loads(json.dumps(record))
    path = out / "sweep.json"
    if not path.exists():
        atomic_write_json(path, record)
        return
    old = json.loads(path.read_text())
    differ = [k for k in dict.fromkeys([*record, *old]) if old.get(k) != record.get(k)]
    if differ:
        raise MarlError(f"{out} holds another sweep: its sweep.json differs in "
                        f"{', '.join(differ)}, so its cells would mix with this one's. Choose "
                        "another --out, or repeat that sweep's arguments (and scenario "
                        "file) to resume it.")


def _job(cell: Cell, raw: dict[str, Any], source: str, out: Path, base_train: dict | None,
         policy: str | None, episodes: int, seed: int | None) -> Job | dict[str, Any]:
    """The cell's job, or its ``invalid`` row when the scenario or settings it gives are
    invalid."""
    data = apply_cell(raw, cell.values)
    where = f"{source}, cell {cell.id}"
    try:
        load_team(data, source=where)
        train = None if base_train is None else train_settings(base_train, cell.values)
    except ScenarioError as exc:  # the problems alone: the cell's values say where
        error = "; ".join(f"{p.path or '(root)'}: {p.message}" for p in exc.problems)
    except MarlError as exc:
        error = str(exc)
    else:
        return Job(cell.id, cell.values, data, where, (out / "cells" / cell.id).resolve(),
                   train, policy, episodes, seed)
    return {"id": cell.id, "values": cell.values, "status": "invalid", "error": error}


def _progress(row: dict[str, Any]) -> str:
    cell = f"{row['id']} {Cell(0, row['values']).label}"
    if row["status"] != "done":
        return f"{cell}: {row['status']}: {one_line(row['error'])}"
    figures = [f"{name} {figure(fmt, row.get(key))}" for name, key, fmt in METRICS[:4]]
    return f"{cell}: {', '.join(figures)} ({row['wall_s']:.1f} s)"
