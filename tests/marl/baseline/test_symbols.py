"""The fixed-space team for classic MARL baselines (marl.baseline.symbols)."""

import warnings
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from marl.baseline.symbols import SymbolEnv, one_hot
from marl.errors import MarlError
from marl.team import load_team
from tests.marl.conftest import CODE_SCENARIOS, ROOT


def _team(path: Path):
    return load_team(path)


def _play(env: SymbolEnv, seed: int, choose) -> tuple[list, dict]:
    """A whole episode; ``choose(agent, env)`` gives each action. Observations and rewards."""
    obs, _ = env.reset(seed=seed)
    seen = [obs]
    rewards = {}
    while env.agents:
        obs, rewards, *_ = env.step({a: choose(a, env) for a in env.agents})
        seen.append(obs)
    return seen, rewards


@pytest.mark.parametrize("path", CODE_SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_passes_the_parallel_api_test(path: Path):
    env = SymbolEnv(_team(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PettingZoo warns about keys of dead or live agents
        parallel_api_test(env, num_cycles=100)
    for a in env.possible_agents:
        assert env.observation_space(a).shape[0] > 0
        assert all(n >= 2 for n in env.action_space(a).nvec)


@pytest.mark.parametrize("path", CODE_SCENARIOS, ids=lambda p: p.stem)
def test_observations_are_in_their_space_and_deterministic(path: Path):
    team = _team(path)

    def pick(a, env):
        return env.action_space(a).sample()

    first, second = SymbolEnv(team), SymbolEnv(team)
    for env in (first, second):
        for a in env.possible_agents:
            env.action_space(a).seed(7)
    seen_a, rew_a = _play(first, 5, pick)
    seen_b, rew_b = _play(second, 5, pick)
    assert rew_a == rew_b
    for obs_a, obs_b in zip(seen_a, seen_b, strict=True):
        assert obs_a.keys() == obs_b.keys()
        for a in obs_a:
            assert np.array_equal(obs_a[a], obs_b[a])
            assert first.observation_space(a).contains(obs_a[a])


@pytest.mark.parametrize("path", CODE_SCENARIOS, ids=lambda p: p.stem)
def test_random_messages_are_spelled_in_the_declared_alphabets(path: Path):
    team = _team(path)
    task, rng = team.task, np.random.default_rng(0)
    for a in team.ids:
        for final in (False, True):
            alphabets = task.symbols(a, final)
            for _ in range(20):
                msg = task.random_message(a, final, rng)
                assert len(msg) == len(alphabets)
                assert all(c in alph for c, alph in zip(msg, alphabets, strict=True))


def test_the_listener_reads_the_speakers_symbol_and_the_answer_decodes():
    env = SymbolEnv(load_team(ROOT / "scenarios/signal.yaml"))
    obs, infos = env.reset(seed=1)
    assert infos["speaker"]["scheduled"] and not infos["listener"]["scheduled"]
    before = obs["listener"].copy()
    obs, *_ = env.step({"speaker": np.array([2]), "listener": np.array([1])})
    assert env.env.transcript[0]["message"] == "c"
    changed = np.flatnonzero(obs["listener"] != before)
    # the message's presence bit and its one-hot letter, and the acting/answering bits
    assert len(changed) >= 2
    obs2, rewards, terms, *_ = env.step({"speaker": np.array([0]), "listener": np.array([3])})
    assert env.env.transcript[1]["message"] == "3"  # the answer part: digits of 4 objects
    assert all(terms.values()) and set(rewards) == {"speaker", "listener"}
    record = env.record()
    assert record["answer"] == "3" and record["transcript"][0]["message"] == "c"


def test_different_messages_give_the_listener_different_observations():
    team = load_team(ROOT / "scenarios/signal.yaml")
    listener_views = []
    for letter in (0, 5):
        env = SymbolEnv(team)
        env.reset(seed=1)
        obs, *_ = env.step({"speaker": np.array([letter])})
        listener_views.append(obs["listener"])
    assert not np.array_equal(*listener_views)


def test_a_delayed_message_is_not_read_before_its_round():
    """y acts before z in round 1, but y -> z has delay 1: z reads it only in round 2."""
    team = load_team({
        "name": "delay", "task": {"name": "vote_v0", "params": {"classes": 3}},
        "agents": [{"id": i, "role": "voter", "policy": "p"} for i in ("y", "x", "z")],
        "policies": {"p": {"backend": "tiny", "max_new_tokens": 2}},
        "topology": {"kind": "custom", "edges": [["y", "x"], ["x", "z"],
                                                  ["y", "z", {"delay": 1}]]},
        "protocol": {"rounds": 2, "answer": "z"}})
    views = []
    for y_says in (0, 2):
        env = SymbolEnv(team)
        env.reset(seed=4)
        seen = []
        while env.agents:
            acting = env.scheduled
            obs, *_ = env.step({a: np.array([y_says if a == "y" else 1] * 2)
                                for a in env.agents})
            if env.agents and "z" in env.scheduled:
                seen.append((env.env.round, obs["z"]))
        views.append(seen)
        assert acting  # the episode ran
    (r0, z0_a), (r1, z1_a) = views[0]
    (_, z0_b), (_, z1_b) = views[1]
    assert (r0, r1) == (0, 1)
    assert np.array_equal(z0_a, z0_b)  # round 1: y's message is not visible yet
    assert not np.array_equal(z1_a, z1_b)  # round 2: it is


def test_symbols_are_the_tokens_and_are_priced():
    team = load_team(ROOT / "scenarios/signal.yaml")
    env = SymbolEnv(team)
    env.reset(seed=0)
    env.step({"speaker": np.array([0])})
    env.step({"listener": np.array([0])})
    rows = env.rows
    assert [(r.agent, r.prompt_tokens, r.completion_tokens) for r in rows] == [
        ("speaker", 0, 1), ("listener", 1, 1)]
    assert rows[1].received == {"speaker": 1}
    price = team.prices["speaker"]
    assert env.result["tokens"] == 3
    assert env.result["cost_usd"] == 2 * price.output + price.input
    assert env.record()["ledger"][1]["prompt_tokens"] == 1


def test_the_token_penalty_counts_symbols():
    data = load_team(ROOT / "scenarios/signal.yaml").scenario.model_dump(
        mode="json", exclude_unset=True)
    data["costs"]["penalty_per_1k"] = 100.0
    env = SymbolEnv(load_team(data))
    env.reset(seed=0)
    env.step({"speaker": np.array([0])})
    _, rewards, *_ = env.step({"listener": np.array([0])})
    score = env.result["score"]
    assert rewards["listener"] == pytest.approx(score - 0.3)  # 3 symbols x 100 / 1000
    assert env.result["token_penalty"] == pytest.approx(0.3)
    assert env.result["cost_usd"] > Decimal(0)


def test_a_task_without_a_finite_alphabet_is_refused_by_name():
    team = load_team(ROOT / "scenarios/signal.yaml")
    object.__setattr__(team.task, "symbols", lambda agent, final: None)
    with pytest.raises(MarlError, match=r"lewis_v0 .*Task\.symbols"):
        SymbolEnv(team)


def test_agents_of_one_policy_must_send_the_same_format():
    team = load_team(ROOT / "scenarios/gather_chain.yaml")
    object.__setattr__(team.task, "symbols",
                       lambda agent, final: ("01",) * (2 if agent == "first" else 3))
    with pytest.raises(MarlError, match="separate policies"):
        SymbolEnv(team)


def test_one_hot_leaves_unknown_characters_empty():
    assert one_hot("a?", ("ab", "ab")).tolist() == [1, 0, 0, 0]
    assert one_hot("", ("xyz",)).tolist() == [0, 0, 0]


def test_a_free_form_task_has_no_symbol_game():
    with pytest.raises(MarlError, match="does not say which finite alphabet"):
        SymbolEnv(load_team(ROOT / "scenarios" / "arith_chain.yaml"))
