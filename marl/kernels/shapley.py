"""Shapley values and difference rewards: per-agent credit from coalition values.

Shapley (1953): ``φ_i = Σ_{S ⊆ N∖{i}} |S|!(n−|S|−1)!/n! · (v(S ∪ {i}) − v(S))``.

Coalition tables are ``[B, 2^N]`` with coalition index ``c`` holding agent ``i`` iff bit ``i``
of ``c`` is set (column 0 is the empty coalition, column 2^N − 1 the grand coalition).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from marl.kernels.scan import compute_dtype

ValueFn = Callable[[Tensor], Tensor]
"""``value_fn(masks [B, P, N] bool) -> values [B, P]``: the value of P coalitions per row."""

MAX_EXACT_AGENTS = 16


@functools.cache
def shapley_weights(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``W [2^n, n]`` with ``φ = v @ W``: ``W[c, i] = w(|c|−1)`` if i ∈ c else ``−w(|c|)``.

    ``w(s) = s!(n−s−1)!/n!`` is the weight of the marginal contribution to a coalition of size
    s; every coalition appears once with + (i joins it) and once with − (i is absent). Built in
    float64 and cached per ``(n, dtype, device)``.
    """
    w = torch.tensor(
        [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)],
        dtype=torch.float64,
    )
    c = torch.arange(2**n)
    member = (c[:, None] >> torch.arange(n)) & 1 == 1  # [2^n, n]
    size = member.sum(1, keepdim=True)  # [2^n, 1]
    plus = w[(size - 1).clamp(min=0)].expand(-1, n)
    minus = -w[size.clamp(max=n - 1)].expand(-1, n)
    return torch.where(member, plus, minus).to(dtype=dtype, device=device)


def shapley_exact(coalition_values: Tensor) -> Tensor:
    """Exact Shapley values from a full coalition table, as one matrix product.

    Args:
        coalition_values: ``[B, 2^N]`` float, ``N ≤ 16`` (use :func:`shapley_mc` beyond).

    Returns:
        ``[B, N]`` in the input dtype (half precision computes in float32). Efficiency holds:
        each row sums to ``v(N) − v(∅)``. Every weight is nonzero, so a NaN/inf anywhere in a
        row makes that whole row non-finite.

    >>> v = torch.tensor([[0.0, 1.0, 2.0, 4.0]])  # v(∅), v({0}), v({1}), v({0, 1})
    >>> shapley_exact(v)
    tensor([[1.5000, 2.5000]])
    """
    if coalition_values.dim() != 2:
        raise ValueError(f"shapley_exact expects [B, 2^N]; got {tuple(coalition_values.shape)}")
    size = coalition_values.shape[1]
    n = size.bit_length() - 1
    if size < 2 or size != 2**n or n > MAX_EXACT_AGENTS:
        raise ValueError(
            f"shapley_exact expects 2^N coalition columns with 1 ≤ N ≤ {MAX_EXACT_AGENTS}; got "
            f"{size}. For more agents use shapley_mc with a value_fn."
        )
    dt = compute_dtype(coalition_values.dtype)
    w = shapley_weights(n, dt, coalition_values.device)
    return (coalition_values.to(dt) @ w).to(coalition_values.dtype)


def coalition_index(masks: Tensor) -> Tensor:
    """``[..., N]`` bool membership → ``[...]`` int64 column of the coalition table."""
    bits = 1 << torch.arange(masks.shape[-1], device=masks.device)
    return (masks.long() * bits).sum(-1)


def random_orders(rows: int, n: int, generator: torch.Generator | None, device) -> Tensor:
    """``[rows, n]`` independent uniform permutations (agent at each position).

    Vectorised Fisher–Yates: n − 1 swap steps over all rows at once, O(rows·n) work, where
    an argsort of random keys costs O(rows·n log n) and is slow on short rows.
    """
    order = torch.arange(n, device=device).repeat(rows, 1)
    for i in range(n - 1, 0, -1):
        j = (torch.rand(rows, 1, generator=generator, device=device) * (i + 1)).long()
        j = j.clamp(max=i)  # float rounding of rand()·(i + 1) can reach i + 1
        at_j = order.gather(1, j)
        order.scatter_(1, j, order[:, i : i + 1].clone())
        order[:, i : i + 1] = at_j
    return order


def _prefix_values(values: Tensor | ValueFn, order: Tensor) -> Tensor:
    """Values of the N + 1 prefixes of each sampled order: ``order [B, p, N]`` → ``[B, p, N+1]``.

    With a table the prefix coalition indices are a cumulative sum of ``2^agent`` in order, so
    no ``[B, p, N+1, N]`` membership masks are built; a value_fn gets those masks.
    """
    b, p, n = order.shape
    if isinstance(values, Tensor):
        idx = torch.nn.functional.pad((1 << order).cumsum(-1), (1, 0))  # [B, p, N+1]
        return values.gather(1, idx.view(b, -1)).view(b, p, n + 1)
    rank = torch.empty_like(order).scatter_(
        -1, order, torch.arange(n, device=order.device).expand_as(order)
    )
    steps = torch.arange(n + 1, device=order.device)[:, None]
    masks = rank[:, :, None, :] < steps  # [B, p, N+1, N]: prefix k holds agents ranked < k
    return values(masks.view(b, p * (n + 1), n)).view(b, p, n + 1)


def shapley_mc(
    values: Tensor | ValueFn,
    n_permutations: int,
    *,
    n_agents: int | None = None,
    batch_size: int | None = None,
    generator: torch.Generator | None = None,
    chunk: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Monte-Carlo Shapley values by random permutations (Castro et al., 2009).

    For each sampled order π, agent i's contribution is ``v(Pre_π(i) ∪ {i}) − v(Pre_π(i))``;
    φ_i is the mean over orders and its standard error is ``std / √P`` (sample std). Each order
    costs N + 1 coalition values per row, so every estimate satisfies efficiency exactly.
    Orders are drawn independently per row.

    Args:
        values: a ``[B, 2^N]`` coalition table (for tests against :func:`shapley_exact`) or a
            :data:`ValueFn` ``masks [B, P, N] bool -> [B, P]`` for N too large for a table.
        n_permutations: P ≥ 2 sampled orders per row.
        n_agents, batch_size: N and B, required with a ``value_fn``.
        generator: torch RNG for reproducible orders (on ``device``).
        chunk: orders evaluated per call of the value_fn; default keeps ``B·chunk·(N+1)·N``
            mask entries near 2^24.
        device: where masks are built for a ``value_fn`` (default: the generator's, else CPU).

    Returns:
        ``(estimate [B, N], standard_error [B, N])`` in float64.
    """
    if isinstance(values, Tensor):
        if values.dim() != 2 or values.shape[1] < 2 or values.shape[1].bit_count() != 1:
            raise ValueError(f"shapley_mc table must be [B, 2^N]; got {tuple(values.shape)}")
        b, n, device = values.shape[0], values.shape[1].bit_length() - 1, values.device
    elif n_agents is None or batch_size is None:
        raise ValueError("shapley_mc with a value_fn needs n_agents and batch_size")
    else:
        b, n = batch_size, n_agents
        device = device or (generator.device if generator is not None else "cpu")
    if n_permutations < 2:
        raise ValueError(f"n_permutations={n_permutations}: need ≥ 2 for a standard error")
    block = max(1, 2**20 // (n_permutations * (n + 1)))
    if isinstance(values, Tensor) and b > block:
        # Row blocks: each block's table rows stay in cache across all of its orders, where
        # chunking orders alone would stream the whole table once per chunk.
        parts = [
            shapley_mc(values[i : i + block], n_permutations, generator=generator, chunk=chunk)
            for i in range(0, b, block)
        ]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    chunk = chunk or max(1, 2**24 // max(1, b * (n + 1) * n))
    count, mean, m2 = 0, torch.zeros(b, n, dtype=torch.float64, device=device), None
    for start in range(0, n_permutations, chunk):
        p = min(chunk, n_permutations - start)
        order = random_orders(b * p, n, generator, device).view(b, p, n)
        v = _prefix_values(values, order).double()
        # The k-th marginal gain belongs to the agent at position k.
        contrib = torch.zeros_like(v[..., 1:]).scatter_(-1, order, v[..., 1:] - v[..., :-1])
        # Chan et al. merge of (count, mean, M2): stable where Σx² − (Σx)²/P would cancel.
        c_mean = contrib.mean(1)
        c_m2 = ((contrib - c_mean[:, None]) ** 2).sum(1)
        delta, total = c_mean - mean, count + p
        mean = mean + delta * (p / total)
        m2 = c_m2 if m2 is None else m2 + c_m2 + delta**2 * (count * p / total)
        count = total
    return mean, (m2 / (count - 1) / count).sqrt()


def difference_rewards(full: Tensor, without: Tensor) -> Tensor:
    """Difference rewards ``D_i = G(z) − G(z_{−i})`` (Wolpert & Tumer, 2002).

    Args:
        full: ``[B]`` team value G(z) with everyone's contribution.
        without: ``[B, N]`` team value with agent i's contribution replaced by a default.

    Returns:
        ``[B, N]``; NaN/inf follow IEEE arithmetic (a NaN ``full`` spoils its row).

    >>> difference_rewards(torch.tensor([3.0]), torch.tensor([[1.0, 3.0]]))
    tensor([[2., 0.]])
    """
    if full.dim() != 1 or without.dim() != 2 or without.shape[0] != full.shape[0]:
        raise ValueError(
            f"difference_rewards expects full [B] and without [B, N]; got "
            f"{tuple(full.shape)} and {tuple(without.shape)}"
        )
    return full[:, None] - without
