"""Reusing each agent's KV cache across its turns (marl.policies.kv_reuse): exact, actually
used in later rounds, and never across a parameter update."""

import pytest
import torch

from marl.policies.base import Request
from marl.policies.generation import Sampling
from marl.policies.lm import LMPolicy
from marl.rollout import collect
from marl.team import load_team
from tests.marl.conftest import ROOT
from tests.marl.policies.conftest import BACKENDS, backend_lm

pytestmark = pytest.mark.usefixtures("one_thread")


def make_policy(backend: str, reuse: bool, request: pytest.FixtureRequest) -> LMPolicy:
    lm, module, tok = backend_lm(backend, request)
    return LMPolicy(lm, tok, Sampling(max_new_tokens=8, stop=("\n",)), module=module,
                    reuse_cache=reuse)


def play(scenario: str, policy: LMPolicy):
    """Two instances, two rollouts each (shared prefill and reuse together); the prefill
    size of every call."""
    team = load_team(ROOT / "scenarios" / f"{scenario}.yaml")
    sizes = []
    inner = policy.generate

    def recording(requests, greedy=False):
        before = policy.prefill_tokens
        out = inner(requests, greedy)
        sizes.append(policy.prefill_tokens - before)
        return out

    policy.generate = recording
    batch = collect(team, dict.fromkeys(team.ids, policy), episodes=2, group_size=2, seed=5)
    return batch, sizes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scenario", ["relay_custom", "relay_ring"])
def test_reuse_gives_the_same_rollout(backend, scenario, request):
    reused, plain = make_policy(backend, True, request), make_policy(backend, False, request)
    a, _ = play(scenario, reused)
    b, _ = play(scenario, plain)
    assert reused.reused_tokens > 0 and plain.reused_tokens == 0
    assert [r["transcript"] for r in a.records] == [r["transcript"] for r in b.records]
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
    assert a.prompt_ids == b.prompt_ids
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_later_rounds_prefill_far_fewer_tokens(backend, request):
    # relay_custom: one policy, four layers of one agent each, two rounds = 8 calls.
    reused = make_policy(backend, True, request)
    _, with_reuse = play("relay_custom", reused)
    _, without = play("relay_custom", make_policy(backend, False, request))
    assert len(with_reuse) == len(without) == 8
    # Round 2 runs only what is new since each agent's last turn (about a third here).
    assert sum(with_reuse[4:]) < sum(without[4:]) / 2
    # The store ends with the rollout: outside one, nothing is reused.
    total = reused.reused_tokens
    reused.generate([Request("scout", "you are scout (scout). value: 1\n[round 1]\nscout> ")])
    assert reused.reused_tokens == total


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_update_drops_the_stored_cache(backend, request):
    policy = make_policy(backend, True, request)
    first = Request("a", "you are a (relay). fact: 123\n[round 1]\na> ")
    with policy.rollout(calls_per_round=1):
        [c] = policy.generate([first], greedy=True)
        second = Request("a", f"{first.observation}{c.text}\n[round 2]\nb> 9\na> ")
        # One optimizer step, inside the rollout: the stored K/V are now stale.
        lp, m = policy.score([c.prompt_ids], [c.token_ids])
        (-(lp * m).sum()).backward()
        torch.optim.SGD(policy.parameters(), lr=1.0).step()
        reused = policy.reused_tokens
        [after] = policy.generate([second], greedy=True)
        assert policy.reused_tokens == reused
    with policy.rollout(calls_per_round=1):
        [fresh] = policy.generate([second], greedy=True)
    assert after.token_ids == fresh.token_ids
    torch.testing.assert_close(after.logprobs, fresh.logprobs, atol=1e-5, rtol=1e-5)
    # Without the update, the same second call does reuse the first one's cache.
    with policy.rollout(calls_per_round=1):
        policy.generate([first], greedy=True)
        policy.generate([second], greedy=True)
    assert policy.reused_tokens > reused
