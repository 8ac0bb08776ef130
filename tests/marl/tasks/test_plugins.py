"""Task plugins: the README's example task, in a package outside the repository, named in a
scenario, works in every command (and their worker processes); installed packages register
short ids; every failure to resolve a task says what failed and how to fix it."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
from typer.testing import CliRunner

from marl.cli import app
from marl.cluster import QUIET, shipped
from marl.errors import MarlError, ScenarioError
from marl.tasks import task_class
from marl.team import load_team
from tests.marl.conftest import ROOT

README = (ROOT / "README.md").read_text()

SCENARIO = """\
name: max_chain
task: {name: "mytasks:MaxDigit", params: {values: 10}}
agents:
  - {count: 3, id: "a{i}", policy: agent}
policies:
  agent: {backend: tiny, max_new_tokens: 2}
topology: {kind: chain}
protocol: {rounds: 1, answer: a2}
"""
#: A task with only the required hooks: no oracle, no random policy, no format check.
BARE = """
import numpy as np
from marl.tasks import Instance, Task, TaskParams

class Bare(Task):
    id = "bare_v0"
    Params = TaskParams

    def sample(self, rng):
        return Instance({a: "x" for a in self.agents}, "1")

    def message_length(self, agent):
        return 1

    @property
    def answer_length(self):
        return 1

class NoLengths(Bare):
    id = "no_lengths_v0"
    message_length = Task.message_length

class NotATask:
    pass

raise_on_import = None
"""
RL = ["--set", "iterations=3", "--set", "episodes_per_iter=2", "--set", "group_size=2",
      "--set", "eval_episodes=4", "--set", "eval_every=2"]
TRAIN = [*RL, "--set", "warmup_steps=2", "--set", "warmup_episodes=4"]
PBT = {"members": 2, "budget_steps": 6, "perturbation_interval": 2, "quantile_fraction": 0.5,
       "train": {"warmup_steps": 2, "warmup_episodes": 4, "episodes_per_iter": 2,
                 "group_size": 2, "eval_episodes": 4, "eval_every": 100,
                 "checkpoint_every": 1000, "transcripts_per_iter": 0}}


def readme_plugin() -> str:
    section = README.split("### Your own task", 1)[1]
    return re.search(r"```python\n(.+?)```", section, flags=re.S).group(1)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """A folder holding the package ``mytasks`` (the README's example and ``bare``), an
    installed-package record registering ``max_digit_v0``, and the scenario."""
    root = tmp_path_factory.mktemp("plugins")
    (root / "mytasks").mkdir()
    (root / "mytasks" / "__init__.py").write_text(readme_plugin())
    (root / "mytasks" / "bare.py").write_text(BARE)
    (root / "mytasks" / "broken.py").write_text("import no_such_dependency_here\n")
    info = root / "mytasks-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mytasks\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[llm_marl.tasks]\nmax_digit_v0 = mytasks:MaxDigit\n")
    (root / "max.yaml").write_text(SCENARIO)
    return root


def marl(plugin, *args: str, on_path: bool = False) -> subprocess.CompletedProcess:
    """``marl ARGS`` in a fresh process. By default the plugin is imported from its folder,
    which is then taken off ``sys.path``, so that a Ray worker can only get it as the driver
    ships it; with ``on_path``, the folder is on ``PYTHONPATH`` as a user would set it."""
    driver = textwrap.dedent(f"""
        import sys
        {'' if on_path else f'sys.path.insert(0, {str(plugin)!r}); import mytasks; '
                            f'sys.path.remove({str(plugin)!r})'}
        sys.argv = ["marl", *{list(args)!r}]
        from marl.cli import main
        main()
    """)
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must be short
    env = {**os.environ, **QUIET, "RAY_TMPDIR": short,
           "PYTHONPATH": os.pathsep.join([str(ROOT), *([str(plugin)] if on_path else [])])}
    try:
        return subprocess.run([sys.executable, "-c", driver], cwd=plugin, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def test_the_readme_plugin_validates_costs_and_plays(plugin, tmp_path):
    assert "max_digit_v0" in ok(marl(plugin, "validate", "max.yaml"))
    cost = json.loads(marl(plugin, "cost", "max.yaml", "--policy", "random", "--json").stdout)
    assert cost["kind"] == "exact"
    ok(marl(plugin, "run", "max.yaml", "--policy", "random", "--episodes", "16",
            "--out", str(tmp_path / "run")))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["episodes"] == 16 and "oracle_agreement" not in summary
    assert summary["format_valid_rate"] == {"a0": 1.0, "a1": 1.0, "a2": 1.0}
    assert summary["tokens_per_episode"] == cost["tokens_per_episode"]
    refused = marl(plugin, "run", "max.yaml", "--policy", "scripted", "--out",
                   str(tmp_path / "scripted"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "max_digit_v0 has no scripted oracle" in refused.stderr


def test_the_readme_plugin_trains(plugin, tmp_path):
    ok(marl(plugin, "train", "max.yaml", "--out", str(tmp_path / "train"), *TRAIN))
    rows = [json.loads(x) for x in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["iteration"] for r in rl] == [1, 2, 3]
    assert "eval_success_rate" in rl[-1] and "oracle_agreement" not in rl[-1]


def test_the_plugin_reaches_spawned_sweep_workers_from_pythonpath(plugin, tmp_path):
    ok(marl(plugin, "sweep", "max.yaml", "--grid", "protocol.rounds=1,2", "--policy", "random",
            "--episodes", "4", "--workers", "2", "--out", str(tmp_path / "sweep"),
            on_path=True))
    rows = [json.loads(x) for x in (tmp_path / "sweep" / "cells.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["done", "done"]


def test_the_plugin_is_shipped_to_ray_workers_of_a_sweep(plugin, tmp_path):
    ok(marl(plugin, "sweep", "max.yaml", "--ray", "--grid", "protocol.rounds=1,2",
            "--policy", "random", "--episodes", "4", "--out", str(tmp_path / "sweep")))
    rows = [json.loads(x) for x in (tmp_path / "sweep" / "cells.jsonl").read_text().splitlines()]
    assert sorted(r["status"] for r in rows) == ["done", "done"]


def test_the_plugin_is_shipped_to_the_members_of_a_population(plugin, tmp_path):
    config = tmp_path / "pbt.yaml"
    config.write_text(json.dumps(PBT))
    ok(marl(plugin, "population", "pbt", "max.yaml", "--config", str(config),
            "--out", str(tmp_path / "pop")))
    population = json.loads((tmp_path / "pop" / "population.json").read_text())
    assert population["finished"] and [m["steps"] for m in population["members"]] == [6, 6]


def test_plugins_outside_site_packages_are_shipped(plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin))
    import yaml

    assert [m.__name__ for m in shipped(["mytasks", "yaml"])] == ["mytasks"]
    assert shipped(["yaml"]) == [] and "site-packages" in yaml.__file__


def test_an_installed_package_registers_a_short_id(plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin))
    scenario = SCENARIO.replace('"mytasks:MaxDigit"', "max_digit_v0")
    path = plugin / "short.yaml"
    path.write_text(scenario)
    team = load_team(path)
    assert team.task.id == "max_digit_v0" and type(team.task).__module__ == "mytasks"
    res = CliRunner().invoke(app, ["validate", str(path)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(("name", "words"), [
    ("nosuchpkg.tasks:Game", ["module 'nosuchpkg' not found", "PYTHONPATH", "pip install"]),
    ("mytasks.broken:Game", ["module 'no_such_dependency_here' not found",
                             "while importing 'mytasks.broken'"]),
    ("mytasks:MaxDigt", ["no attribute 'MaxDigt'", "Did you mean 'MaxDigit'"]),
    ("mytasks.bare:NotATask", ["not a subclass of marl.tasks.Task"]),
    ("mytasks.bare", ["unknown task", "'package.module:Class'", "llm_marl.tasks"]),
    ("max_digt_v0", ["unknown task", "Did you mean 'max_digit_v0'"]),
])
def test_a_task_that_does_not_resolve_says_what_failed(plugin, monkeypatch, name, words):
    monkeypatch.syspath_prepend(str(plugin))
    with pytest.raises(MarlError) as err:
        task_class(name)
    for word in words:
        assert word in str(err.value)


def bare_scenario(plugin, backend: str, name: str = "mytasks.bare:Bare") -> str:
    path = plugin / f"bare_{backend}.yaml"
    path.write_text(SCENARIO.replace('"mytasks:MaxDigit", params: {values: 10}',
                                     f'"{name}"').replace("backend: tiny", f"backend: {backend}"))
    return str(path)


def test_a_task_without_oracle_or_random_policy_refuses_what_needs_them(plugin, monkeypatch,
                                                                        tmp_path):
    monkeypatch.syspath_prepend(str(plugin))
    for backend, words in (("scripted", "no scripted oracle (Task.oracle)"),
                           ("random", "no random policy (Task.random_message)")):
        with pytest.raises(ScenarioError, match=re.escape(words)) as err:
            load_team(bare_scenario(plugin, backend))
        assert f"policies.agent.backend: bare_v0 has {words}" in str(err.value)
    runner = CliRunner()
    tiny = bare_scenario(plugin, "tiny")
    res = runner.invoke(app, ["run", tiny, "--policy", "random", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "bare_v0 has no random policy" in res.output
    res = runner.invoke(app, ["train", tiny, "--out", str(tmp_path / "t"), *TRAIN])
    assert res.exit_code == 2 and "warmup_source: none" in res.output
    assert not (tmp_path / "t" / "metrics.jsonl").exists()
    res = runner.invoke(app, ["train", tiny, "--out", str(tmp_path / "s"), *RL,
                              "--set", "warmup_source=none", "--set", "sft_coef=0.5"])
    assert res.exit_code == 2 and "bare_v0 has no scripted oracle" in res.output
    res = runner.invoke(app, ["train", tiny, "--out", str(tmp_path / "n"), *RL,
                              "--set", "warmup_source=none"])
    assert res.exit_code == 0, res.output
    row = json.loads((tmp_path / "n" / "metrics.jsonl").read_text().split("\n")[0])
    assert row["phase"] == "rl" and "oracle_agreement" not in row


def test_a_codes_task_without_its_lengths_is_refused_at_load(plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin))
    with pytest.raises(ScenarioError, match="does not define message_length"):
        load_team(bare_scenario(plugin, "tiny", "mytasks.bare:NoLengths"))
