"""Group-relative advantages: MAGRPO / Dr. GRPO, GRPO, RLOO and ReMax baselines.

One team reward per joint rollout; rollouts that share a group key (same task instance, and
optionally the same agent or turn) form a group, and each rollout's advantage is its reward
relative to a baseline computed from its group:

==========  =================================================  ============================
baseline    advantage                                          source
==========  =================================================  ============================
mean        ``A_j = R_j − mean_g R``                           MAGRPO (Liu et al.), Dr. GRPO
mean_std    ``A_j = (R_j − mean_g R) / (std_g R + eps)``       GRPO (Shao et al.)
loo         ``A_j = (G·R_j − Σ_g R) / (G − 1)``                RLOO (Ahmadian et al.)
max         ``A_j = R_j − max_g R``                            ReMax-style
==========  =================================================  ============================

Conventions: ``std`` is the *sample* standard deviation (Bessel, ``G − 1``), matching
``torch.std`` and TRL's GRPO; ``eps`` defaults to 1e-4 (TRL's value) and is added to the std,
so a constant group gets advantage 0. A singleton group always gets advantage 0. NaN/inf policy:
a group containing a NaN or ±inf reward (or whose float sum overflows) gets NaN for every member.
Half-precision rewards are accumulated in float32 and returned in their own dtype.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from marl.kernels import triton_kernels
from marl.kernels.scan import compute_dtype

BASELINES = ("mean", "mean_std", "loo", "max")


def group_key(instance: Tensor, agent: Tensor | None = None, turn: Tensor | None = None) -> Tensor:
    """Combine integer keys into one dense group id per row.

    Plain GRPO/MAGRPO groups by ``instance``; Dr.MAS groups by ``(instance, agent)``; AT-GRPO by
    ``(instance, turn, agent)``. Ids are dense in ``[0, n_groups)`` and ordered
    lexicographically by ``(instance, agent, turn)``, so equal inputs give equal ids.

    Args:
        instance, agent, turn: ``[B]`` integer tensors (any values, negative or huge).

    Returns:
        ``[B]`` int64 group ids.

    >>> group_key(torch.tensor([7, 7, -3, 7]), agent=torch.tensor([0, 1, 0, 0]))
    tensor([1, 2, 0, 1])
    """
    keys = [k for k in (instance, agent, turn) if k is not None]
    for k in keys:
        if k.shape != instance.shape or k.dim() != 1 or k.is_floating_point():
            raise ValueError(
                f"group_key expects 1-D integer keys of one shape; got {tuple(k.shape)} "
                f"{k.dtype} next to instance {tuple(instance.shape)}"
            )
    ids, _ = dense_rank(instance)
    for k in keys[1:]:
        dense, width = dense_rank(k)
        # Both factors are < B, so the pair code fits int64 for any B below 3e9, and ranking
        # it keeps the lexicographic order.
        ids, _ = dense_rank(ids * width + dense)
    return ids


def dense_rank(x: Tensor) -> tuple[Tensor, int]:
    """Order-preserving dense relabel: ``[B]`` integers → (rank among distinct values, count).

    Values spanning a small range (``max − min < 4B``) are ranked by counting (bincount +
    cumsum, no sort); others by a sorted ``torch.unique``. One device sync.

    >>> dense_rank(torch.tensor([40, -2, 40, 7]))
    (tensor([2, 0, 2, 1]), 3)
    """
    n = x.numel()
    if n == 0:
        return x.long(), 0
    lo, hi = (int(v) for v in torch.aminmax(x))
    if hi - lo < 4 * n:
        off = (x - lo).long()
        rank = (torch.bincount(off, minlength=hi - lo + 1) > 0).cumsum(0) - 1
        return rank.index_select(0, off), int(rank[-1]) + 1
    uniq, inv = torch.unique(x, sorted=True, return_inverse=True)
    return inv, uniq.numel()


def dense_group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer ids ``[B]`` to segment indices ``[B]`` in ``[0, n_segments)``.

    Ids that already span a small range (``max − min < 2B``, e.g. ``arange(B) // G`` or
    :func:`group_key` output) are shifted by their minimum, skipping the hash/sort of
    ``torch.unique``; some segments may then be empty, which every caller tolerates.
    Costs one device sync (the min/max).
    """
    n = group_ids.numel()
    if n == 0:
        return group_ids.long(), 0
    lo, hi = (int(v) for v in torch.aminmax(group_ids))
    if hi - lo < 2 * n:
        return (group_ids - lo).long(), hi - lo + 1
    uniq, inv = torch.unique(group_ids, sorted=False, return_inverse=True)
    return inv, uniq.numel()


def _check(rewards: Tensor, group_ids: Tensor, baseline: str) -> None:
    if baseline not in BASELINES:
        raise ValueError(f"baseline={baseline!r} is not one of {BASELINES}")
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_advantages expects rewards [B] and group_ids [B]; got "
            f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if not rewards.is_floating_point() or group_ids.is_floating_point():
        raise ValueError(
            f"group_advantages expects float rewards and integer group ids; got "
            f"{rewards.dtype} and {group_ids.dtype}"
        )


def group_advantages(
    rewards: Tensor, group_ids: Tensor, baseline: str = "mean", eps: float = 1e-4
) -> Tensor:
    """Per-rollout advantage relative to its group (see the module table for each baseline).

    Vectorised segment reductions (``bincount`` / ``index_add`` / ``scatter_reduce``), no loop
    over groups. On CUDA tensors that do not require grad, the Triton twin runs when triton is
    installed; otherwise this torch path (differentiable for every baseline) runs.

    Args:
        rewards: ``[B]`` float. group_ids: ``[B]`` integer, any values, any order.
        baseline: one of ``"mean"``, ``"mean_std"``, ``"loo"``, ``"max"``.
        eps: added to the group std for ``"mean_std"``.

    Returns:
        ``[B]`` advantages in the dtype of ``rewards``.

    >>> r = torch.tensor([1.0, 3.0, 5.0, 2.0]); g = torch.tensor([10, 10, -4, 10])
    >>> group_advantages(r, g)
    tensor([-1.,  1.,  0.,  0.])
    >>> group_advantages(r, g, "loo")
    tensor([-1.5000,  1.5000,  0.0000,  0.0000])
    """
    _check(rewards, group_ids, baseline)
    if rewards.is_cuda and not rewards.requires_grad and triton_kernels.available():
        return triton_kernels.group_advantages(rewards, group_ids, baseline, eps)
    idx, n_groups = dense_group_index(group_ids)
    r = rewards.to(compute_dtype(rewards.dtype))
    cnt = torch.bincount(idx, minlength=n_groups).to(r.dtype)  # [G]
    total = r.new_zeros(n_groups).index_add(0, idx, r)  # [G]
    # total − total is 0 for a finite group sum and NaN otherwise: adding it to the [G] baseline
    # poisons exactly the groups the NaN/inf policy names, with no extra full-size pass.
    poison = total - total
    mean = total / cnt.clamp(min=1) + poison
    # Singletons: r − total/1 is exactly 0 in floating point, so every baseline gives 0.
    dev = r - mean.index_select(0, idx)
    if baseline == "mean":
        return dev.to(rewards.dtype)
    if baseline == "mean_std":
        var = r.new_zeros(n_groups).index_add(0, idx, dev * dev) / (cnt - 1).clamp(min=1)
        # sqrt has an infinite slope at 0: route constant groups around it to keep grads finite.
        pos = var > 0
        std = torch.where(pos, var, 1.0).sqrt() * pos
        adv = dev / (std + eps).index_select(0, idx)
    elif baseline == "loo":
        adv = dev * (cnt / (cnt - 1).clamp(min=1)).index_select(0, idx)
    else:
        top = r.new_full((n_groups,), -math.inf).scatter_reduce(0, idx, r, "amax") + poison
        adv = r - top.index_select(0, idx)
    return adv.to(rewards.dtype)


def anchor_advantages(
    returns: Tensor, state_ids: Tensor, action_ids: Tensor, scale: bool = False,
    eps: float = 1e-4
) -> Tensor:
    """Per-call credit from anchor states: ``A = mean R over the calls with the same state and
    action − mean R over the calls with the same state``, a Monte-Carlo ``Q(s, a) − V(s)``
    from the batch (GiGPO's anchor states, with the action's own group as its value).

    A call whose choice was the one most calls in its state made, in a state where that
    choice mattered little, gets little credit whatever the episode's outcome; a rare choice
    that did better than its state's average gets the difference. ``scale`` divides by the
    sample std of R over the state's calls plus ``eps`` (GRPO's scaling); a state met once,
    or whose calls all returned alike, gets 0. NaN policy as :func:`group_advantages`: a
    non-finite return poisons its state's and its action's groups.

    Args:
        returns: ``[S]`` float, the return each call is credited with (its team's).
        state_ids: ``[S]`` integer state of each call (equal id: same agent and observation).
        action_ids: ``[S]`` integer (state, action) pair of each call; equal ids must have
            equal states (e.g. ``group_key(state_ids, action)``).
        scale: divide by the state's std of R. eps: added to that std.

    Returns:
        ``[S]`` advantages in the dtype of ``returns``.

    >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0]); s = torch.tensor([0, 0, 0, 0])
    >>> anchor_advantages(r, s, torch.tensor([5, 6, 6, 6]))  # the rare choice succeeded
    tensor([ 0.7500, -0.2500, -0.2500, -0.2500])
    >>> anchor_advantages(r, s, torch.tensor([5, 5, 6, 6]))  # a choice made in a success
    tensor([ 0.2500,  0.2500, -0.2500, -0.2500])
    """
    if state_ids.shape != returns.shape or action_ids.shape != returns.shape:
        raise ValueError(
            f"anchor_advantages expects returns, state_ids and action_ids of one shape [S]; "
            f"got {tuple(returns.shape)}, {tuple(state_ids.shape)}, {tuple(action_ids.shape)}")
    dt = compute_dtype(returns.dtype)
    dev = group_advantages(returns.to(dt), state_ids)  # R − V, with the NaN policy
    adv = dev - group_advantages(returns.to(dt), action_ids)  # (R − V) − (R − Q) = Q − V
    if scale:
        idx, n_groups = dense_group_index(state_ids)
        cnt = torch.bincount(idx, minlength=n_groups).to(dt)
        var = dev.new_zeros(n_groups).index_add(0, idx, dev * dev) / (cnt - 1).clamp(min=1)
        adv = adv / (var.sqrt() + eps).index_select(0, idx)
    return adv.to(returns.dtype)


def agent_scale(returns: Tensor) -> Tensor:
    """Per-agent advantage scale (Dr.MAS): the standard deviation of each agent's returns
    over the batch, 1 where they do not vary (every advantage is 0 there).

    Dividing an agent's advantages by it keeps the policy-gradient term's size the same
    whatever the reward's spread, so a team that rarely succeeds still learns from its
    successes against the entropy and KL terms.

    Args:
        returns: ``[B, N]`` float, each agent's return in each rollout.

    Returns:
        ``[N]`` population standard deviations in the dtype of ``returns``; NaN for an
        agent with a non-finite return (its update is then skipped).

    >>> agent_scale(torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    tensor([0.4330, 1.0000])
    """
    if returns.dim() != 2:
        raise ValueError(f"agent_scale expects returns of shape [B, N]; got "
                         f"{tuple(returns.shape)}")
    dt = compute_dtype(returns.dtype)
    std = returns.to(dt).std(dim=0, correction=0)
    return torch.where(std == 0, torch.ones_like(std), std).to(returns.dtype)
