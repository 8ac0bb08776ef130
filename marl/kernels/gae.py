"""Token-level generalised advantage estimation (Schulman et al., 2016) with token masks.

Departure from the usual loop: masked tokens (prompt, padding, another agent's text) are
*skipped*, not treated as zero-reward steps: the next valid token is the "next step" for both
the TD error and the λ-recursion, and masked tokens get advantage and return 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from marl.kernels.scan import Packing, compute_dtype, scan_packed


def _check(rewards: Tensor, values: Tensor, masks: Tensor, gamma: float, lam: float) -> None:
    if rewards.dim() != 2 or rewards.shape != values.shape or rewards.shape != masks.shape:
        raise ValueError(
            f"gae expects rewards, values and masks of one shape [B, T]; got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(masks.shape)}"
        )
    for name, v in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"gae: {name}={v} must lie in [0, 1] (a discount, not a rate)")


def gae(
    rewards: Tensor,
    values: Tensor,
    masks: Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
    last_value: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE over the valid tokens of each row.

    ``δ_t = r_t + γ·V_{t'} − V_t`` and ``A_t = δ_t + γλ·A_{t'}``, where ``t'`` is the next valid
    token after ``t`` in the row; returns ``G_t = A_t + V_t``.

    Bootstrap: after a row's last valid token the value is ``last_value[b]`` if given, else 0
    (a finished sequence). Masked positions are never read and get 0 in both outputs.
    NaN/inf policy: any non-finite reward or value at a valid token, or a non-finite
    ``last_value``, makes every valid output of that row NaN.

    Args:
        rewards: ``[B, T]`` float. values: ``[B, T]`` float. masks: ``[B, T]`` bool (or 0/1).
        gamma: discount in [0, 1]. lam: GAE λ in [0, 1].
        last_value: optional ``[B]`` bootstrap value.

    Returns:
        ``(advantages [B, T], returns [B, T])`` in the dtype of ``rewards``.

    >>> r = torch.tensor([[0.0, 0.0, 1.0]]); v = torch.zeros(1, 3); m = torch.ones(1, 3)
    >>> gae(r, v, m, gamma=1.0, lam=1.0)[0]
    tensor([[1., 1., 1.]])
    """
    _check(rewards, values, masks, gamma, lam)
    dt = compute_dtype(torch.promote_types(rewards.dtype, values.dtype))
    mask = masks.bool()
    pk = Packing(mask)
    r = pk.pack(rewards.to(dt))  # [B, W] valid tokens packed left, zeros after
    v = pk.pack(values.to(dt))
    if last_value is not None:
        # The bootstrap is the "next value" of the last valid token: fold γ·V_boot into its
        # reward (so a non-finite bootstrap poisons its row, as documented). Rows with no
        # valid token aim at the dump column, which is zeroed again.
        n_valid = mask.sum(1)
        last = torch.where(n_valid > 0, n_valid - 1, pk.width - 1)[:, None]
        r.scatter_add_(1, last, gamma * last_value.to(dt).reshape(-1, 1))
        r[:, -1] = 0
    delta = r - v  # δ_t = r_t + γ·V_{t+1} − V_t; V past the last valid token is 0
    delta[:, :-1] += gamma * v[:, 1:]
    adv = scan_packed(delta, gamma * lam, pk.size, pk.n_chunks)  # [B, W], dump column 0
    # Both outputs are gathered from packed rows whose dump column is 0: masked positions get 0.
    return pk.unpack(adv).to(rewards.dtype), pk.unpack(adv + v).to(rewards.dtype)
