"""Masked reverse scans shared by GAE and GiGPO step returns.

Both need ``y_t = x_t + c · y_{t+1}`` running backwards over the *valid* positions of each row,
where a masked position is skipped (the next valid position is the "next step"). We pack each
row's valid entries to the left, solve the constant-coefficient recurrence with two small
matrix products instead of a Python loop over time, and gather the result back.

Departure from the textbook loop: a row that contains any NaN/±inf among its valid inputs comes
back all-NaN (the matrix products would smear it across a chunk anyway, and a partly-finite row
would be silently wrong); masked positions are never read.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, every other float type computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunking(t: int) -> tuple[int, int]:
    """Chunk length L ≈ √T and chunk count K with K·L ≥ T (both ≥ 1)."""
    size = math.isqrt(max(t, 1) - 1) + 1
    return size, -(-max(t, 1) // size)


class Packing:
    """Where each valid entry of a ``[B, T]`` mask goes when rows are packed to the left.

    The packed width W = K·L ≥ T + 1 is already a whole number of scan chunks, and its last
    column is a dump slot: masked entries are written there and it is zeroed, so NaN padding
    is never read and no extra padding copy is needed.
    """

    def __init__(self, mask: Tensor) -> None:
        b, t = mask.shape
        self.mask = mask
        self.size, self.n_chunks = chunking(t + 1)
        self.width = self.size * self.n_chunks
        self.slot = torch.where(mask, mask.cumsum(1) - 1, self.width - 1)  # [B, T]

    def pack(self, x: Tensor) -> Tensor:
        """``[B, T]`` → ``[B, W]``: valid entries left-aligned, zeros after (dump included)."""
        # In-place scatter into fresh zeros: out-of-place would clone the zeros first.
        out = x.new_zeros(x.shape[0], self.width).scatter_(1, self.slot, x)
        out[:, -1] = 0
        return out

    def unpack(self, packed: Tensor) -> Tensor:
        """``[B, W]`` → ``[B, T]``; masked positions read the dump column, which must be 0."""
        return packed.gather(1, self.slot)


def _decay_matrix(size: int, c: float, stride: int, dtype: torch.dtype, device) -> Tensor:
    """``M[k, t] = c^(stride·(k−t))`` for ``k ≥ t`` else 0.

    With stride 1, ``(x @ M)[t] = Σ_{k≥t} c^(k−t)·x_k`` over one chunk.
    """
    k = torch.arange(size, device=device, dtype=torch.float64)
    gap = k[:, None] - k[None, :]
    # Only non-negative exponents are formed, so c in [0, 1] never overflows; c^0 = 1 even for 0.
    decay = torch.tensor(c, dtype=torch.float64, device=device) ** (stride * gap.clamp(min=0))
    return torch.where(gap >= 0, decay, 0).to(dtype)


def scan_packed(x: Tensor, c: float, size: int, n_chunks: int) -> Tensor:
    """Reverse discounted sum of a packed ``x [B, K·L]`` whose last column is padding.

    Returns ``[B, K·L]`` with the last column set to 0 (the dump slot :class:`Packing` reads
    for masked positions); a row with a non-finite entry is NaN elsewhere.
    """
    b = x.shape[0]
    xc = x.view(b, n_chunks, size)
    local = xc @ _decay_matrix(size, c, 1, x.dtype, x.device)  # [B, K, L] within-chunk sums
    head = local[..., 0] @ _decay_matrix(n_chunks, c, size, x.dtype, x.device)  # [B, K]
    carry = torch.nn.functional.pad(head[:, 1:], (0, 1))  # what chunk j inherits from j+1
    # Position t of a chunk is L − t steps before the next chunk's head.
    tail = torch.tensor(c, dtype=torch.float64) ** torch.arange(size, 0, -1, dtype=torch.float64)
    # A row sum is non-finite iff the row holds a NaN/inf (or overflows); s − s is then NaN,
    # else 0. Added to the [B, K] carry it poisons the whole row (NaN·c^k is NaN even for c=0).
    total = x.sum(1, keepdim=True)
    carry = carry + (total - total)
    y = local + carry[..., None] * tail.to(dtype=x.dtype, device=x.device)
    y = y.view(b, -1)
    y[:, -1] = 0  # the dump/padding column of a packed row, read by masked positions
    return y


def discounted_reverse_cumsum(x: Tensor, c: float) -> Tensor:
    """``y_t = Σ_{k≥t} c^(k−t) · x_k`` along the last dim of ``x [B, T]`` (no masking).

    Time is cut into K chunks of L ≈ √T: one ``[L, L]`` product solves inside chunks, one
    ``[K, K]`` product carries each chunk's head into the chunks before it. Cost O(B·T·√T)
    flops, no Python loop over T, no negative powers of c (stable for any c in [0, 1]).
    A row with any non-finite entry returns all-NaN.

    >>> discounted_reverse_cumsum(torch.tensor([[1.0, 1.0, 1.0]]), 0.5)
    tensor([[1.7500, 1.5000, 1.0000]])
    """
    b, t = x.shape
    if t == 0 or b == 0:
        return x.clone()
    size, n_chunks = chunking(t + 1)  # one spare column: scan_packed zeroes the last one
    xp = torch.nn.functional.pad(x, (0, size * n_chunks - t))
    return scan_packed(xp, c, size, n_chunks)[:, :t]


def masked_reverse_cumsum(x: Tensor, mask: Tensor, c: float) -> Tensor:
    """:func:`discounted_reverse_cumsum` over the valid positions of each row only.

    Args:
        x: ``[B, T]`` float. mask: ``[B, T]`` bool. c: decay in [0, 1].

    Returns:
        ``[B, T]``: ``y_t = x_t + c·y_{next valid}`` at valid t, 0 at masked t.

    >>> x = torch.tensor([[1.0, 9.0, 1.0]]); m = torch.tensor([[True, False, True]])
    >>> masked_reverse_cumsum(x, m, 0.5)
    tensor([[1.5000, 0.0000, 1.0000]])
    """
    pk = Packing(mask)
    return pk.unpack(scan_packed(pk.pack(x), c, pk.size, pk.n_chunks))
