"""Hostile scenario files are refused fast, in bounded memory, with a clear message: YAML
alias bombs (small on disk, gigabytes once expanded), recursive aliases, oversized files, a
10^6-agent template, a 10^6-round protocol, and names that would escape the run directory.
(A checkpoint that would run code under pickle: tests/faults/test_checkpoints.py.)"""

from __future__ import annotations

import time
import tracemalloc

import pytest
import yaml
from typer.testing import CliRunner

from marl.cli import app
from marl.errors import ScenarioError
from marl.team import load_team
from tests.marl.conftest import ROOT

SIGNAL = yaml.safe_load((ROOT / "scenarios" / "signal.yaml").read_text())


def laughs(levels: int = 9) -> str:
    """A billion laughs: 9 levels of 9 aliases each expand to 9^9 = 387 million strings."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join(lines)


def scenario_text(**changes) -> str:
    return yaml.safe_dump({**SIGNAL, **changes}, sort_keys=False)


HOSTILE = {
    "alias bomb in a string field": (
        laughs() + "\n" + scenario_text().replace("description:", "old_description:")
        + "description: *a8\n", "expands to more than"),
    "alias bomb in task params": (
        laughs() + "\n" + scenario_text().replace("task:", "old_task:")
        + "task: {name: signal_v0, params: {objects: *a8}}\n", "expands to more than"),
    "recursive alias": (scenario_text() + "extra: &r [*r]\n", "recursive alias"),
    "a 10^6-agent template": (
        scenario_text(agents=[{"count": 10**6, "id": "w{i}", "policy": "speaker"}]),
        "1000000 agents"),
    "a 10^6-round protocol": (
        scenario_text(protocol={"rounds": 10**6, "answer": "listener"}), "protocol.rounds"),
    "an oversized file": (scenario_text(description="x" * (5 * 2**20)), "limit of"),
    "a scenario name with ..": (scenario_text(name="../../escape"), "invalid name"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_scenario_is_refused_fast_in_bounded_memory(tmp_path, case):
    text, fragment = HOSTILE[case]
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(ScenarioError) as raised:
        load_team(path)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert fragment in str(raised.value), str(raised.value)[:500]
    assert seconds < 1.0, f"{case}: refused after {seconds:.2f} s"
    assert peak < 64 * 2**20 + 4 * len(text), f"{case}: {peak / 2**20:.0f} MiB at peak"


def test_names_that_would_escape_the_run_directory_write_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = {**SIGNAL, "name": "../escape"}
    data["policies"] = {"../../p" if k == "speaker" else k: v
                        for k, v in SIGNAL["policies"].items()}
    for agent in data["agents"]:
        agent["policy"] = "../../p" if agent.get("policy") == "speaker" else agent["policy"]
    path = tmp_path / "in" / "s.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = CliRunner().invoke(app, ["train", str(path), "--set", "iterations=1"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "s.yaml:1: name: invalid name '../escape'" in res.output
    assert "policies.../../p: invalid name '../../p'" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # no runs/, no escape
