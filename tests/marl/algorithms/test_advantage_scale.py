"""advantage_scale: agent divides each agent's advantages by the spread of its returns over
the batch, for every credit kind and for independent GRPO; none leaves them alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from marl.algorithms.config import TrainConfig
from marl.algorithms.grpo import GRPO
from marl.algorithms.magrpo import MAGRPO, call_advantages, per_agent_advantages
from marl.kernels import group_advantages
from marl.policies import Completion, Policy
from marl.rollout import collect
from marl.team import load_team

ROOT = Path(__file__).resolve().parents[3]


class SaysAOrB(Policy):
    def __init__(self):
        self.rng = np.random.default_rng(3)

    def generate(self, requests, greedy=False):
        return [Completion("ab"[int(self.rng.integers(2))]) for _ in requests]


@pytest.fixture(scope="module")
def played():
    data = yaml.safe_load((ROOT / "scenarios" / "relay_chain.yaml").read_text())
    data["task"]["params"]["fact_length"] = 1
    team = load_team(data)
    policies = dict.fromkeys(team.ids, SaysAOrB())
    batch = collect(team, policies, 12, 6, seed=5)
    b, n = len(batch.records), len(team.ids)
    team_ret = torch.tensor([float(i % 3 == 0) for i in range(b)])[:, None].expand(-1, n)
    own_ret = torch.rand(b, n, generator=torch.Generator().manual_seed(0)).round()
    return team, policies, batch, team_ret, own_ret


def advantages(learner_class, played, ret, **settings):
    team, policies, batch, *_ = played
    learner = learner_class(team, policies, TrainConfig(**settings))
    learner.returns = lambda batch, seed: ret
    return learner.advantages(batch, 0)


@pytest.mark.parametrize("credit", ["team", "anchor"])
def test_team_credit_is_divided_by_the_spread_of_the_team_return(played, credit):
    team, _, batch, ret, _ = played
    plain = advantages(MAGRPO, played, ret, credit=credit)
    out = advantages(MAGRPO, played, ret, credit=credit, advantage_scale="agent")
    std = float(ret[:, 0].std(correction=0))
    assert 0 < std < 1 and plain.abs().max() > 0
    torch.testing.assert_close(out, plain / std)
    if credit == "team":
        torch.testing.assert_close(plain, group_advantages(ret[:, 0], batch.group_ids)[:, None]
                                   .expand(-1, len(team.ids)))
    else:
        torch.testing.assert_close(plain[:, :, 0], call_advantages(batch, ret, "mean"))


def test_independent_grpo_divides_each_agent_by_its_own_spread(played):
    *_, batch, _, ret = played
    out = advantages(GRPO, played, ret, algorithm="grpo", advantage_scale="agent")
    want = per_agent_advantages(ret, batch.group_ids, "mean") / ret.std(0, correction=0)
    assert len(set(ret.std(0, correction=0).tolist())) > 1  # the agents' spreads differ
    torch.testing.assert_close(out, want)


def test_it_is_refused_for_ppo_whose_critic_assigns_credit():
    with pytest.raises(ValueError, match="advantage_scale only apply to algorithms magrpo "
                                         "and grpo"):
        TrainConfig(algorithm="ppo", advantage_scale="agent")
