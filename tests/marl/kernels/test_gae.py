"""gae and the masked reverse scans vs plain loops: masks, bootstrap, chunking, NaN, grads."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.kernels import discounted_reverse_cumsum, gae, masked_reverse_cumsum
from marl.kernels import reference as ref

TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 2e-2}


def close(fast: torch.Tensor, slow: torch.Tensor) -> None:
    tol = TOL[fast.dtype]
    torch.testing.assert_close(fast, slow, rtol=tol, atol=tol, equal_nan=True)


def loop_rcumsum(x: torch.Tensor, c: float) -> torch.Tensor:
    out, acc = torch.zeros_like(x), torch.zeros(x.shape[0], dtype=x.dtype)
    for t in reversed(range(x.shape[1])):
        acc = x[:, t] + c * acc
        out[:, t] = acc
    return out


# T around perfect squares and primes exercises every chunk/padding shape.
@pytest.mark.parametrize("t", [1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 101, 1000])
@pytest.mark.parametrize("c", [0.0, 0.5, 0.99, 1.0])
def test_discounted_reverse_cumsum(t: int, c: float) -> None:
    x = torch.randn(3, t, dtype=torch.float64, generator=torch.Generator().manual_seed(t))
    close(discounted_reverse_cumsum(x, c), loop_rcumsum(x, c))


def test_masked_scan_ignores_masked_garbage() -> None:
    x = torch.tensor([[1.0, math.nan, 2.0, math.inf, 3.0]])
    m = torch.tensor([[True, False, True, False, True]])
    torch.testing.assert_close(
        masked_reverse_cumsum(x, m, 0.5), torch.tensor([[2.75, 0, 3.5, 0, 3]])
    )


def make_inputs(b: int, t: int, seed: int, dtype: torch.dtype, mask_kind: str):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(b, t, generator=gen).to(dtype)
    v = torch.randn(b, t, generator=gen).to(dtype)
    if mask_kind == "all":
        m = torch.ones(b, t, dtype=torch.bool)
    elif mask_kind == "prefix_pad":  # left prompt, right padding: the common LM layout
        start = torch.randint(0, t, (b, 1), generator=gen)
        stop = torch.randint(0, t + 1, (b, 1), generator=gen)
        pos = torch.arange(t)
        m = (pos >= start) & (pos < stop)
    else:
        m = torch.rand(b, t, generator=gen) < 0.6
    return r, v, m


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("mask_kind", ["all", "prefix_pad", "random"])
@pytest.mark.parametrize(("b", "t"), [(1, 1), (4, 7), (3, 130), (2, 700)])
@pytest.mark.parametrize("boot", [False, True])
def test_gae_matches_reference(dtype, mask_kind: str, b: int, t: int, boot: bool) -> None:
    r, v, m = make_inputs(b, t, b * t, dtype, mask_kind)
    last = torch.randn(b).to(dtype) if boot else None
    # γλ < 1 keeps long-T values O(1) so one tolerance fits every T.
    fast = gae(r, v, m, gamma=0.99, lam=0.9, last_value=last)
    slow = ref.gae_ref(r, v, m, gamma=0.99, lam=0.9, last_value=last)
    close(fast[0], slow[0])
    close(fast[1], slow[1])


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 5),
    t=st.integers(0, 40),
    seed=st.integers(0, 2**16),
    gamma=st.sampled_from([0.0, 0.7, 1.0]),
    lam=st.sampled_from([0.0, 0.95, 1.0]),
)
def test_gae_random(b: int, t: int, seed: int, gamma: float, lam: float) -> None:
    r, v, m = make_inputs(b, t, seed, torch.float64, "random")
    for fast, slow in zip(gae(r, v, m, gamma, lam), ref.gae_ref(r, v, m, gamma, lam), strict=True):
        close(fast, slow)


def test_gae_unmasked_lambda_one_is_return_minus_value() -> None:
    r = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, 0.5, 0.5]], dtype=torch.float64)
    adv, ret = gae(r, v, torch.ones(1, 3), gamma=0.5, lam=1.0)
    g = torch.tensor([[1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0]], dtype=torch.float64)
    torch.testing.assert_close(ret, g)
    torch.testing.assert_close(adv, g - v)


def test_gae_masked_tokens_are_skipped_not_zero_steps() -> None:
    """Interleaving masked garbage tokens must not change any valid token's output."""
    gen = torch.Generator().manual_seed(0)
    r, v = torch.randn(2, 6, generator=gen), torch.randn(2, 6, generator=gen)
    last = torch.randn(2, generator=gen)
    dense = gae(r, v, torch.ones(2, 6), 0.9, 0.8, last)
    keep = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1, 1, 0], dtype=torch.bool)
    rs = torch.full((2, 10), math.nan)
    vs = torch.full((2, 10), math.nan)
    rs[:, keep], vs[:, keep] = r, v
    sparse = gae(rs, vs, keep.expand(2, 10), 0.9, 0.8, last)
    for d, s in zip(dense, sparse, strict=True):
        torch.testing.assert_close(s[:, keep], d)
        assert (s[:, ~keep] == 0).all()


@pytest.mark.parametrize("where", ["reward", "value", "last_value"])
def test_gae_non_finite_poisons_its_row(where: str) -> None:
    r, v, m = make_inputs(3, 8, 1, torch.float64, "all")
    m[1, 2] = False
    last = torch.zeros(3, dtype=torch.float64)
    if where == "reward":
        r[1, 5] = math.inf
    elif where == "value":
        v[1, 5] = math.nan
    else:
        last[1] = -math.inf
    adv, ret = gae(r, v, m, 0.9, 0.9, last)
    assert adv[1, m[1]].isnan().all() and ret[1, m[1]].isnan().all()
    assert adv[1, 2] == 0 and ret[1, 2] == 0
    assert adv[[0, 2]].isfinite().all()
    slow = ref.gae_ref(r, v, m, 0.9, 0.9, last)
    close(adv, slow[0])
    close(ret, slow[1])


def test_gae_gradcheck() -> None:
    gen = torch.Generator().manual_seed(2)
    r = torch.randn(2, 9, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(2, 9, dtype=torch.float64, generator=gen, requires_grad=True)
    last = torch.randn(2, dtype=torch.float64, generator=gen, requires_grad=True)
    m = torch.rand(2, 9, generator=gen) < 0.7
    assert torch.autograd.gradcheck(lambda a, b, c: gae(a, b, m, 0.95, 0.9, c), (r, v, last))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"gamma": 1.2}, "gamma=1.2"), ({"lam": -0.1}, "lam=-0.1")],
)
def test_gae_bad_discounts(kwargs: dict, match: str) -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=match):
        gae(x, x, x, **kwargs)


def test_gae_shape_error() -> None:
    with pytest.raises(ValueError, match=r"\(1, 2\), \(1, 3\)"):
        gae(torch.zeros(1, 2), torch.zeros(1, 3), torch.zeros(1, 2))
