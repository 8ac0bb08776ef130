"""Full-information feedback on answers (``answer_feedback: full``).

An answer agent's answer ends the episode, so the reward of every other answer it could
have given is known once the episode is over: the task's score of the team answer with
one position of this agent's answer changed to another symbol of that position's alphabet
(``Task.symbols``), every other agent's output as played, and the answer's other positions
set to their best (as played where an answer has too many strings to score them all). With
those scores the answer need not learn from the one symbol it sampled: this is
counterfactual credit of the kind COMA estimates with a critic, here exact. The answer
maximises the log of its expected score over the alternatives (:func:`answer_loss`):
where one answer scores, that is the cross-entropy of the answer that scores, which is how
referential games train their receivers (EGG, FIELD-NOTES), while what the team says to
the answerer is still learnt from the sampled team reward. The KL term then holds such an
answer to its format only (:func:`marl.policies.generation.lumped_kl`): an anchor to the
warm-up's symbols would pull against the scores wherever the right answer scores only a
little above the rest (noisy labels). It reads the task's score, never the oracle, but it
tells the answerer which answer was right, a stronger signal than the reward of the
episode played, so figures that use it say so.
"""

from __future__ import annotations

import itertools
import math

import torch

from marl.algorithms.config import TrainConfig
from marl.rollout import EpisodeBatch
from marl.team import Team

#: Answers with at most this many possible symbol strings have every string scored.
JOINT = 4096


def alternative_scores(team: Team, batch: EpisodeBatch, rows: list[tuple[int, int]],
                       support: torch.Tensor) -> torch.Tensor:
    """``(S, L', A)``: for each row ``(episode b, call slot k)`` that is a well-formed answer
    (every token one symbol of its position's alphabet, ``support`` ``(S, L', A)`` holding
    the alphabets' token ids, -1 pads), the team's score had position ``j`` of the answer
    been symbol ``a`` of its alphabet; NaN elsewhere (other calls, pads, ill-formed answers,
    failed episodes), where the sampled policy gradient applies as usual. For an answer of
    several positions with at most :data:`JOINT` possible strings, every string is scored
    and a symbol gets the best score of those it is part of (where only the whole answer
    scores, each position is told its right symbol whatever the others said); beyond that,
    the other positions stay as played."""
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
        for j, best in enumerate(_alternatives(team, batch, b, side, answers, voter, symbols)):
            out[i, j, : len(best)] = torch.tensor(best)
    return out


def _alternatives(team: Team, batch: EpisodeBatch, b: int, side: str, answers: list[str],
                  voter: int, symbols: tuple[str, ...]) -> list[list[float]]:
    """Per position of ``side``'s answer ``answers[voter]`` in episode ``b``, the score of
    each symbol of its alphabet (see :func:`alternative_scores`), each team answer scored
    once (alternatives often coincide)."""
    text, scores = answers[voter], {}
    said = list(answers)

    def score(answer: str) -> float:
        said[voter] = answer
        key = team.task.team_answer(said)
        if key not in scores:
            scores[key] = _score(team, batch, b, side, key)
        return scores[key]

    if len(symbols) > 1 and math.prod(map(len, symbols)) <= JOINT:
        best = [[-math.inf] * len(alphabet) for alphabet in symbols]
        for combo in itertools.product(*(range(len(alphabet)) for alphabet in symbols)):
            got = score("".join(alphabet[a] for alphabet, a in zip(symbols, combo, strict=True)))
            for j, a in enumerate(combo):
                best[j][a] = max(best[j][a], got)
        return best
    return [[score(text[:j] + c + text[j + 1:]) for c in alphabet]
            for j, alphabet in enumerate(symbols)]


def _score(team: Team, batch: EpisodeBatch, b: int, side: str, answer: str) -> float:
    """The score of ``side`` in episode ``b`` had it answered ``answer`` (the other sides'
    answers as played), as the environment scores it."""
    task, instance = team.task, batch.instances[b]
    if not team.competitive:
        return float(task.verdict(instance, answer).score)
    answers = {s: v["answer"] for s, v in batch.records[b]["sides"].items()}
    answers[side] = answer
    return float(task.score_sides(instance, answers)[side])


def answer_loss(symbols: torch.Tensor, ids: torch.Tensor,
                alternatives: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss ``(S, L)`` at answer positions whose alternatives were scored, and where it
    applies ``(S, L)``: ``−log Σ_a π̃(a)·(R(a) − min R)``, π̃ the policy renormalised over
    the position's alphabet and ``R`` the alternatives' scores; 0 where every alternative
    scores the same (nothing to learn there). Where one answer scores and the rest do not,
    it is the cross-entropy of that answer, as referential games train their receivers;
    where several score, the answer learns their share of its probability. ``symbols``
    ``(S, L, A)`` are the log-probs of each position's alphabet (``ids`` its token ids, -1
    pads), ``alternatives`` ``(S, L', A)`` the scores of :func:`alternative_scores`.

    >>> lp = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    >>> loss, where = answer_loss(lp, torch.tensor([[[3, 4, 5]]]),
    ...                           torch.tensor([[[1.0, 0.0, 1.0]]]))
    >>> round(float(loss), 3)  # -log(0.75)
    0.288
    """
    n = symbols.shape[1]
    if not symbols.shape[2]:  # no row has an alphabet
        return symbols.new_zeros(symbols.shape[:2]), symbols.new_zeros(symbols.shape[:2],
                                                                        dtype=torch.bool)
    alt = torch.full(symbols.shape, float("nan"), device=symbols.device)
    width, a = min(n, alternatives.shape[1]), min(symbols.shape[2], alternatives.shape[2])
    alt[:, :width, :a] = alternatives[:, :width, :a].to(symbols.device)
    valid = (ids >= 0) & ~alt.isnan()
    low = alt.masked_fill(~valid, float("inf")).amin(-1, keepdim=True)
    gain = (alt - low).masked_fill(~valid, 0.0)  # each alternative's score above the worst
    where = valid.any(-1) & (gain.amax(-1) > 0)
    # Finite stand-ins (-1e4) where a symbol is absent keep every gradient finite.
    use = where[..., None] & valid
    logp = symbols.masked_fill(~use, -1e4)
    logp = logp - torch.logsumexp(logp, -1, keepdim=True)  # renormalised over the alphabet
    scoring = use & (gain > 0)
    log_gain = gain.masked_fill(~scoring, 1.0).log().masked_fill(~scoring, -1e4)
    loss = -torch.logsumexp(logp + log_gain, -1).masked_fill(~where, 0.0)
    return loss, where


def kl_lumping(cfg: TrainConfig, answer: torch.Tensor | None) -> bool | torch.Tensor:
    """The rows whose KL counts each position's alphabet as one outcome: the answers, where
    ``answer_feedback: full`` tells them which symbol scores (``answer``: the rows' answer
    mask); none otherwise."""
    return answer if cfg.answer_feedback == "full" and answer is not None else False
