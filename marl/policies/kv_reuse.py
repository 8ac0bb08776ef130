"""Reuse of each agent's KV cache across its turns within one rollout.

In a multi-round scenario an agent's prompt is a growing transcript (:mod:`marl.prompts`):
its prompt in round r+1 starts with its round-r prompt and completion. A :class:`KVStore`
keeps the final caches of a policy's last few :func:`~marl.policies.generation.generate`
calls and, per row, the tokens each holds. The next call starts every new prompt from the
stored row that shares its longest prefix and runs the model over the rest only.

Reuse is exact: a token's keys and values depend only on the tokens up to it and on its
position, and both are unchanged. The parameters must be unchanged too, so a store lives
within one rollout (:meth:`marl.policies.lm.LMPolicy.rollout`) and is emptied as soon as any
parameter has changed in place (:meth:`KVStore.sync`).

The same machinery shares work inside one call: prompts that begin with a long common
stem (the G listener prompts of a group differ only in the message they read) run the stem
once, through a one-row store (:func:`stem_length`), instead of once per prompt.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from marl.tokenizer import common_prefix


@dataclass
class Stored:
    """One call's final cache: row i holds the K/V of ``seqs[i]`` in the columns
    ``starts[i] : starts[i] + len(seqs[i])``."""

    cache: Any
    seqs: list[tuple[int, ...]]
    starts: list[int]


@dataclass
class Reuse:
    """Where each row of a new batch finds the K/V of its first ``length[j]`` tokens in
    stored caches. :meth:`take` right-aligns them in ``width`` columns, after zeros."""

    caches: list[Any]
    length: list[int]
    width: int
    #: Per cache: the new rows taken from it ``(n,)``, their rows there ``(n,)``, the
    #: column there of each new column ``(n, width)``, and which new columns are reused.
    index: list[tuple[torch.Tensor, ...]]

    def take(self, sources: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """Write the reused keys (or values) of one layer into the first ``width`` columns
        of ``out (B, H, W, D)``, reading ``sources[s] (B_s, H, W_s, D)``, that layer's
        tensor in ``caches[s]``. Columns before a row's reused tokens become zeros: they
        are masked out, but still enter the attention product (0 * NaN is NaN)."""
        w = self.width
        for old, (at, rows, cols, reused) in zip(sources, self.index, strict=True):
            if not len(at):
                continue
            if old.shape[0] == 1:  # one stored row (a common stem): a broadcast per length
                length = reused.sum(1)
                for m in length.unique().tolist():
                    take = length == m
                    first = int(cols[take][0, -1]) - m + 1  # the row's first reused column
                    src = old[:, :, first : first + m]
                    _put(out[:, :, w - m : w], at[take], src.expand(int(take.sum()), -1, -1, -1))
                continue
            # index_select + gather rather than one advanced index: their backward passes
            # (index_add, scatter_add) are several times faster on CPU when scoring.
            n, h, d = len(at), old.shape[1], old.shape[3]
            picked = old.index_select(0, rows).gather(2, cols[:, None, :, None].expand(n, h, -1, d))
            _put(out[:, :, :w], at, picked.masked_fill(~reused[:, None, :, None], 0))
        return out


def _put(out: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    """``out[rows] = values`` in place (differentiable), a plain copy when ``rows`` are
    all of ``out``'s rows (they are in order: see :func:`_index`)."""
    if len(rows) == out.shape[0]:
        out.copy_(values)
    else:
        out.index_copy_(0, rows, values)


def _index(source: list[int], row: list[int], start: list[int], length: list[int],
           width: int, calls: int, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """:attr:`Reuse.index` of rows taking ``length[j]`` tokens from column ``start[j]`` of
    row ``row[j]`` of call ``source[j]``."""
    col = torch.arange(width)
    index = []
    for c in range(calls):
        at = torch.tensor([j for j, s in enumerate(source) if s == c and length[j] > 0],
                          dtype=torch.long)
        first, n = torch.tensor(start)[at], torch.tensor(length)[at]
        # New column i holds the token at first + n - width + i (right alignment).
        cols = ((first + n - width)[:, None] + col).clamp(min=0)
        reused = col >= (width - n)[:, None]
        index.append(tuple(x.to(device) for x in (at, torch.tensor(row)[at], cols, reused)))
    return index


class KVStore:
    """The caches of a policy's last ``keep`` calls (an agent's previous turn is at most
    that many calls back), valid for one parameter ``version``."""

    def __init__(self, keep: int, version: int):
        self.calls: deque[Stored] = deque(maxlen=keep)
        self.version = version

    def sync(self, version: int) -> None:
        """Drop every stored cache if the parameters changed since: its K/V are stale."""
        if version != self.version:
            self.calls.clear()
            self.version = version

    def add(self, stored: Stored) -> None:
        self.calls.append(stored)

    def plan(self, prompts: Sequence[tuple[int, ...]],
             device: torch.device) -> tuple[Reuse, int] | None:
        """How ``prompts`` reuse the stored caches, and how many positions ``S`` each row
        then runs; None when that saves nothing over a plain prefill.

        Every row runs exactly ``S`` new positions (the longest uncached suffix): a row
        with a shorter suffix recomputes the end of its cached prefix as well, so that the
        batch stays left-padded without holes.

        >>> store = KVStore(keep=1, version=0)
        >>> store.add(Stored(cache=None, seqs=[(1, 2, 3, 4), (1, 5)], starts=[0, 2]))
        >>> reuse, suffix = store.plan([(1, 2, 3, 4, 9), (1, 5, 6, 7)], torch.device("cpu"))
        >>> suffix, reuse.length  # row 2 runs (6, 7); row 1 runs (4, 9), though 4 is stored
        (2, [3, 2])
        """
        if not self.calls:
            return None
        entries = sorted((seq, c, r) for c, call in enumerate(self.calls)
                         for r, seq in enumerate(call.seqs))
        shared = [_longest_prefix(entries, p) for p in prompts]
        # At least the last prompt token runs: its logits start sampling.
        suffix = max(len(p) - min(n, len(p) - 1)
                     for p, (n, _, _) in zip(prompts, shared, strict=True))
        if suffix >= max(map(len, prompts)):
            return None
        length = [max(0, len(p) - suffix) for p in prompts]
        source = [c for _, c, _ in shared]
        row = [r for _, _, r in shared]
        start = [self.calls[c].starts[r] for c, r in zip(source, row, strict=True)]
        width = max(length)
        index = _index(source, row, start, length, width, len(self.calls), device)
        reuse = Reuse([call.cache for call in self.calls], length, width, index)
        return reuse, suffix


def stem_length(prompts: Sequence[tuple[int, ...]], ratio: float = 0.5) -> int:
    """Length of the prefix all ``prompts`` share, when running it once and then every
    prompt's rest (padded to the longest rest, see :meth:`KVStore.plan`) takes at most
    ``ratio`` of the positions that running every prompt whole takes; 0 otherwise.

    >>> stem = (1, 2, 3, 4, 5, 6)
    >>> stem_length([stem + (7, 8), stem + (9, 10), stem + (11,)])  # 6 + 3 * 2 <= 24 / 2
    6
    >>> stem_length([(1, 2, 3), (1, 4, 5)])  # 1 + 2 * 2 positions against 2 * 3 / 2
    0
    """
    if len(prompts) < 2:
        return 0
    first, longest = prompts[0], max(map(len, prompts))
    # At least the last token of every prompt runs: its logits start sampling.
    n = min(min(common_prefix(first, p) for p in prompts[1:]), min(map(len, prompts)) - 1)
    if n <= 0 or n + len(prompts) * (longest - n) > ratio * len(prompts) * longest:
        return 0
    return n


def stem_groups(prompts: Sequence[tuple[int, ...]], most: int = 16) -> list[list[int]]:
    """The prompts' indices split into at most ``most`` groups, each scored on its own
    with its own stem, where that runs fewer positions than one call: a policy shared by
    several agents reads prompts that part early (at the agent's name) and then run long
    stems per agent. A group is split where its prompts part, by the token there, while
    the split saves positions (:func:`positions`). One group: nothing to gain.

    >>> stem = tuple(range(3, 43))
    >>> stem_groups([(1,) + stem + (t,) for t in (7, 8, 9)] + [(2,) + stem + (7,)])
    [[0, 1, 2], [3]]
    >>> stem_groups([(1, 5), (2, 5)])
    [[0, 1]]
    """
    def best(group: list[int], budget: int) -> tuple[int, list[list[int]]]:
        whole = positions([prompts[i] for i in group])
        if budget < 2 or len(group) < 2:
            return whole, [group]
        at = min(common_prefix(prompts[group[0]], prompts[i]) for i in group[1:])
        parts: dict[int | None, list[int]] = {}
        for i in group:
            parts.setdefault(prompts[i][at] if at < len(prompts[i]) else None, []).append(i)
        if not 1 < len(parts) <= budget:  # one part: the prompts are all the same
            return whole, [group]
        total, groups = 0, []
        for k, part in enumerate(parts.values()):
            cost, split = best(part, budget - len(groups) - (len(parts) - 1 - k))
            total += cost
            groups += split
        return (total, groups) if total < whole else (whole, [group])

    return best(list(range(len(prompts))), most)[1]


def positions(prompts: Sequence[tuple[int, ...]]) -> int:
    """Positions the model runs to score ``prompts`` in one call: each distinct prompt
    padded to the longest, less the stem's repeats where a stem pays (:func:`stem_length`).

    >>> positions([(1, 2, 3), (1, 2, 3), (4, 5)])
    6
    """
    distinct = list(dict.fromkeys(prompts))
    longest = max(map(len, distinct))
    stem = stem_length(distinct)
    return stem + len(distinct) * (longest - stem)


def _longest_prefix(entries: list[tuple[tuple[int, ...], int, int]],
                    prompt: tuple[int, ...]) -> tuple[int, int, int]:
    """``(n, call, row)``: the entry ``(seq, call, row)`` whose ``seq`` shares the longest
    prefix with ``prompt``, and that prefix's length. ``entries`` are sorted; the best one
    is a neighbour of the prompt's place among them."""
    at = bisect_left(entries, (prompt,))
    near = entries[max(at - 1, 0): at + 1]
    return max((common_prefix(seq, prompt), c, r) for seq, c, r in near)
