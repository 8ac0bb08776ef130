"""group_key / group_advantages: fast path vs plain-loop reference, edge cases, gradients."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.kernels import BASELINES, dense_group_index, group_advantages, group_key, triton_kernels
from marl.kernels import reference as ref

TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 2e-2}


def close(fast: torch.Tensor, slow: torch.Tensor) -> None:
    assert fast.dtype == slow.dtype
    tol = TOL[fast.dtype]
    torch.testing.assert_close(fast, slow, rtol=tol, atol=tol, equal_nan=True)


def layout(name: str, n: int, gen: torch.Generator) -> torch.Tensor:
    """Group-id layouts that stress the segment reductions differently."""
    if name == "one_group":
        return torch.full((n,), 7)
    if name == "singletons":
        return torch.randperm(n, generator=gen) * 3 - n
    if name == "ragged_unsorted":
        return torch.randint(0, max(n // 3, 1), (n,), generator=gen)
    if name == "negative":
        return -torch.randint(1, 6, (n,), generator=gen)
    if name == "huge":  # forces the torch.unique path of dense_group_index
        return torch.randint(-5, 5, (n,), generator=gen) * (2**62 // 5)
    raise AssertionError(name)


LAYOUTS = ["one_group", "singletons", "ragged_unsorted", "negative", "huge"]


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("name", LAYOUTS)
def test_matches_reference(baseline: str, dtype: torch.dtype, name: str) -> None:
    gen = torch.Generator().manual_seed(10 * BASELINES.index(baseline) + LAYOUTS.index(name))
    for n in (1, 2, 37, 300):
        r = (torch.randn(n, generator=gen) * 3).to(dtype)
        g = layout(name, n, gen)
        close(group_advantages(r, g, baseline), ref.group_advantages_ref(r, g, baseline))


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    ids=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=12, max_size=12, unique=True),
    seed=st.integers(0, 2**16),
    baseline=st.sampled_from(BASELINES),
)
def test_random_layouts(sizes: list[int], ids: list[int], seed: int, baseline: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    g = torch.tensor([ids[i] for i, s in enumerate(sizes) for _ in range(s)])
    g = g[torch.randperm(g.numel(), generator=gen)]
    # Few distinct reward values: ties (and hence constant groups) are common.
    r = torch.randint(-3, 4, (g.numel(),), generator=gen).double()
    close(group_advantages(r, g, baseline), ref.group_advantages_ref(r, g, baseline))


def test_documented_conventions() -> None:
    r = torch.tensor([1.0, 3.0, 5.0, 4.0, 4.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 9, 2, 2])
    # Sample std (G − 1): std([1, 3]) = √2; constant group → 0; singleton → 0.
    got = group_advantages(r, g, "mean_std", eps=1e-4)
    want = torch.tensor([-1, 1, 0, 0, 0], dtype=torch.float64) / (math.sqrt(2) + 1e-4)
    want[2:] = 0
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(
        group_advantages(r, g, "max"), torch.tensor([-2.0, 0, 0, 0, 0]).double()
    )
    # LOO: (G·R_j − ΣR)/(G − 1)
    torch.testing.assert_close(
        group_advantages(r, g, "loo")[:2], torch.tensor([-2.0, 2.0]).double()
    )


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_poisons_its_group_only(baseline: str, bad: float) -> None:
    r = torch.tensor([1.0, bad, 2.0, 5.0, 6.0, bad])
    g = torch.tensor([0, 0, 0, 1, 1, 2])
    out = group_advantages(r, g, baseline)
    assert out[:3].isnan().all() and out[5].isnan()
    assert out[3:5].isfinite().all()
    close(out, ref.group_advantages_ref(r, g, baseline))


@pytest.mark.parametrize("baseline", ["mean", "loo", "mean_std"])
def test_gradcheck(baseline: str) -> None:
    r = torch.randn(11, dtype=torch.float64, requires_grad=True)
    g = torch.tensor([3, 1, 3, 3, 1, 8, 1, 3, 2, 2, 2])
    assert torch.autograd.gradcheck(lambda x: group_advantages(x, g, baseline), (r,))


def test_constant_groups_have_finite_grads() -> None:
    r = torch.tensor([2.0, 2.0, 5.0], dtype=torch.float64, requires_grad=True)
    group_advantages(r, torch.tensor([0, 0, 1]), "mean_std").sum().backward()
    assert r.grad.isfinite().all()


def test_empty() -> None:
    out = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert out.shape == (0,)


def test_dense_group_index_paths() -> None:
    idx, n = dense_group_index(torch.tensor([5, 3, 5, 4]))  # small span: shifted ids
    assert idx.tolist() == [2, 0, 2, 1] and n == 3
    idx, n = dense_group_index(torch.tensor([2**60, -(2**60), 2**60]))  # hashed
    assert n == 2 and idx[0] == idx[2] != idx[1]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.zeros(3), torch.zeros(3, dtype=torch.long), "median"), "baseline='median'"),
        ((torch.zeros(3), torch.zeros(4, dtype=torch.long), "mean"), r"\(3,\) and \(4,\)"),
        ((torch.zeros(3), torch.zeros(3), "mean"), "integer group ids"),
        ((torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long), "mean"), "float"),
    ],
)
def test_errors_name_the_problem(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        group_advantages(*args)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    use_agent=st.booleans(),
    use_turn=st.booleans(),
)
def test_group_key_matches_reference(n: int, seed: int, use_agent: bool, use_turn: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    inst = torch.randint(-3, 3, (n,), generator=gen) * (2**61)
    agent = torch.randint(0, 3, (n,), generator=gen) if use_agent else None
    turn = torch.randint(-2, 2, (n,), generator=gen) if use_turn else None
    assert torch.equal(group_key(inst, agent, turn), ref.group_key_ref(inst, agent, turn))


def test_group_key_feeds_group_advantages() -> None:
    """Dr.MAS-style (instance, agent) groups: each agent is baselined against itself."""
    inst = torch.tensor([0, 0, 0, 0])
    agent = torch.tensor([0, 1, 0, 1])
    r = torch.tensor([1.0, 10.0, 3.0, 30.0])
    out = group_advantages(r, group_key(inst, agent))
    torch.testing.assert_close(out, torch.tensor([-1.0, -10.0, 1.0, 10.0]))


def test_group_key_errors() -> None:
    with pytest.raises(ValueError, match="integer keys"):
        group_key(torch.zeros(3, dtype=torch.long), agent=torch.zeros(3))
    with pytest.raises(ValueError, match=r"\(2,\)"):
        group_key(torch.zeros(3, dtype=torch.long), agent=torch.zeros(2, dtype=torch.long))


class FakeCuda(torch.Tensor):
    """A CPU tensor that claims to live on a GPU: exercises the dispatch without one."""

    @property
    def is_cuda(self) -> bool:
        return True


def test_cuda_tensors_route_to_triton_unless_grad_is_needed(monkeypatch) -> None:
    monkeypatch.setattr(triton_kernels, "available", lambda: True)
    monkeypatch.setattr(triton_kernels, "group_advantages", lambda *a: "triton")
    g = torch.tensor([0, 0, 1])
    r = torch.Tensor._make_subclass(FakeCuda, torch.tensor([1.0, 2.0, 3.0]))
    assert group_advantages(r, g, "loo") == "triton"
    r_grad = torch.Tensor._make_subclass(FakeCuda, torch.tensor([1.0, 2.0, 3.0]), True)
    assert isinstance(group_advantages(r_grad, g), torch.Tensor)  # autograd needs torch
    monkeypatch.setattr(triton_kernels, "available", lambda: False)
    assert isinstance(group_advantages(r, g), torch.Tensor)
