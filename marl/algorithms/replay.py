"""Replay of told answers (``answer_replay``).

With ``answer_feedback: full`` an answer learns from the score of every answer it could have
given, which depends on the episode as played and not on the policy that answered: a told
answer stays a valid example after the update. An iteration holds few distinct instances
(``episodes_per_iter``, each played ``group_size`` times), so an answerer that must fit a
noisy function of what it read jitters around it. As many told answers as the update has,
drawn from those of the last ``answer_replay`` iterations, join its told term, averaged with
the current ones at the same weight: more distinct instances per step at the same step size,
for about the cost of the answers' rows once more. Only the told term sees them; the
sampled policy gradient, KL and entropy stay on-policy.

Each policy keeps its own (:attr:`marl.algorithms.common.Trainable.told`); it is saved
with the learner's state so a resumed run replays what the killed one would have.
"""

from __future__ import annotations

import torch

#: One iteration's told answers of one policy: prompts and completions (token ids, lists),
#: ``support`` ``(S, L', A)`` (alphabet token ids, -1 pads) and ``alternatives`` ``(S, L', A)``
#: (the scores, NaN where none).
Told = dict


def told(alternatives: torch.Tensor | None) -> torch.Tensor:
    """``(S,)``: the rows whose answers had alternatives scored (``alternatives`` ``(S, L',
    A)``, NaN where none)."""
    if alternatives is None:
        return torch.zeros(0, dtype=torch.bool)
    return (~alternatives.isnan()).flatten(1).any(-1)


def told_rows(prompts: list, completions: list, support: torch.Tensor | None,
              alternatives: torch.Tensor | None) -> Told | None:
    """The rows whose answers had alternatives scored, as one buffer entry; None if none."""
    if alternatives is None or support is None:
        return None
    keep = told(alternatives).nonzero().flatten().tolist()
    if not keep:
        return None
    return {"prompts": [list(prompts[i]) for i in keep],
            "completions": [list(completions[i]) for i in keep],
            "support": support[keep].clone(), "alternatives": alternatives[keep].clone()}


def remember(buffer: list[Told], entry: Told | None, iterations: int) -> None:
    """Append this update's entry (an iteration without told answers counts too) and keep
    the last ``iterations``."""
    buffer.append(entry or {})
    del buffer[: max(len(buffer) - iterations, 0)]


def packed(buffer: list[Told], rows: int | None = None,
           generator: torch.Generator | None = None) -> Told | None:
    """The entries of ``buffer`` as one batch (shapes padded with -1 and NaN), or ``rows`` of
    their rows drawn without replacement with ``generator``; None if empty."""
    entries = [e for e in buffer if e]
    if not entries:
        return None
    n = sum(len(e["prompts"]) for e in entries)
    width = max(e["support"].shape[1] for e in entries)
    size = max(e["support"].shape[2] for e in entries)
    support = torch.full((n, width, size), -1, dtype=torch.long)
    alternatives = torch.full((n, width, size), float("nan"))
    row = 0
    for e in entries:
        s, w, a = e["support"].shape
        support[row : row + s, :w, :a] = e["support"]
        alternatives[row : row + s, :w, :a] = e["alternatives"]
        row += s
    pick = list(range(n)) if rows is None or rows >= n else \
        sorted(torch.randperm(n, generator=generator)[:rows].tolist())
    prompts = [p for e in entries for p in e["prompts"]]
    completions = [c for e in entries for c in e["completions"]]
    return {"prompts": [prompts[i] for i in pick], "completions": [completions[i] for i in pick],
            "support": support[pick], "alternatives": alternatives[pick]}
