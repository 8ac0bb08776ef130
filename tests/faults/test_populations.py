"""Populations under faults: a PBT member killed while it writes its checkpoint, and a
league's Ray worker killed in the middle of a match. Each population completes and its
outputs are whole and consistent (the league's, equal to an undisturbed league's)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from populations.league import run_league
from populations.pbt import run_pbt
from tests.marl.conftest import ROOT
from tests.populations.test_league import CIPHER, small
from tests.populations.test_pbt import pbt_config


def watch(find, seconds: float = 180) -> tuple[threading.Thread, list]:
    """A thread that SIGKILLs the first process ``find()`` returns (polling every ms)."""
    killed: list = []

    def run() -> None:
        deadline = time.monotonic() + seconds
        while not killed and time.monotonic() < deadline:
            try:
                found = find()
            except (OSError, psutil.Error):  # it vanished while it was read: look again
                found = []
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    continue
            time.sleep(0.001)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, killed


def whole_lines(path: Path) -> list[dict]:
    text = path.read_text()
    assert not text or text.endswith("\n"), path
    return [json.loads(line) for line in text.splitlines()]


def test_a_pbt_member_killed_while_writing_its_checkpoint(ray_local, tmp_path):
    out = tmp_path / "pop"
    scratch = Path(tempfile.gettempdir())

    def writing() -> list[int]:
        """The members whose checkpoint is half written now (a member saves into a fresh
        temporary directory before handing it to Tune)."""
        half = False
        for entry in os.scandir(scratch):
            if entry.name.startswith("tmp"):
                try:
                    half = half or any(n.startswith(".trainer.") for n in os.listdir(entry))
                except OSError:  # not a directory, or gone already
                    continue
        if not half:
            return []
        return [rows[-1]["pid"] for f in out.glob("members/*/lineage.jsonl")
                if (rows := whole_lines(f))]

    thread, killed = watch(writing)
    cfg = pbt_config(budget_steps=16, perturbation_interval=4,
                     mutations={"temperature": [0.9, 1.0]})
    population = run_pbt(ROOT / "scenarios" / "signal.yaml", cfg, out, log=lambda m: None)
    thread.join()
    assert killed, "no member was caught writing a checkpoint"
    assert population["finished"] and [m["steps"] for m in population["members"]] == [16, 16]
    restarted = set()
    for member in out.glob("members/*"):
        whole_lines(member / "reports.jsonl")
        whole_lines(member / "metrics.jsonl")
        assert json.loads((member / "summary.json").read_text())["steps"] == 16
        pids = [r["pid"] for r in whole_lines(member / "lineage.jsonl")]
        for pid in set(pids) & set(killed):  # it went on in a new process, from a checkpoint
            later = pids[pids.index(pid) + 1:]
            assert later and pid not in later
            restarted.add(pid)
    assert restarted == set(killed)
    assert (Path(population["best"]["checkpoint"]) / "speaker").is_dir()


@pytest.fixture(scope="module")
def undisturbed(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("league") / "league"
    run_league(CIPHER, small(), out, log=lambda m: None)
    return out


def matches() -> list[int]:
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        if (proc.info["cmdline"] or [""])[0].startswith("ray::match"):
            out.append(proc.pid)
    return out[:1]


def test_a_league_worker_killed_mid_match(undisturbed, tmp_path):
    out = tmp_path / "league"
    thread, killed = watch(matches)
    run_league(CIPHER, small(), out, log=lambda m: None)
    thread.join()
    assert killed, "no match was caught running"
    for name in ("winrates.json", "ratings.json"):  # the retried match played the same games
        assert json.loads((out / name).read_text()) == json.loads((undisturbed / name).read_text())
    assert whole_lines(out / "generations.jsonl") == whole_lines(undisturbed / "generations.jsonl")
