"""Multi-turn credit: MAGRPO branch-tree returns and GiGPO step-level advantages.

* MAGRPO (Liu et al., AAAI 2026), multi-turn: every joint action branches into G children at
  the next turn; a node's return is ``R = r + γ · mean(children's R)``, leaves ``R = r``.
* GiGPO (Feng et al., 2025): ``A = A_episode + ω · A_step``, where ``A_step = R_t − mean`` over
  the steps in the same episode group that saw the *identical* observation (anchor state),
  ``R_t = Σ_{k≥t} γ^(k−t) r_k``; singleton step groups get ``A_step = 0``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from marl.kernels.advantages import group_advantages, group_key
from marl.kernels.scan import compute_dtype, masked_reverse_cumsum


def node_depth(parents: Tensor) -> Tensor:
    """Depth of every node of a forest given parent indices ``[M]`` (-1 for roots) → ``[M]``.

    Pointer jumping: after k rounds each node knows its distance to the ancestor 2^k levels up,
    so a depth-D forest takes ⌈log2 D⌉ + 1 vectorised rounds. Raises ValueError on a cycle or an
    out-of-range parent.
    """
    m = parents.numel()
    if m:
        lo, hi = (int(v) for v in torch.aminmax(parents))
        if lo < -1 or hi >= m:
            raise ValueError(
                f"parents must be node indices in [0, {m}) or -1 for a root; got values in "
                f"[{lo}, {hi}]"
            )
    # Extended arrays with a sentinel node m that is its own parent at depth 0: roots point at
    # it, so rounds need no "past the root" masks. up[i] is the ancestor 2^k levels up (or m),
    # depth[i] the distance to it (to the root once up[i] == m).
    sentinel = torch.full((1,), m, dtype=torch.long, device=parents.device)
    up = torch.cat([torch.where(parents >= 0, parents.long(), m), sentinel])
    depth = torch.cat([(parents >= 0).long(), sentinel * 0])
    for _ in range(max(m, 1).bit_length() + 1):
        if bool((up == m).all()):
            return depth[:m]
        depth = depth + depth.index_select(0, up)
        up = up.index_select(0, up)
    raise ValueError("parents contain a cycle: some node never reaches a root (-1)")


def tree_returns(rewards: Tensor, parents: Tensor, gamma: float = 1.0) -> Tensor:
    """MAGRPO multi-turn returns ``R_i = r_i + γ · mean_{c ∈ children(i)} R_c`` over a forest.

    Processed bottom-up one depth level at a time (a Python loop over depth, never over nodes);
    each level costs O(nodes at that level). Nodes may be in any order. NaN/inf rewards propagate
    to every ancestor (through the mean), as the equation says.

    Args:
        rewards: ``[M]`` float immediate rewards per node (joint action).
        parents: ``[M]`` integer parent index, -1 for roots.
        gamma: discount in [0, 1].

    Returns:
        ``[M]`` returns in the dtype of ``rewards``.

    >>> r = torch.tensor([1.0, 2.0, 4.0, 0.0]); p = torch.tensor([-1, 0, 0, 1])
    >>> tree_returns(r, p, gamma=0.5)
    tensor([2.5000, 2.0000, 4.0000, 0.0000])
    """
    if rewards.dim() != 1 or parents.shape != rewards.shape:
        raise ValueError(
            f"tree_returns expects rewards [M] and parents [M]; got "
            f"{tuple(rewards.shape)} and {tuple(parents.shape)}"
        )
    depth = node_depth(parents)
    r = rewards.to(compute_dtype(rewards.dtype))
    if r.numel() == 0:
        return rewards.clone()
    sizes = torch.bincount(depth).tolist()  # nodes per depth
    # Small integer keys sort several times faster than int64 ones.
    key = depth.to(torch.int16) if len(sizes) < 2**15 else depth
    levels = torch.split(torch.sort(key, stable=True).indices, sizes)  # node ids per depth
    par = parents.long()
    # Roots shift to bin 0, which is dropped: no boolean indexing needed.
    n_child = torch.bincount(par + 1, minlength=r.numel() + 1)[1:].to(r.dtype)
    child_sum = r.new_zeros(r.numel())
    ret = r.clone()
    for d in range(len(levels) - 1, 0, -1):
        kids, nodes = levels[d], levels[d - 1]
        # Every child of a depth-(d-1) node sits at depth d, so its sum is complete after this.
        # In-place updates keep each level O(its size); autograd saves only indices here.
        child_sum.index_add_(0, par.index_select(0, kids), ret.index_select(0, kids))
        cnt = n_child.index_select(0, nodes)
        own = r.index_select(0, nodes)
        mean = child_sum.index_select(0, nodes) / cnt.clamp(min=1)
        ret.index_copy_(0, nodes, torch.where(cnt > 0, own + gamma * mean, own))
    return ret.to(rewards.dtype)


def gigpo_step_advantages(
    rewards: Tensor,
    mask: Tensor,
    obs_hash: Tensor,
    episode_group: Tensor,
    episode_adv: Tensor,
    gamma: float = 0.95,
    omega: float = 1.0,
    step_baseline: str = "mean",
) -> Tensor:
    """GiGPO advantages ``A[e, t] = A_episode[e] + ω · (R[e, t] − mean_{step group} R)``.

    Layout: padded ``[E, T]`` steps with a validity mask (steps are few per episode, so padding
    is cheap and time order is explicit). Masked steps are skipped by the return recursion and
    get 0. Step groups are keyed by ``(episode_group[e], obs_hash[e, t])`` over valid steps.
    ``step_baseline`` is passed to :func:`group_advantages` (``"mean"`` as in the brief;
    ``"mean_std"`` gives the paper's normalised variant). NaN policy: a non-finite reward makes
    its whole episode's returns NaN, and with them every step group those steps belong to.

    Args:
        rewards: ``[E, T]`` float per-step rewards. mask: ``[E, T]`` bool valid steps.
        obs_hash: ``[E, T]`` integer observation hashes (equal hash = same anchor state).
        episode_group: ``[E]`` integer group id of each episode (e.g. task instance).
        episode_adv: ``[E]`` episode-level advantages (e.g. :func:`group_advantages`).
        gamma: step discount in [0, 1]. omega: weight ω of the step-level term.

    Returns:
        ``[E, T]`` in the dtype of ``rewards``, 0 at masked steps.

    >>> r = torch.tensor([[0.0, 1.0], [0.0, 0.0]]); m = torch.ones(2, 2, dtype=torch.bool)
    >>> h = torch.tensor([[5, 6], [5, 7]]); g = torch.tensor([0, 0])
    >>> gigpo_step_advantages(r, m, h, g, torch.tensor([0.5, -0.5]), gamma=1.0)
    tensor([[ 1.0000,  0.5000],
            [-1.0000, -0.5000]])
    """
    e, t = rewards.shape if rewards.dim() == 2 else (-1, -1)
    shapes = (mask.shape, obs_hash.shape, episode_group.shape, episode_adv.shape)
    if e < 0 or shapes != ((e, t), (e, t), (e,), (e,)):
        raise ValueError(
            "gigpo_step_advantages expects rewards/mask/obs_hash [E, T] and episode_group/"
            f"episode_adv [E]; got {tuple(rewards.shape)}, {tuple(mask.shape)}, "
            f"{tuple(obs_hash.shape)}, {tuple(episode_group.shape)}, {tuple(episode_adv.shape)}"
        )
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gigpo_step_advantages: gamma={gamma} must lie in [0, 1]")
    valid = mask.bool()
    dt = compute_dtype(rewards.dtype)
    ret = masked_reverse_cumsum(rewards.to(dt), valid, gamma)  # [E, T] R_t, 0 where masked
    flat = valid.flatten().nonzero().squeeze(1)  # [S] flat positions of the valid steps
    ep = torch.div(flat, t, rounding_mode="floor")
    step_ids = group_key(
        episode_group.index_select(0, ep), obs_hash.flatten().index_select(0, flat)
    )
    a_step = group_advantages(ret.flatten().index_select(0, flat), step_ids, step_baseline)
    a_step = ret.new_zeros(e * t).index_copy(0, flat, a_step).view(e, t)
    out = episode_adv.to(dt)[:, None] + omega * a_step
    return torch.where(valid, out, torch.zeros((), dtype=dt, device=out.device)).to(rewards.dtype)
