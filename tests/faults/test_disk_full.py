"""A full disk, as ``RLIMIT_FSIZE`` makes one (a write past the limit fails): during a
checkpoint write and during the metrics appends, the run stops with a clear message, keeps
only whole files and whole lines, and once space returns ``--resume`` continues from the
last complete checkpoint to the uninterrupted run's metrics."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.faults.conftest import (
    SETTINGS,
    finish,
    fsize_limit,
    marl,
    rows,
    train_args,
)

FULL = "the disk is full, or a file size limit was reached"


def whole_lines(path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_a_full_disk_during_a_checkpoint(uninterrupted, tmp_path):
    run = tmp_path / "run"
    finish(marl(train_args(run), "update", 8), rc=-9)  # checkpoints up to iteration 7
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    # weights (1.6 MB a policy) no longer fit: the next checkpoint fails
    out = finish(marl(train_args(run, resume=True), **fsize_limit(2**20)), rc=2)
    assert "writing the checkpoint" in out and "free some space" in out, out
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == kept  # nothing half
    whole_lines(run / "metrics.jsonl")
    finish(marl(train_args(run, resume=True)))
    assert rows(run) == rows(uninterrupted)


def test_a_full_disk_while_appending_metrics(uninterrupted, tmp_path):
    run = tmp_path / "run"
    rare = {**SETTINGS, "checkpoint_every": 1000}  # only the warm-up's end is kept
    finish(marl(train_args(run, settings=rare), "update", 3), rc=-9)
    # room for less than one more row: the first append after the resume fails, before any
    # new best evaluation writes a checkpoint (which would not fit either)
    room = (run / "metrics.jsonl").stat().st_size + 200
    out = finish(marl(train_args(run, resume=True, settings=rare), **fsize_limit(room)), rc=2)
    assert FULL in out and "metrics.jsonl" in out, out
    assert (run / "metrics.jsonl").stat().st_size <= room
    assert [r["iteration"] for r in whole_lines(run / "metrics.jsonl")][-1] >= 2
    finish(marl(train_args(run, resume=True, settings=rare)))
    assert rows(run) == rows(uninterrupted)


def test_an_append_that_does_not_fit_writes_nothing(tmp_path):
    """The line straddles the limit: the part that fitted is cut back off."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n')
    code = ("import errno, sys; from marl.io import append_jsonl\n"
            "try:\n"
            f"    append_jsonl({str(path)!r}, {{'step': 2, 'pad': 'x' * 100}})\n"
            "except OSError as exc:\n"
            "    sys.exit(0 if exc.errno in (errno.EFBIG, errno.ENOSPC) else 1)\n"
            "sys.exit(1)\n")
    subprocess.run([sys.executable, "-c", code], check=True, **fsize_limit(40))
    assert path.read_text() == '{"step": 1}\n'
