"""anchor_advantages: fast path vs plain-loop reference, conventions, NaN policy."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.kernels import anchor_advantages, group_key
from marl.kernels import reference as ref


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), states=st.integers(1, 6), actions=st.integers(1, 4),
       seed=st.integers(0, 2**16), scale=st.booleans())
def test_matches_reference(n: int, states: int, actions: int, seed: int, scale: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    s = torch.randint(-3, states - 3, (n,), generator=gen)
    a = group_key(s, torch.randint(0, actions, (n,), generator=gen))
    # few distinct returns: ties, constant states and single calls are common
    r = torch.randint(0, 3, (n,), generator=gen).double()
    torch.testing.assert_close(anchor_advantages(r, s, a, scale),
                               ref.anchor_advantages_ref(r, s, a, scale))


def test_credit_goes_to_the_choice_that_differed() -> None:
    """Two states. In state 0 the rare choice (action 1) succeeded: it gets the credit, the
    common one a small debit. In state 1 every call chose alike: no credit, whatever the
    outcome (the choice made no difference there)."""
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    s = torch.tensor([0, 0, 0, 0, 1, 1])
    a = torch.tensor([1, 0, 0, 0, 2, 2])
    out = anchor_advantages(r, s, a)
    torch.testing.assert_close(out, torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0]))
    scaled = anchor_advantages(r, s, a, scale=True, eps=0.0)
    torch.testing.assert_close(scaled[:4], out[:4] / 0.5)  # sample std of [1, 0, 0, 0]
    assert scaled[4:].abs().max() == 0


def test_a_state_met_once_gets_nothing() -> None:
    out = anchor_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), torch.tensor([0, 1]),
                            scale=True)
    assert out.abs().max() == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_poisons_its_state_and_action_only(bad: float) -> None:
    r = torch.tensor([bad, 0.0, 1.0, 0.0, 1.0])
    s = torch.tensor([0, 0, 0, 1, 1])
    a = torch.tensor([0, 1, 1, 2, 3])
    out = anchor_advantages(r, s, a)
    assert out[:3].isnan().all() and out[3:].isfinite().all()
    torch.testing.assert_close(out, ref.anchor_advantages_ref(r, s, a), equal_nan=True)


def test_shapes_must_agree() -> None:
    with pytest.raises(ValueError, match="one shape"):
        anchor_advantages(torch.zeros(3), torch.zeros(3, dtype=torch.long),
                          torch.zeros(2, dtype=torch.long))
