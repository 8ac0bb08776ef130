from pathlib import Path

import pytest

from marl import make_env
from marl.cost.ledger import Usage
from marl.env import TeamEnv
from marl.team import load_team
from marl.testing import check_api, check_determinism, check_garbage, trace
from tests.marl.conftest import ROOT, SCENARIOS


@pytest.fixture(scope="module")
def teams():
    return {p.stem: load_team(p) for p in SCENARIOS}


def test_enough_scenarios_ship():
    names = {p.stem for p in SCENARIOS}
    assert len(names) >= 10
    assert {"signal", "gather_star", "gather_chain", "relay_chain", "vote_debate"} <= names
    kinds = {load_team(p).scenario.topology.kind for p in SCENARIOS}
    assert kinds == {"star", "chain", "ring", "complete", "debate", "tree", "layered",
                     "random", "custom"}
    tasks = {load_team(p).task.id for p in SCENARIOS}
    assert tasks == {"signal_v0", "lewis_v0", "gather_v1", "vote_v0", "relay_v0", "ref_v0",
                     "cipher_v0", "dataset_v0"}


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_parallel_api(path: Path, teams):
    check_api(teams[path.stem])


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_whole_episode_determinism(path: Path, teams):
    check_determinism(teams[path.stem], seed=3)


def test_different_seeds_differ(teams):
    team = teams["gather_star"]
    assert trace(TeamEnv(team, seed=1), 2, 1) != trace(TeamEnv(team, seed=2), 2, 2)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_garbage_actions_never_raise(path: Path, teams):
    check_garbage(teams[path.stem])


def test_schedule_layers_and_unscheduled_agents(teams):
    env = TeamEnv(teams["gather_star"], seed=0)
    obs, infos = env.reset()
    assert env.scheduled == ("w1", "w2", "w3")
    assert "not scheduled" in obs["lead"] and not infos["lead"]["scheduled"]
    assert obs["w1"].startswith("you are w1 (worker). value: ")
    obs, rewards, term, trunc, infos = env.step({"w1": "1???", "w2": "?2??", "w3": "??3?",
                                                 "lead": "ignored"})
    assert infos["lead"]["flags"] == {"ignored_action": True}
    assert infos["lead"]["ledger"] == []  # an ignored action costs nothing
    assert [r.agent for a in ("w1", "w2", "w3") for r in infos[a]["ledger"]] == ["w1", "w2",
                                                                                   "w3"]
    assert env.scheduled == ("lead",) and infos["lead"]["final_call"]
    assert obs["lead"].endswith("w1> 1???\nw2> ?2??\nw3> ??3?\nlead answer> ")
    assert set(rewards.values()) == {0.0} and not any(term.values())
    obs, rewards, term, trunc, infos = env.step({"lead": env.instance.answer})
    assert all(term.values()) and not any(trunc.values()) and env.agents == []
    assert set(rewards.values()) == {1.0} and infos["w2"]["success"]
    assert env.step({}) == ({}, {}, {}, {}, {})


def test_actions_are_sanitized_truncated_and_flagged(teams):
    env = TeamEnv(teams["signal_pick"], seed=0)
    env.reset()
    _, _, _, _, infos = env.step({"speaker": "ab\ncdé" + "z" * 20})
    flags = infos["speaker"]["flags"]
    assert flags == {"sanitized_chars": 2, "truncated_from": 26}
    assert env.transcript[-1]["message"] == "ab cd?zz"  # max_new_tokens = 8
    assert infos["speaker"]["ledger"][0].completion_tokens == 8
    _, _, _, _, infos = env.step({})
    assert infos["listener"]["flags"] == {"missing": True, "empty": True}
    assert infos["listener"]["score"] == 0.0


def test_token_penalty_in_reward(teams):
    team = teams["vote_debate"]  # penalty_per_1k = 0.01
    env = TeamEnv(team, seed=0)
    obs, _ = env.reset()
    while env.agents:
        obs, rewards, _, _, infos = env.step({a: "0" for a in env.scheduled})
    info = infos["d0"]
    assert info["token_penalty"] == pytest.approx(0.01 * info["tokens"] / 1000)
    assert rewards["d0"] == pytest.approx(info["score"] - info["token_penalty"])


def test_cached_tokens_are_the_previous_call(teams):
    env = TeamEnv(teams["relay_ring"], seed=0)
    env.reset()
    rows = []
    while env.agents:
        _, _, _, _, infos = env.step({a: "abc" for a in env.scheduled})
        rows += infos["r1"]["ledger"]
    for prev, row in zip(rows, rows[1:], strict=False):
        assert row.cached_tokens == prev.prompt_tokens + prev.completion_tokens


def test_render_is_the_transcript(teams):
    env = make_env(ROOT / "scenarios" / "signal.yaml", seed=0)
    env.reset()
    env.step({"speaker": "abc"})
    env.step({"listener": "2"})
    text = env.render()
    assert "speaker> abc" in text and "listener> 2" in text and "team answer '2'" in text


def test_billed_usage_replaces_our_counts_but_not_per_edge(teams):
    env = TeamEnv(teams["gather_star"], seed=0)
    env.reset()
    billed = {"w1": Usage(prompt_tokens=11, completion_tokens=2, cached_tokens=4)}
    _, _, _, _, infos = env.step({"w1": "1???", "w2": "?2??", "w3": "??3?"}, usage=billed)
    (row,) = infos["w1"]["ledger"]
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (11, 4, 2)
    price = env.team.prices["w1"]
    assert row.cost_usd == price.input * 7 + price.cache_read * 4 + price.output * 2
    assert infos["w2"]["ledger"][0].completion_tokens == 4  # no usage: our tokenizer
    _, _, _, _, infos = env.step({"lead": "6"}, usage={"lead": Usage(50, 1)})
    (row,) = infos["lead"]["ledger"]
    assert row.prompt_tokens == 50 and row.received == {"w1": 9, "w2": 9, "w3": 9}  # "w1> 1???\n"
    assert env.result["tokens"] == sum(r.prompt_tokens + r.completion_tokens
                                       for r in env.rows) and env.rows[0].prompt_tokens == 11


def test_a_failed_call_fails_the_episode_and_voids_the_rest(teams):
    env = TeamEnv(teams["gather_star"], seed=0)
    env.reset()
    _, _, _, _, infos = env.step({"w1": "", "w2": "?2??", "w3": "??3?"},
                                 errors={"w1": "HTTP 500 after 5 retries: down"})
    assert infos["w1"]["flags"] == {"error": "HTTP 500 after 5 retries: down"}
    assert infos["w1"]["ledger"] == [] and len(infos["w2"]["ledger"]) == 1
    assert env.failure == "agent 'w1', round 1: HTTP 500 after 5 retries: down"
    obs, rewards, term, _, infos = env.step({"lead": env.instance.answer})  # ignored
    assert infos["lead"]["flags"] == {"skipped": "the episode failed"}
    assert infos["lead"]["ledger"] == [] and all(term.values())
    assert env.result["error"] == env.failure and env.result["score"] == 0.0
    assert not env.result["success"] and set(rewards.values()) == {0.0}
    assert [m["message"] for m in env.transcript] == ["", "?2??", "??3?", ""]
    env.reset()
    assert env.failure is None  # the next episode starts clean
