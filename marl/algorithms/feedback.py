"""Full-information feedback on answers (``answer_feedback: full``).

An answer agent's answer ends the episode, so the reward of every other answer it could
have given is known once the episode is over: the task's score of the team answer with
one position of this agent's answer changed to another symbol of that position's alphabet
(``Task.symbols``), every other position and every other agent's output as played. With
those scores the answer's policy gradient at that position need not be estimated from the
one sampled symbol: it is exact, ``∇ Σ_a π(a)·R(a)``. This is counterfactual credit of the
kind COMA estimates with a critic, here exact, and it is how referential games train their
receivers (EGG): the answerer learns as if told the reward of each answer, while what the
team says to it is still learnt from the sampled team reward. It reads the task's score,
never the oracle, but it is a stronger signal than the reward of the episode played, and
figures that use it say so.
"""

from __future__ import annotations

import torch

from marl.rollout import EpisodeBatch
from marl.team import Team


def alternative_scores(team: Team, batch: EpisodeBatch, rows: list[tuple[int, int]],
                       support: torch.Tensor) -> torch.Tensor:
    """``(S, L', A)``: for each row ``(episode b, call slot k)`` that is a well-formed answer
    (every token one symbol of its position's alphabet, ``support`` ``(S, L', A)`` holding
    the alphabets' token ids, -1 pads), the team's score had position ``j`` of the answer
    been symbol ``a`` of its alphabet; NaN elsewhere (other calls, pads, ill-formed answers,
    failed episodes), where the sampled policy gradient applies as usual."""
    out = torch.full(support.shape, float("nan"))
    for i, (b, k) in enumerate(rows):
        agent = batch.agents[int(batch.call_agent[k])]
        if not team.is_final_call(agent, int(batch.call_round[k])) or not batch.instances:
            continue
        record = batch.records[b]
        symbols = team.task.symbols(agent, True)
        if "error" in record or symbols is None:
            continue
        side = team.side_of(agent)
        answers = list(record["sides"][side]["answers"] if team.competitive
                       else record["answers"])
        voter = team.side_answers[side].index(agent)
        text = answers[voter]
        tokens = batch.tokens[b, k].tolist()
        if len(text) != len(symbols) or any(
                c not in alphabet or tokens[j] != int(support[i, j, alphabet.index(c)])
                for j, (c, alphabet) in enumerate(zip(text, symbols, strict=True))):
            continue  # not one token per symbol of the alphabets: no alternatives to score
        scores: dict[str, float] = {}  # team answer -> score (alternatives often coincide)
        for j, alphabet in enumerate(symbols):
            for a, c in enumerate(alphabet):
                answers[voter] = text[:j] + c + text[j + 1:]
                key = team.task.team_answer(answers)
                if key not in scores:
                    scores[key] = _score(team, batch, b, side, key)
                out[i, j, a] = scores[key]
        answers[voter] = text
    return out


def _score(team: Team, batch: EpisodeBatch, b: int, side: str, answer: str) -> float:
    """The score of ``side`` in episode ``b`` had it answered ``answer`` (the other sides'
    answers as played), as the environment scores it."""
    task, instance = team.task, batch.instances[b]
    if not team.competitive:
        return float(task.verdict(instance, answer).score)
    answers = {s: v["answer"] for s, v in batch.records[b]["sides"].items()}
    answers[side] = answer
    return float(task.score_sides(instance, answers)[side])


def expected_answer_loss(symbols: torch.Tensor, ids: torch.Tensor,
                         alternatives: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy-gradient loss ``(S, L)`` at answer positions with scored alternatives,
    ``−Σ_a π(a)·(R(a) − R̄)`` with ``R̄`` the alphabet-renormalised mean (no gradient), and
    where it applies ``(S, L)``. ``symbols`` ``(S, L, A)`` are the log-probs of each
    position's alphabet (``ids`` its token ids, -1 pads), ``alternatives`` ``(S, L', A)``
    the scores of :func:`alternative_scores`. Its gradient is the exact gradient of the
    expected score over the alphabet, so it moves probability between symbols and leaves
    the share of ill-formed tokens to the sampled term of rows that gave one.

    >>> lp = torch.log(torch.tensor([[[0.5, 0.5]]])).requires_grad_()
    >>> loss, where = expected_answer_loss(lp, torch.tensor([[[3, 4]]]),
    ...                                    torch.tensor([[[1.0, 0.0]]]))
    >>> loss.sum().backward(); lp.grad  # up for the symbol that scores, down for the other
    tensor([[[-0.2500,  0.2500]]])
    """
    n = symbols.shape[1]
    alt = torch.full(symbols.shape, float("nan"), device=symbols.device)
    width, a = min(n, alternatives.shape[1]), min(symbols.shape[2], alternatives.shape[2])
    alt[:, :width, :a] = alternatives[:, :width, :a].to(symbols.device)
    valid = (ids >= 0) & ~alt.isnan()
    where = valid.any(-1)
    p = symbols.exp().masked_fill(~valid, 0.0)
    r = alt.nan_to_num(0.0)
    with torch.no_grad():
        mean = (p * r).sum(-1, keepdim=True) / p.sum(-1, keepdim=True).clamp(min=1e-12)
    loss = -(p * (r - mean)).sum(-1)
    return loss.masked_fill(~where, 0.0), where
