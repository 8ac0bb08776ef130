"""tree_returns (MAGRPO multi-turn) and gigpo_step_advantages vs plain-loop references."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.kernels import (
    gigpo_step_advantages,
    group_advantages,
    group_key,
    masked_reverse_cumsum,
    node_depth,
    tree_returns,
)
from marl.kernels import reference as ref

TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 2e-2}


def close(fast: torch.Tensor, slow: torch.Tensor) -> None:
    tol = TOL[fast.dtype]
    torch.testing.assert_close(fast, slow, rtol=tol, atol=tol, equal_nan=True)


def random_forest(m: int, gen: torch.Generator, root_p: float = 0.1) -> torch.Tensor:
    """Parents of a random forest, nodes shuffled so parents need not precede children."""
    par = torch.full((m,), -1)
    for i in range(1, m):
        if torch.rand(1, generator=gen) > root_p:
            par[i] = torch.randint(0, i, (1,), generator=gen)
    perm = torch.randperm(m, generator=gen)
    new_id = torch.argsort(perm)
    old = par[perm]
    return torch.where(old >= 0, new_id[old.clamp(min=0)], -1)


def branch_tree(g: int, turns: int) -> torch.Tensor:
    """MAGRPO layout: one root, each node branching into g children, `turns` levels deep."""
    parents, frontier, nxt = [-1], [0], 1
    for _ in range(turns - 1):
        new = []
        for p in frontier:
            for _ in range(g):
                parents.append(p)
                new.append(nxt)
                nxt += 1
        frontier = new
    return torch.tensor(parents)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [1, 2, 30, 400])
@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
def test_tree_matches_reference(dtype: torch.dtype, m: int, gamma: float) -> None:
    gen = torch.Generator().manual_seed(m)
    par = random_forest(m, gen)
    r = torch.randn(m, generator=gen).to(dtype)
    close(tree_returns(r, par, gamma), ref.tree_returns_ref(r, par, gamma))


def test_tree_branching_known_value() -> None:
    """G=2, 2 turns: root r=1, children r=2 and 4 (leaves): R = 1 + γ·3."""
    par = branch_tree(2, 2)
    out = tree_returns(torch.tensor([1.0, 2.0, 4.0]), par, gamma=0.5)
    torch.testing.assert_close(out, torch.tensor([2.5, 2.0, 4.0]))
    par = branch_tree(3, 4)  # 1 + 3 + 9 + 27 nodes, depth 3
    assert par.numel() == 40 and int(node_depth(par).max()) == 3
    r = torch.rand(40, dtype=torch.float64)
    close(tree_returns(r, par, 0.8), ref.tree_returns_ref(r, par, 0.8))


def test_tree_all_roots_is_identity_and_deep_chain() -> None:
    r = torch.randn(5)
    torch.testing.assert_close(tree_returns(r, torch.full((5,), -1), 0.3), r)
    chain = torch.arange(-1, 99)  # node i's parent is i − 1: depth 99
    r = torch.ones(100, dtype=torch.float64)
    out = tree_returns(r, chain, 1.0)
    torch.testing.assert_close(out, torch.arange(100, 0, -1).double())


def test_tree_nan_reaches_ancestors_only() -> None:
    par = torch.tensor([-1, 0, 0, 1, -1, 4])
    r = torch.tensor([0.0, 0.0, 0.0, math.nan, 1.0, 1.0])
    out = tree_returns(r, par, 1.0)
    assert out[[0, 1, 3]].isnan().all()
    assert out[[2, 4, 5]].isfinite().all()
    close(out, ref.tree_returns_ref(r, par, 1.0))


def test_tree_gradcheck() -> None:
    par = random_forest(12, torch.Generator().manual_seed(3))
    r = torch.randn(12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: tree_returns(x, par, 0.7), (r,))


def test_tree_errors() -> None:
    with pytest.raises(ValueError, match="cycle"):
        tree_returns(torch.zeros(3), torch.tensor([1, 2, 0]))
    with pytest.raises(ValueError, match=r"\[-1, 5\]"):
        tree_returns(torch.zeros(3), torch.tensor([-1, 5, 0]))
    with pytest.raises(ValueError, match="parents"):
        tree_returns(torch.zeros(3), torch.tensor([-1, 0]))


def gigpo_inputs(e: int, t: int, seed: int, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(e, t, generator=gen).to(dtype)
    mask = torch.rand(e, t, generator=gen) < 0.8
    obs = torch.randint(0, 3, (e, t), generator=gen) * (2**40) - 7  # few states: many anchors
    group = torch.randint(-2, 2, (e,), generator=gen)
    ep_adv = torch.randn(e, generator=gen).to(dtype)
    return rewards, mask, obs, group, ep_adv


@pytest.mark.parametrize("dtype", list(TOL))
@settings(max_examples=25, deadline=None)
@given(
    e=st.integers(1, 12),
    t=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    gamma=st.sampled_from([0.0, 0.5, 0.95, 1.0]),
    omega=st.sampled_from([0.0, 0.3, 1.0]),
)
def test_gigpo_matches_reference(dtype, e: int, t: int, seed: int, gamma: float, omega: float):
    args = gigpo_inputs(e, t, seed, dtype)
    close(
        gigpo_step_advantages(*args, gamma=gamma, omega=omega),
        ref.gigpo_step_advantages_ref(*args, gamma=gamma, omega=omega),
    )


def test_gigpo_known_values_and_singletons() -> None:
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [5.0, 0.0]])
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    obs = torch.tensor([[5, 6], [5, 7], [5, 7]])
    group = torch.tensor([0, 0, 1])  # episode 2 is alone in its group: all its steps singletons
    ep_adv = torch.tensor([0.5, -0.5, 0.0])
    out = gigpo_step_advantages(rewards, mask, obs, group, ep_adv, gamma=1.0, omega=2.0)
    want = torch.tensor([[0.5 + 2 * 0.5, 0.5], [-0.5 - 2 * 0.5, -0.5], [0.0, 0.0]])
    torch.testing.assert_close(out, want)


def test_gigpo_step_baseline_passthrough() -> None:
    args = gigpo_inputs(10, 5, 1)
    r, mask, obs, group, ep = args
    out = gigpo_step_advantages(*args, gamma=0.9, omega=1.0, step_baseline="mean_std")
    plain = gigpo_step_advantages(*args, gamma=0.9, omega=0.0)
    assert torch.equal(plain, torch.where(mask, ep[:, None].expand_as(r), 0.0))
    ret = masked_reverse_cumsum(r, mask, 0.9)[mask]
    key = group_key(group[:, None].expand_as(r)[mask], obs[mask])
    close((out - plain)[mask], group_advantages(ret, key, "mean_std"))


def test_gigpo_nan_poisons_episode_and_shared_step_groups() -> None:
    rewards = torch.tensor([[math.nan, 0.0], [1.0, 1.0], [2.0, 2.0]])
    mask = torch.ones(3, 2, dtype=torch.bool)
    obs = torch.tensor([[1, 2], [1, 3], [4, 5]])
    group = torch.tensor([0, 0, 0])
    out = gigpo_step_advantages(rewards, mask, obs, group, torch.zeros(3), gamma=0.9)
    assert out[0].isnan().all() and out[1, 0].isnan()  # shares anchor obs=1 with episode 0
    assert out[1, 1].isfinite() and out[2].isfinite().all()
    close(out, ref.gigpo_step_advantages_ref(rewards, mask, obs, group, torch.zeros(3), 0.9))


def test_gigpo_errors() -> None:
    r, mask, obs, group, ep = gigpo_inputs(3, 4, 0)
    with pytest.raises(ValueError, match="episode_group"):
        gigpo_step_advantages(r, mask, obs, group[:2], ep)
    with pytest.raises(ValueError, match="gamma=1.5"):
        gigpo_step_advantages(r, mask, obs, group, ep, gamma=1.5)
