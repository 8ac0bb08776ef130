"""token_costs vs the plain-loop reference, hand-computed bills, validation, gradients."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.kernels import reference as ref
from marl.kernels import token_costs


def ledger(e: int, r: int, n: int, seed: int, dtype=torch.int64):
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 50_000, (e, r, n), generator=gen)
    cached = (prompt * torch.rand(e, r, n, generator=gen)).long()
    completion = torch.randint(0, 4_000, (e, r, n), generator=gen)
    return prompt.to(dtype), cached.to(dtype), completion.to(dtype)


@settings(max_examples=30, deadline=None)
@given(
    e=st.integers(1, 6),
    r=st.integers(1, 4),
    n=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    per_agent_prices=st.booleans(),
    float_tokens=st.booleans(),
)
def test_matches_reference(e, r, n, seed, per_agent_prices, float_tokens) -> None:
    toks = ledger(e, r, n, seed, torch.float32 if float_tokens else torch.int64)
    gen = torch.Generator().manual_seed(seed)
    shared = (3e-6, 3e-7, 1.5e-5)
    per_agent = torch.rand(n, 3, generator=gen, dtype=torch.float64) * 1e-5
    prices = per_agent if per_agent_prices else shared
    score = torch.randn(e, generator=gen)
    fast = token_costs(*toks, prices, penalty_per_1k=0.25, score=score)
    slow = ref.token_costs_ref(*toks, prices, penalty_per_1k=0.25, score=score)
    for f, s in zip(fast, slow, strict=True):
        assert f.dtype == torch.float64
        torch.testing.assert_close(f, s, rtol=1e-12, atol=1e-15)


def test_hand_computed_bill() -> None:
    # One episode, two rounds, two agents; agent 1 reads 600 of its 1000 prompt tokens from cache.
    prompt = torch.tensor([[[100, 1000], [200, 0]]])
    cached = torch.tensor([[[0, 600], [50, 0]]])
    completion = torch.tensor([[[10, 20], [30, 0]]])
    prices = torch.tensor([[1e-6, 1e-7, 2e-6], [3e-6, 3e-7, 1.5e-5]], dtype=torch.float64)
    out = token_costs(
        prompt, cached, completion, prices, penalty_per_1k=0.5, score=torch.tensor([1.0])
    )
    a0 = (100 + 150) * 1e-6 + 50 * 1e-7 + 40 * 2e-6
    a1 = 400 * 3e-6 + 600 * 3e-7 + 20 * 1.5e-5
    torch.testing.assert_close(out.per_agent, torch.tensor([[a0, a1]], dtype=torch.float64))
    torch.testing.assert_close(out.per_episode, torch.tensor([a0 + a1], dtype=torch.float64))
    assert out.tokens.tolist() == [1360.0]  # prompt (cached included) + completion
    torch.testing.assert_close(out.reward, torch.tensor([1.0 - 0.5 * 1.36], dtype=torch.float64))


def test_no_score_no_reward_and_nan_score_stays_nan() -> None:
    toks = ledger(3, 2, 2, 0)
    assert token_costs(*toks, (1e-6, 0.0, 1e-6)).reward is None
    score = torch.tensor([1.0, math.nan, 0.0])
    reward = token_costs(*toks, (1e-6, 0.0, 1e-6), 1.0, score).reward
    assert reward[1].isnan() and reward[[0, 2]].isfinite().all()


def test_gradcheck_prices_score_tokens() -> None:
    p, c, o = (x.double() for x in ledger(2, 2, 3, 1))
    # Prices well above the finite-difference step, which must not make them negative.
    prices = (1e-5 + torch.rand(3, 3, dtype=torch.float64) * 1e-5).requires_grad_()
    score = torch.randn(2, dtype=torch.float64, requires_grad=True)
    o.requires_grad_()

    def f(pr, sc, comp):
        out = token_costs(p, c, comp, pr, 0.3, sc)
        return out.per_agent, out.reward

    assert torch.autograd.gradcheck(f, (prices, score, o))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("prompt", -1, "prompt=-1"),
        ("cached", 10**9, "cached ≤ prompt"),
        ("completion", -5, "completion=-5"),
        ("completion", math.nan, "finite"),
    ],
)
def test_bad_counts_name_the_entry(field: str, value: float, match: str) -> None:
    toks = dict(
        zip(("prompt", "cached", "completion"), ledger(2, 3, 2, 0, torch.float64), strict=True)
    )
    toks[field][1, 2, 0] = value
    with pytest.raises(ValueError, match=match) as err:
        token_costs(**toks, prices=(1e-6, 0.0, 1e-6))
    assert "episode 1, round 2, agent 0" in str(err.value)


@pytest.mark.parametrize(
    ("prices", "match"),
    [
        ((1e-6, 1e-6), r"got shape \(2,\)"),
        (torch.zeros(3, 3), r"\[N=2, 3\]"),
        ((1e-6, -1e-7, 1e-6), "finite and ≥ 0"),
        ((1e-6, math.inf, 1e-6), "finite and ≥ 0"),
    ],
)
def test_bad_prices(prices, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        token_costs(*ledger(1, 1, 2, 0), prices)


def test_shape_errors() -> None:
    p, c, o = ledger(2, 1, 2, 0)
    with pytest.raises(ValueError, match=r"\(2, 1, 2\), \(2, 1, 2\), \(2, 2\)"):
        token_costs(p, c, o[:, 0], (0, 0, 0))
    with pytest.raises(ValueError, match=r"score must be \[E=2\]"):
        token_costs(p, c, o, (0, 0, 0), score=torch.zeros(3))


def test_the_kernel_and_the_environment_agree_on_penalties_and_bills() -> None:
    """One definition of the token-penalised reward: the environment's exact scalar form
    (what every agent is paid) and the batched kernel (what GRPO's per-agent penalties
    come from) give the same numbers on a played batch, and the kernel's bill is the
    ledger's."""
    import yaml

    from marl.cost.ledger import Ledger
    from marl.rollout import collect
    from marl.runner import build_policies
    from marl.team import load_team
    from tests.marl.conftest import ROOT

    data = yaml.safe_load((ROOT / "scenarios" / "gather_star.yaml").read_text())
    data["costs"]["penalty_per_1k"] = 0.7
    team = load_team(data)
    batch = collect(team, build_policies(team, "random"), 6, 2, seed=3)
    led = batch.ledger
    price = team.prices[team.ids[0]]
    prices = (float(price.input), float(price.cache_read), float(price.output))
    out = token_costs(led["prompt"], led["cached"], led["completion"], prices, 0.7,
                      batch.score)
    # the batch holds float32 copies of the environment's numbers
    torch.testing.assert_close(out.reward, batch.reward.double(), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.agent_penalty.sum(1), batch.token_penalty.double(),
                               rtol=0, atol=1e-6)
    exact = [r["reward"] for r in batch.records]
    torch.testing.assert_close(out.reward, torch.tensor(exact, dtype=torch.float64),
                               rtol=0, atol=1e-12)
    assert abs(float(out.per_episode.sum()) - float(Ledger(batch.rows).cost())) < 1e-12
