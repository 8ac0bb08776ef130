"""The task's alphabets in the loss: which calls' alphabets a run needs, as token ids
(``signal_entropy``: every call's; ``answer_floor``, ``answer_feedback``: the answers'),
checked before training, and the terms of the answer floor and the positive-signalling
bonus (see :mod:`marl.algorithms.common` for the whole loss)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal

import torch

from marl.algorithms.config import TrainConfig
from marl.errors import MarlError
from marl.team import Team

if TYPE_CHECKING:
    from marl.algorithms.common import Trainable


def support_kind(cfg: TrainConfig) -> Literal["all", "answers"] | None:
    """Which rows' alphabets the loss needs: every row's (``signal_entropy``), the answers'
    (``answer_floor``, ``answer_feedback: full``) or none."""
    if cfg.signal_entropy > 0:
        return "all"
    return "answers" if cfg.answer_floor > 0 or cfg.answer_feedback == "full" else None


def check_alphabets(ts: list[Trainable], teams: list[Team], cfg: TrainConfig,
                    log: Callable[[str], None]) -> set[str]:
    """Before training: ``signal_entropy`` needs every call's alphabet as tokens (an error
    naming the fix otherwise); ``answer_floor`` and ``answer_feedback: full`` skip answers
    without one (``log`` says so, once per agent). ``teams``: the run's curriculum stages.
    Returns the trained answer agents whose answers have their alphabet as tokens in some
    stage: those the answer terms reach."""
    kind = support_kind(cfg)
    if kind is None:
        return set()
    skipped: dict[str, str] = {}
    reached: set[str] = set()
    for t, stage in itertools.product(ts, teams):
        for agent in t.agents:
            for final in {stage.is_final_call(agent, r) for r in range(stage.rounds)}:
                if kind == "answers" and not final:
                    continue
                try:
                    symbol_ids(t, stage, agent, final)
                except MarlError as e:
                    if kind == "all":
                        raise MarlError(
                            "signal_entropy needs every symbol of every message as one "
                            f"token, but {e}; set signal_entropy: 0.") from None
                    skipped.setdefault(agent, str(e))
                    continue
                if final:
                    reached.add(agent)
    terms = [t for t, on in (("answer_floor", cfg.answer_floor > 0),
                             ("answer_feedback: full", cfg.answer_feedback == "full")) if on]
    for agent, why in skipped.items():
        log(f"{' and '.join(terms)} {'do' if len(terms) > 1 else 'does'} not apply to "
            f"{agent}'s answers: {why}.")
    return reached


def symbol_ids(t: Trainable, team: Team, agent: str, final: bool) -> list[list[int]]:
    """The task's alphabet at each position of ``agent``'s message (answer when ``final``)
    as token ids of ``t``'s tokenizer, one token per symbol (as ``signal_entropy`` and
    ``answer_floor`` need); a :class:`MarlError` saying why where there is none."""
    what = "answers" if final else "messages"
    symbols = team.task.symbols(agent, final)
    if symbols is None:
        raise MarlError(f"task {team.task.id} names no alphabet for {agent}'s {what} "
                        "(Task.symbols returns None)")
    out = []
    for alphabet in symbols:
        ids = [t.policy.tokenizer.encode(c) for c in alphabet]
        if any(len(i) != 1 for i in ids):
            bad = next(c for c, i in zip(alphabet, ids, strict=True) if len(i) != 1)
            raise MarlError(f"policy {t.name}'s tokenizer splits {bad!r} of "
                            f"{team.task.id}'s alphabet into several tokens")
        out.append([i[0] for i in ids])
    return out


def alphabet(t: Trainable, team: Team, call: tuple[str, bool],
              support: Literal["all", "answers"]) -> list[list[int]]:
    """A call's alphabets for ``support``: every call's (``signal_entropy``, which the trainer
    checked could be had), or an answer's where the task and tokenizer give one."""
    if support == "all":
        return symbol_ids(t, team, *call)
    try:
        return symbol_ids(t, team, *call) if call[1] else []
    except MarlError:  # the answer terms skip such answers; the trainer said so at start
        return []


def pad_ids(rows: list[list[list[int]]]) -> torch.Tensor:
    """Ragged ``[row][position][id]`` lists as a ``(S, L, A)`` tensor padded with -1."""
    n = max((len(r) for r in rows), default=0)
    a = max((len(p) for r in rows for p in r), default=0)
    out = torch.full((len(rows), n, a), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        for j, p in enumerate(r):
            out[i, j, : len(p)] = torch.tensor(p, dtype=torch.long)
    return out


def symbol_groups(symbols: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                  by: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
    """The log-probs ``(n, |S|)`` of each group of ``rows`` ``(S, L)`` that share a position
    and an alphabet (and a value of ``by`` ``(S,)``, e.g. the row's agent): ``symbols``
    ``(S, L, A)`` is each token's log-prob of each symbol of its alphabet, ``ids``
    ``(S, L, A)`` the alphabets' token ids (-1 pads, dropped)."""
    for t in range(symbols.shape[1]):
        at = rows[:, t]
        if not at.any():
            continue
        key = ids[at, t] if by is None else torch.cat([by[at, None], ids[at, t]], 1)
        keys, group = torch.unique(key, dim=0, return_inverse=True)
        lp = symbols[at, t]
        for g, k in enumerate(keys):
            yield lp[group == g][:, k[-ids.shape[2]:] >= 0]  # the alphabet, not its pads


def answer_floor_gap(symbols: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                     floor: float) -> tuple[torch.Tensor, float]:
    """How far the batch's answers fall short of giving each symbol ``floor`` times its
    share: the mean over answer positions (grouped by position and alphabet, weighted by
    their count) of ``mean_s min(log π̄(s) − log(floor/|S|), 0)``, where π̄ averages
    ``symbols.exp()`` ``(S, L, A)`` over a group's rows; ``ids`` ``(S, L, A)`` holds the
    alphabets' token ids (-1 pads) and ``rows`` ``(S, L)`` the answer tokens. Also the
    share of (group, symbol) pairs below the floor.

    >>> lp = torch.log(torch.tensor([[[0.5, 0.5, 1e-6]], [[0.7, 0.3, 1e-6]]]))
    >>> gap, rare = answer_floor_gap(lp, torch.tensor([[[4, 5, 6]]] * 2),
    ...                              torch.ones(2, 1, dtype=torch.bool), 0.3)
    >>> rare  # symbol 6 is never answered; the others are, more than 0.3/3 of the time
    0.3333333333333333
    """
    total = symbols.new_zeros(())
    count, below, pairs = 0, 0, 0
    for members in symbol_groups(symbols, ids, rows):
        mean = torch.logsumexp(members, 0) - math.log(len(members))
        short = (mean - math.log(floor / members.shape[1])).clamp(max=0)
        total = total + len(members) * short.mean()
        count += len(members)
        below += int((short < 0).sum())
        pairs += members.shape[1]
    return total / max(count, 1), below / max(pairs, 1)


def signal_entropy(symbols: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                   agent: torch.Tensor) -> torch.Tensor:
    """The mean entropy (nats) of each agent's symbol distribution averaged over its calls:
    for every (agent, position, alphabet) group of ``rows`` (see :func:`symbol_groups`),
    π̄ is the mean of the group's ``symbols.exp()`` and its entropy over the alphabet is
    weighted by the group's size. ``agent`` ``(S,)`` is each row's agent. Highest when an
    agent says each symbol equally often across its inputs, whatever it says for any one.

    >>> lp = torch.log(torch.tensor([[[1.0, 1e-9]], [[1e-9, 1.0]], [[1.0, 1e-9]]]))
    >>> ids, rows = torch.tensor([[[4, 5]]] * 3), torch.ones(3, 1, dtype=torch.bool)
    >>> round(float(signal_entropy(lp, ids, rows, torch.tensor([0, 0, 1]))), 3)  # ln 2 · 2/3
    0.462
    """
    total = symbols.new_zeros(())
    count = 0
    for members in symbol_groups(symbols, ids, rows, by=agent):
        mean = torch.logsumexp(members, 0) - math.log(len(members))  # log π̄
        total = total - len(members) * (mean.exp() * mean).sum()
        count += len(members)
    return total / max(count, 1)
