"""Competitive scenarios: teams in scenario files, per-team answers, rewards and token
costs in the env and the rollout batch, and learners that give every agent its own
team's return (cipher_v0)."""

import copy

import pytest
import torch
import yaml

from marl.algorithms.config import TrainConfig
from marl.algorithms.magrpo import MAGRPO
from marl.env import TeamEnv
from marl.errors import MarlError, ScenarioError
from marl.policies import Request
from marl.policies.scripted import ScriptedPolicy
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team
from marl.training.trainer import Trainer
from tests.marl.conftest import ROOT

CIPHER = yaml.safe_load((ROOT / "scenarios" / "cipher.yaml").read_text())


def cipher(**changes) -> dict:
    data = copy.deepcopy(CIPHER)
    data.update(changes)
    return data


def problems(data: dict) -> str:
    with pytest.raises(ScenarioError) as info:
        load_team(data)
    return str(info.value)


@pytest.mark.parametrize(("data", "fragments"), [
    (cipher(teams={"red": {"agents": ["alice", "bob", "mallory"], "answer": "bob"},
                   "blue": {"agents": ["eve"], "answer": "eve"}}),
     ["teams.red.agents[2]", "unknown agent 'mallory'"]),
    (cipher(teams={"red": {"agents": ["alice", "bob"], "answer": "bob"},
                   "blue": {"agents": ["eve", "bob"], "answer": "eve"}}),
     ["teams.blue.agents[1]", "already on team 'red'"]),
    (cipher(teams={"red": {"agents": ["alice", "bob"], "answer": "bob"},
                   "blue": {"agents": ["alice"], "answer": "alice"}}),
     ["'eve' on no team"]),
    (cipher(teams={"red": {"agents": ["alice", "bob", "eve"], "answer": "bob"}}),
     ["teams", "two or more teams"]),
    (cipher(teams={"red": {"agents": ["alice", "bob"], "answer": "eve"},
                   "blue": {"agents": ["eve"], "answer": "eve"}}),
     ["teams.red.answer", "unknown agent 'eve'"]),
    (cipher(protocol={"rounds": 1, "answer": "bob"}), ["protocol.answer", "remove"]),
    (cipher(teams=None), ["teams", "cipher_v0 is a competitive task"]),
    (cipher(task={"name": "lewis_v0"}), ["teams", "lewis_v0 is a cooperative task"]),
    (cipher(teams={"red": {"agents": ["alice"], "answer": "alice"},
                   "blue": {"agents": ["bob", "eve"], "answer": {"vote": ["bob", "eve"]}}}),
     ["task.params.sender", "also an answer agent"]),
    (cipher(teams={"red": {"agents": ["alice", "eve"], "answer": "eve"},
                   "blue": {"agents": ["bob"], "answer": "bob"}},
            task={"name": "cipher_v0", "params": {"eavesdropper": "bob", "receiver": "eve"}}),
     []),
    (cipher(teams={"red": {"agents": ["alice"], "answer": {"vote": []}},
                   "blue": {"agents": ["bob", "eve"], "answer": "eve"}}),
     ["teams.red.answer.vote"]),
])
def test_bad_teams_are_named(data, fragments):
    if not fragments:  # a valid renaming of the roles
        assert load_team(data).sides == {"red": ("alice", "eve"), "blue": ("bob",)}
        return
    text = problems(data)
    assert all(f in text for f in fragments), text


def test_an_eavesdropper_on_the_senders_team_is_refused():
    data = cipher(teams={"red": {"agents": ["alice", "bob", "eve"],
                                 "answer": {"vote": ["bob", "eve"]}},
                         "blue": {"agents": [], "answer": "eve"}})
    assert "teams.blue.agents" in problems(data)
    data = cipher(teams={"red": {"agents": ["alice", "bob"], "answer": "bob"},
                         "blue": {"agents": ["eve"], "answer": "eve"}},
                  task={"name": "cipher_v0", "params": {"eavesdropper": "bob"}})
    assert "must be on another team" in problems(data)


def scripted_episode(team, seed):
    env = TeamEnv(team)
    obs, _ = env.reset(seed=seed)
    oracle = ScriptedPolicy(team.task)
    rewards = {}
    while env.agents:
        requests = [Request(a, obs[a], team.is_final_call(a, env.round)) for a in env.scheduled]
        actions = {r.agent: c.text for r, c in zip(requests, oracle.generate(requests),
                                                   strict=True)}
        obs, rewards, *_ = env.step(actions)
    return env.result, rewards


@pytest.mark.parametrize("seed", range(12))
def test_each_team_gets_its_own_zero_sum_reward_and_token_cost(seed):
    data = cipher(costs={"model": "gpt-4o-mini", "penalty_per_1k": 1.0})
    team = load_team(data)
    result, rewards = scripted_episode(team, seed)
    red, blue = result["sides"]["red"], result["sides"]["blue"]
    bob_right = result["sides"]["red"]["answer"] == result["target"]
    eve_right = result["sides"]["blue"]["answer"] == result["target"]
    assert bob_right  # the oracle receiver always decodes
    assert red["score"] == float(bob_right) - float(eve_right) == -blue["score"]
    assert red["tokens"] + blue["tokens"] == result["tokens"]
    assert red["token_penalty"] == pytest.approx(red["tokens"] / 1000)
    assert rewards == {"alice": red["reward"], "bob": red["reward"], "eve": blue["reward"]}
    assert result["score"] == red["score"]  # the top-level fields are the first team's


def test_the_batch_gives_every_agent_its_teams_return():
    team = load_team(cipher(costs={"model": "gpt-4o-mini", "penalty_per_1k": 1.0}))
    batch = collect(team, build_policies(team, "scripted"), episodes=40, seed=3)
    assert batch.sides == ("red", "blue")
    assert batch.agent_side.tolist() == [0, 0, 1]
    for b, rec in enumerate(batch.records):
        for i, agent in enumerate(team.ids):
            side = rec["sides"][team.side_of(agent)]
            assert float(batch.agent_return[b, i]) == pytest.approx(side["reward"])
    # Against the oracle's keyed code the eavesdropper is at chance: red wins ~3/4.
    assert 0.6 < float((batch.side_score[:, 0] >= 1).float().mean()) < 0.95


def test_magrpo_advantages_are_per_team():
    team = load_team(CIPHER)
    batch = collect(team, build_policies(team, "random"), episodes=8, group_size=4, seed=1)
    learner = MAGRPO(team, build_policies(team, "random"), TrainConfig())
    adv = learner.advantages(batch, seed=0)  # (B, N)
    ret = batch.agent_return
    for g in range(8):
        rows = batch.group_ids == g
        expected = ret[rows] - ret[rows].mean(0)
        assert torch.allclose(adv[rows], expected)
    # Zero-sum: red's advantages mirror blue's.
    assert torch.allclose(adv[:, 0], -adv[:, 2])


def test_self_play_trains_both_teams(tmp_path):
    team = load_team(CIPHER)
    cfg = TrainConfig(episodes_per_iter=4, group_size=4, warmup_steps=1, warmup_episodes=4,
                      eval_every=2, eval_episodes=4, transcripts_per_iter=0)
    trainer = Trainer(team, cfg, tmp_path / "run", log=lambda m: None)
    before = {a: [p.detach().clone() for p in trainer.policies[a].parameters()]
              for a in team.ids}
    for _ in range(3):  # the warm-up step, then iterations 1 and 2 (evaluated)
        row = trainer.step()
    assert set(row["side_reward_mean"]) == {"red", "blue"}
    assert row["side_reward_mean"]["red"] == pytest.approx(-row["side_reward_mean"]["blue"])
    assert set(row["eval_side_success_rate"]) == {"red", "blue"}
    for a in team.ids:
        assert any(not torch.equal(x, y) for x, y in
                   zip(before[a], trainer.policies[a].parameters(), strict=True))


@pytest.mark.parametrize(("sets", "message"), [
    ({"credit": "difference"}, "credit: team"),
    ({"algorithm": "ppo", "critic": "central", "baseline": "mean", "kl_coef": 0.0},
     "critic: independent"),
])
def test_settings_defined_for_one_team_are_refused(tmp_path, sets, message):
    with pytest.raises(MarlError, match=message):
        Trainer(load_team(CIPHER), TrainConfig(**sets), tmp_path / "run")
