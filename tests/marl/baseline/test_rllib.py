"""The RLlib baseline (marl baseline) on the local test Ray."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from marl.analysis.runs import discover
from marl.baseline.config import BaselineConfig, load_baseline_config
from marl.baseline.rllib import TurnTakingEnv, algorithm_config, greedy_episodes
from marl.cli import app
from marl.io import read_jsonl
from marl.team import load_team
from tests.marl.conftest import CODE_SCENARIOS, ROOT

SIGNAL = ROOT / "scenarios" / "signal.yaml"
SMALL = ["batch_steps=64", "minibatch_size=32", "epochs=2", "eval_every=1",
         "eval_episodes=16", "hidden=[32]"]


def _env(path: Path) -> TurnTakingEnv:
    return TurnTakingEnv({"scenario": load_team(path).to_yaml(), "seed": 0})


@pytest.mark.parametrize("path", CODE_SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_passes_rllibs_env_check(path: Path):
    from ray.rllib.utils.pre_checks.env import check_multiagent_environments

    check_multiagent_environments(_env(path))


def test_only_the_scheduled_agents_observe_and_all_are_rewarded_at_the_end():
    env = _env(SIGNAL)
    obs, _ = env.reset()
    assert list(obs) == ["speaker"]
    obs, rewards, terms, *_ = env.step({"speaker": np.array([3])})
    assert list(obs) == ["listener"] and not terms["__all__"]
    obs, rewards, terms, *_ = env.step({"listener": np.array([1])})
    assert obs == {} and terms["__all__"] and set(rewards) == {"speaker", "listener"}
    assert env.finished["tokens"] == 3.0


def test_a_repeated_reset_seed_does_not_replay_one_instance():
    """RLlib's multi-agent env runner passes its seed to every reset."""
    env = _env(SIGNAL)
    answers = set()
    for _ in range(40):
        env.reset(seed=0)
        answers.add(env.sym.env.instance.answer)
    assert answers == {"0", "1", "2", "3"}
    env.reset(seed=0)
    first = env.sym.env.instance.data
    fresh = _env(SIGNAL)
    fresh.reset(seed=0)
    assert fresh.sym.env.instance.data == first  # a new seed restarts the stream


def test_the_config_rejects_unknown_keys_and_algorithms():
    from marl.errors import ConfigError

    with pytest.raises(ConfigError, match="bogus"):
        load_baseline_config(None, ["bogus=1"])
    with pytest.raises(ConfigError, match="algo"):
        load_baseline_config(None, ["algo=dqn"])


def test_an_update_changes_every_module(ray_local):
    team = load_team(SIGNAL)
    cfg = load_baseline_config(None, SMALL)
    algo = algorithm_config(team, cfg).build_algo()
    try:
        before = {p: [t.detach().clone() for t in algo.get_module(p).parameters()]
                  for p in ("speaker", "listener")}
        algo.train()
        for p, weights in before.items():
            after = list(algo.get_module(p).parameters())
            assert any(not torch.equal(a, b) for a, b in zip(after, weights, strict=True)), p
    finally:
        algo.stop()


@pytest.fixture(scope="module")
def two_iterations(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("baseline") / "run"
    result = CliRunner().invoke(app, ["baseline", str(SIGNAL), "--iterations", "2", "--out",
                                      str(out), *[x for s in SMALL for x in ("--set", s)]])
    return out, result


def test_two_iterations_write_a_run_that_analyses_read(two_iterations):
    out, result = two_iterations
    assert result.exit_code == 0, result.output
    assert "RLlib PPO baseline" in result.output and "done: 2 iterations" in result.output
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2]
    for r in rows:
        for key in ("success_rate", "reward_mean", "tokens_per_episode", "cost_per_episode",
                    "eval_success_rate", "eval_reward_mean", "episodes", "wall_s"):
            assert r[key] is not None, key
        assert r["tokens_per_episode"] == 3.0  # a symbol out, one read, one answer
        assert r["episodes_this_iteration"] >= 32  # 64 env steps of 2-step episodes
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "rllib-ppo" and summary["uses_oracle"] is False
    assert summary["iterations"] == 2 and summary["tokens_are"] == "symbols"
    assert (out / "checkpoints" / "final").is_dir()
    records = read_jsonl(out / "episodes" / "eval_000002.jsonl")
    assert len(records) == 16 and records[0]["transcript"][0]["agent"] == "speaker"
    runs, problems = discover([out])
    assert not problems and runs[0].kind == "train" and runs[0].finished
    assert [i for i, _ in runs[0].evals] == [1, 2]


def test_analyze_puts_the_baseline_beside_an_llm_team(two_iterations, tmp_path):
    out, _ = two_iterations
    result = CliRunner().invoke(app, ["analyze", str(out), "--json", "--out",
                                      str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    assert any("rllib" in json.dumps(r) for r in report["runs"])


def test_without_the_extra_the_command_names_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tree" else real(name, *a))
    result = CliRunner().invoke(app, ["baseline", str(SIGNAL)])
    assert result.exit_code == 2
    assert "pip install -e '.[rllib]'" in result.output


def test_ppo_learns_the_lewis_game_from_reward(ray_local):
    """On a fixed seed, greedy success rises well above chance (1/4) in 12 iterations."""
    team = load_team(SIGNAL)
    cfg = BaselineConfig(iterations=12, seed=0)
    algo = algorithm_config(team, cfg).build_algo()
    try:
        modules = {p: algo.get_module(p) for p in ("speaker", "listener")}
        before = np.mean([e["success"] for e in greedy_episodes(team, modules, 128, 99)])
        for _ in range(cfg.iterations):
            algo.train()
        modules = {p: algo.get_module(p) for p in ("speaker", "listener")}
        after = np.mean([e["success"] for e in greedy_episodes(team, modules, 128, 99)])
    finally:
        algo.stop()
    assert before < 0.4
    assert after >= 0.7


def test_same_seed_same_rows(two_iterations, tmp_path):
    from marl.baseline.rllib import run_baseline

    out, _ = two_iterations
    cfg = load_baseline_config(None, [*SMALL, "iterations=2"])
    run_baseline(SIGNAL, cfg, tmp_path / "again", log=lambda msg: None)

    def rows(path: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in ("wall_s", "samples_per_s")}
                for r in read_jsonl(path / "metrics.jsonl")]

    assert rows(tmp_path / "again") == rows(out)


def test_an_existing_run_is_not_overwritten(two_iterations):
    from marl.baseline.rllib import run_baseline
    from marl.errors import MarlError

    out, _ = two_iterations
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(MarlError, match="already holds a run"):
        run_baseline(SIGNAL, load_baseline_config(None, SMALL), out)
    assert (out / "metrics.jsonl").read_text() == before


def test_sampling_in_a_remote_env_runner_reports_the_same_figures(ray_local, tmp_path):
    from marl.baseline.rllib import run_baseline

    cfg = load_baseline_config(None, [*SMALL, "iterations=1", "env_runners=1"])
    run_baseline(SIGNAL, cfg, tmp_path / "remote", log=lambda msg: None)
    (row,) = read_jsonl(tmp_path / "remote" / "metrics.jsonl")
    assert row["episodes"] >= 32 and row["tokens_per_episode"] == 3.0
    assert 0.0 <= row["success_rate"] <= 1.0 and "eval_success_rate" in row


def test_an_unknown_algorithm_is_named():
    result = CliRunner().invoke(app, ["baseline", str(SIGNAL), "--algo", "dqn"])
    assert result.exit_code == 2 and "--algo 'dqn'" in result.output and "ppo" in result.output


def test_replay_says_a_baseline_has_no_language_models_to_replay(two_iterations, tmp_path):
    out, _ = two_iterations
    result = CliRunner().invoke(app, ["analyze", str(out), "--replay", "--replay-episodes", "4",
                                      "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "its interventions are not replayed" in result.output


def test_a_diverging_run_stops_with_the_fix_and_keeps_its_rows(ray_local, tmp_path, monkeypatch):
    import marl.baseline.rllib as baseline
    from marl.errors import MarlError

    real = baseline._learner_figures
    calls = []

    def nan_on_the_second(result, policies):
        calls.append(1)
        figures = real(result, policies)
        return {**figures, "loss": float("nan")} if len(calls) == 2 else figures

    monkeypatch.setattr(baseline, "_learner_figures", nan_on_the_second)
    out = tmp_path / "nan"
    with pytest.raises(MarlError, match="diverged at iteration 2.*Lower lr"):
        baseline.run_baseline(SIGNAL, load_baseline_config(None, [*SMALL, "iterations=3"]),
                              out, log=lambda msg: None)
    assert [r["iteration"] for r in read_jsonl(out / "metrics.jsonl")] == [1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"] == "diverged" and not (out / "checkpoints").exists()


def test_an_interrupted_run_keeps_what_it_did(ray_local, tmp_path, monkeypatch):
    import marl.baseline.rllib as baseline

    real = baseline.algorithm_config

    def interrupted_on_the_second(team, cfg):
        config = real(team, cfg)
        build = config.build_algo

        def build_algo():
            algo = build()
            train, calls = algo.train, []

            def once_then_interrupt():
                calls.append(1)
                if len(calls) == 2:
                    raise KeyboardInterrupt
                return train()

            algo.train = once_then_interrupt
            return algo

        config.build_algo = build_algo
        return config

    monkeypatch.setattr(baseline, "algorithm_config", interrupted_on_the_second)
    out = tmp_path / "stopped"
    summary = baseline.run_baseline(SIGNAL, load_baseline_config(None, [*SMALL, "iterations=3"]),
                                    out, log=lambda msg: None)
    assert summary["stopped"] == "interrupted" and summary["iterations"] == 1
    assert [r["iteration"] for r in read_jsonl(out / "metrics.jsonl")] == [1]
    assert (out / "checkpoints" / "final").is_dir()
