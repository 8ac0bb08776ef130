"""``kill -9`` a `marl train` run 20 times, at seeded random points of every phase (warm-up,
an RL update, a checkpoint write, an evaluation, and at random moments), resuming it each
time: every resume succeeds and the finished run's metrics and weights equal an
uninterrupted run's, bit for bit."""

from __future__ import annotations

import signal
import time

import numpy as np

from tests.faults.conftest import finish, marl, rows, train_args


def schedule(rng: np.random.Generator) -> list[tuple[str, int]]:
    """Where each kill lands: the warm-up's first (it ends after 6 steps), then the rest
    shuffled. ``(point, k)``: at the k-th time the process reaches ``point``; ``timed``:
    after k more metrics rows, a random fraction of a step later."""
    ks = lambda n: [int(k) for k in rng.integers(1, 3, n)]  # noqa: E731
    rest = ([("update", k) for k in ks(5)] + [("checkpoint", k) for k in ks(4)]
            + [("evaluation", 1)] * 4 + [("timed", k) for k in ks(3)])
    rng.shuffle(rest)
    return [("warmup", k) for k in ks(4)] + rest


def lines(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def timed_kill(proc, metrics, k: int, rng: np.random.Generator) -> None:
    start = lines(metrics)
    while lines(metrics) < start + k and proc.poll() is None:
        time.sleep(0.01)
    time.sleep(float(rng.uniform(0, 0.08)))
    proc.send_signal(signal.SIGKILL)


def test_twenty_kill_9s_resume_to_the_uninterrupted_run_bit_for_bit(uninterrupted, tmp_path):
    full, run = uninterrupted, tmp_path / "killed"
    rng = np.random.default_rng(37)
    plan = schedule(rng)
    assert len(plan) == 20
    for i, (point, k) in enumerate(plan):
        proc = marl(train_args(run, resume=True), "never" if point == "timed" else point, k)
        if point == "timed":
            timed_kill(proc, run / "metrics.jsonl", k, rng)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == -signal.SIGKILL, (
            f"kill {i + 1} ({point} #{k}) did not happen; the run exited {proc.returncode}:"
            f"\n{out[-3000:]}")
        assert "Traceback" not in out, out
    finish(marl(train_args(run, resume=True)))
    assert rows(run) == rows(full)
    for name in ("iter_000030", "best", "warmup"):
        for f in sorted((full / "checkpoints" / name).rglob("*.safetensors")):
            twin = run / "checkpoints" / name / f.relative_to(full / "checkpoints" / name)
            assert twin.read_bytes() == f.read_bytes(), twin
    leftovers = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # half-written checkpoints were cleaned up on resume
