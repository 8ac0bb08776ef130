"""agent_scale: fast path vs plain-loop reference, constant agents, NaN policy, shapes."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.kernels import agent_scale
from marl.kernels import reference as ref


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 30), n=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_matches_reference(b: int, n: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (b, n), generator=gen).double()  # constant columns are common
    torch.testing.assert_close(agent_scale(r), ref.agent_scale_ref(r))


def test_a_constant_agent_keeps_scale_one_and_others_their_spread() -> None:
    r = torch.tensor([[1.0, 2.0], [0.0, 2.0]])
    assert agent_scale(r).tolist() == [0.5, 1.0]


def test_a_non_finite_return_makes_its_agent_nan_only() -> None:
    r = torch.tensor([[math.nan, 1.0], [0.0, 0.0]])
    out = agent_scale(r)
    assert math.isnan(out[0]) and out[1] == 0.5


def test_other_shapes_are_refused_with_the_shape_seen() -> None:
    with pytest.raises(ValueError, match=r"\[B, N\].*\(4,\)"):
        agent_scale(torch.zeros(4))
