"""broadcast_to_tokens vs the plain-loop reference: mask dtypes, overlaps, NaN, gradients."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.kernels import broadcast_to_tokens, triton_kernels
from marl.kernels import reference as ref

TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}
MASK_DTYPES = [torch.bool, torch.uint8, torch.float32]


def close(fast: torch.Tensor, slow: torch.Tensor) -> None:
    tol = TOL[fast.dtype]
    torch.testing.assert_close(fast, slow, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("mask_dtype", MASK_DTYPES)
@settings(max_examples=15, deadline=None)
@given(
    b=st.integers(1, 4),
    t=st.integers(0, 30),
    n=st.integers(1, 6),
    density=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_matches_reference(dtype, mask_dtype, b, t, n, density, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    adv = torch.randn(b, n, generator=gen).to(dtype)
    mask = (torch.rand(b, t, n, generator=gen) < density).to(mask_dtype)
    out = broadcast_to_tokens(adv, mask)
    assert out.shape == (b, t) and out.dtype == dtype
    close(out, ref.broadcast_to_tokens_ref(adv, mask))


def test_one_owner_none_and_overlap() -> None:
    adv = torch.tensor([[2.0, -1.0, 5.0]])
    mask = torch.tensor([[[1, 0, 0], [0, 0, 1], [0, 0, 0], [1, 1, 0]]], dtype=torch.bool)
    torch.testing.assert_close(broadcast_to_tokens(adv, mask), torch.tensor([[2.0, 5.0, 0.0, 1.0]]))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_reaches_only_its_agents_tokens(bad: float) -> None:
    adv = torch.tensor([[1.0, bad], [3.0, 4.0]])
    mask = torch.tensor([[[1, 0], [0, 1], [0, 0]], [[0, 1], [1, 0], [1, 1]]], dtype=torch.bool)
    out = broadcast_to_tokens(adv, mask)
    assert out[0, 0] == 1.0 and out[0, 2] == 0.0 and not out[0, 1].isfinite()
    assert out[1].isfinite().all()
    close(out, ref.broadcast_to_tokens_ref(adv, mask))


def test_gradcheck() -> None:
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    mask = torch.rand(3, 7, 4, generator=gen) < 0.4
    assert torch.autograd.gradcheck(lambda a: broadcast_to_tokens(a, mask), (adv,))


@pytest.mark.parametrize(
    ("adv", "mask", "match"),
    [
        (torch.zeros(2, 3), torch.zeros(2, 5, 4, dtype=torch.bool), r"\(2, 3\) and \(2, 5, 4\)"),
        (torch.zeros(2, 3), torch.zeros(5, 3, dtype=torch.bool), r"\(5, 3\)"),
        (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 5, 3, dtype=torch.bool), "float"),
    ],
)
def test_errors(adv, mask, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        broadcast_to_tokens(adv, mask)


class FakeCuda(torch.Tensor):
    """A CPU tensor that claims to live on a GPU: exercises the dispatch without one."""

    @property
    def is_cuda(self) -> bool:
        return True


def test_cuda_tensors_route_to_triton(monkeypatch) -> None:
    monkeypatch.setattr(triton_kernels, "available", lambda: True)
    monkeypatch.setattr(triton_kernels, "broadcast_to_tokens", lambda *a: "triton")
    adv = torch.Tensor._make_subclass(FakeCuda, torch.zeros(1, 2))
    assert broadcast_to_tokens(adv, torch.ones(1, 3, 2, dtype=torch.bool)) == "triton"
