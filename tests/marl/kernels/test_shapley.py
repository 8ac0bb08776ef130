"""Shapley values (exact and Monte-Carlo) and difference rewards."""

from __future__ import annotations

import math

import pytest
import torch

from marl.kernels import (
    coalition_index,
    difference_rewards,
    shapley_exact,
    shapley_mc,
    shapley_weights,
)
from marl.kernels import reference as ref

TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 3e-2}


def close(fast: torch.Tensor, slow: torch.Tensor) -> None:
    tol = TOL[fast.dtype]
    torch.testing.assert_close(fast, slow, rtol=tol, atol=tol, equal_nan=True)


def table(b: int, n: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(b, 2**n, generator=torch.Generator().manual_seed(seed)).to(dtype)


def swap_bits(c: torch.Tensor, i: int, j: int) -> torch.Tensor:
    bi, bj = (c >> i) & 1, (c >> j) & 1
    return c ^ ((bi ^ bj) << i) ^ ((bi ^ bj) << j)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_exact_matches_reference(dtype: torch.dtype, n: int) -> None:
    v = table(4, n, n, dtype)
    close(shapley_exact(v), ref.shapley_exact_ref(v))


@pytest.mark.parametrize("n", [2, 6, 12])
def test_exact_efficiency(n: int) -> None:
    v = table(3, n, n)
    torch.testing.assert_close(shapley_exact(v).sum(1), v[:, -1] - v[:, 0])


def test_exact_symmetry_and_null_player() -> None:
    n, i, j, null = 5, 1, 3, 4
    v = table(2, n, 1)
    c = torch.arange(2**n)
    v = (v + v[:, swap_bits(c, i, j)]) / 2  # agents i and j interchangeable
    v = v[:, c & ~(1 << null)]  # agent `null` never changes the value
    phi = shapley_exact(v)
    torch.testing.assert_close(phi[:, i], phi[:, j])
    torch.testing.assert_close(phi[:, null], torch.zeros(2, dtype=torch.float64))


def test_exact_additive_game() -> None:
    w = torch.tensor([[1.0, -2.0, 0.5, 3.0]], dtype=torch.float64)
    masks = (torch.arange(16)[:, None] >> torch.arange(4)) & 1
    v = (masks.double() @ w[0])[None]  # v(S) = Σ_{i∈S} w_i
    torch.testing.assert_close(shapley_exact(v), w)


def test_exact_nan_spoils_its_row_only() -> None:
    v = table(3, 3)
    v[1, 5] = math.nan
    phi = shapley_exact(v)
    assert phi[1].isnan().all() and phi[[0, 2]].isfinite().all()


def test_exact_gradcheck() -> None:
    v = table(2, 3).requires_grad_()
    assert torch.autograd.gradcheck(shapley_exact, (v,))


def test_weights_cached_and_shaped() -> None:
    w = shapley_weights(4, torch.float64, torch.device("cpu"))
    assert w is shapley_weights(4, torch.float64, torch.device("cpu"))
    assert w.shape == (16, 4)
    torch.testing.assert_close(w.sum(0), torch.zeros(4, dtype=torch.float64))  # Σ weights = 0


@pytest.mark.parametrize("cols", [3, 1, 2**17])
def test_exact_rejects_bad_tables(cols: int) -> None:
    with pytest.raises(ValueError, match=f"got {cols}"):
        shapley_exact(torch.zeros(1, cols))


def test_mc_converges_to_exact() -> None:
    v = table(3, 6, 5)
    exact = shapley_exact(v)
    gen = torch.Generator().manual_seed(0)
    errors = []
    for p in (50, 800, 12800):
        est, se = shapley_mc(v, p, generator=gen, chunk=1000)
        err = (est - exact).abs()
        assert (err <= 4 * se + 1e-12).all(), (err / se).max()
        # Efficiency holds exactly for every permutation, hence for the mean.
        torch.testing.assert_close(est.sum(1), v[:, -1] - v[:, 0])
        errors.append(err.max().item())
    assert errors[2] < errors[1] < errors[0]


def test_mc_callable_many_agents() -> None:
    """N = 20 is far past a 2^N table: an additive game has zero-variance exact estimates."""
    w = torch.linspace(-1, 1, 20, dtype=torch.float64)

    def additive(masks: torch.Tensor) -> torch.Tensor:  # [B, P, N] -> [B, P]
        return masks.double() @ w

    est, se = shapley_mc(additive, 8, n_agents=20, batch_size=2)
    torch.testing.assert_close(est, w.expand(2, 20))
    assert (se < 1e-12).all()


def test_mc_majority_game_is_symmetric() -> None:
    n = 14

    def majority(masks: torch.Tensor) -> torch.Tensor:
        return (masks.sum(-1) > n // 2).double()

    gen = torch.Generator().manual_seed(1)
    est, se = shapley_mc(majority, 2000, n_agents=n, batch_size=1, generator=gen)
    assert ((est - 1 / n).abs() <= 4 * se).all()


def test_mc_table_lookup_matches_callable() -> None:
    v = table(2, 4, 9)

    def lookup(masks: torch.Tensor) -> torch.Tensor:
        return v.gather(1, coalition_index(masks).view(2, -1))

    a = shapley_mc(v, 64, generator=torch.Generator().manual_seed(3), chunk=10)
    b = shapley_mc(
        lookup, 64, n_agents=4, batch_size=2, generator=torch.Generator().manual_seed(3), chunk=10
    )
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y)


def test_mc_errors() -> None:
    with pytest.raises(ValueError, match="n_agents and batch_size"):
        shapley_mc(lambda m: m.sum(-1).double(), 10)
    with pytest.raises(ValueError, match="n_permutations=1"):
        shapley_mc(table(1, 2), 1)
    with pytest.raises(ValueError, match=r"\[B, 2\^N\]"):
        shapley_mc(torch.zeros(1, 6), 4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_difference_rewards(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    full, without = (
        torch.randn(5, generator=gen).to(dtype),
        torch.randn(5, 3, generator=gen).to(dtype),
    )
    close(difference_rewards(full, without), ref.difference_rewards_ref(full, without))
    full[2] = math.nan
    out = difference_rewards(full, without)
    assert out[2].isnan().all() and out[[0, 1, 3, 4]].isfinite().all()
    assert torch.autograd.gradcheck(
        difference_rewards,
        (full.double()[:2].requires_grad_(), without.double()[:2].requires_grad_()),
    )
    with pytest.raises(ValueError, match=r"\(5,\) and \(4, 3\)"):
        difference_rewards(full, without[:4])
