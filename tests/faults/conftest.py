"""What the fault-injection suite shares: a short `marl train` run of the signal scenario
as a subprocess (so that it can be killed), and its metrics without the timing fields."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.marl.conftest import ROOT

SCENARIO = ROOT / "scenarios" / "signal.yaml"
#: 6 warm-up steps, 30 iterations (~3 s of training), a checkpoint after every step.
SETTINGS = {"warmup_steps": 6, "warmup_episodes": 4, "iterations": 30, "episodes_per_iter": 2,
            "group_size": 2, "eval_every": 2, "eval_episodes": 4, "checkpoint_every": 1,
            "keep_checkpoints": 3, "transcripts_per_iter": 1}


def train_args(out: Path, resume: bool = False, settings: dict | None = None) -> list[str]:
    sets = [f"--set={k}={v}" for k, v in (settings or SETTINGS).items()]
    return ["train", str(SCENARIO), "--out", str(out), *sets, *(["--resume"] if resume else [])]


def marl(args: list[str], point: str = "never", k: int = 1, **popen) -> subprocess.Popen:
    """``marl ARGS`` in a subprocess, with a SIGKILL planted at ``point``
    (:mod:`tests.faults.killer`)."""
    return subprocess.Popen([sys.executable, "-m", "tests.faults.killer", point, str(k), "--",
                             *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def rows(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k not in ("wall_s", "samples_per_s")}
            for x in (out / "metrics.jsonl").read_text().splitlines()]


def finish(proc: subprocess.Popen, rc: int = 0) -> str:
    """Wait for ``proc``; check its exit status and that it printed no traceback."""
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == rc and "Traceback" not in out, (proc.returncode, out[-3000:])
    return out


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> Path:
    """The run every faulted run must end up equal to."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    finish(marl(train_args(out)))
    return out


def fsize_limit(limit: int) -> dict:
    """Popen arguments that cap every file the process writes at ``limit`` bytes
    (``RLIMIT_FSIZE``): past it a write fails as on a full disk (Python ignores SIGXFSZ)."""
    import resource

    return {"preexec_fn": lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))}
