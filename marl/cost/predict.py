"""Predict a team's tokens and cost per episode before running it (``marl cost``).

Measures the fixed text pieces of :mod:`marl.prompts` with the agents' tokenizer and hands
them to the topology-level model in :mod:`orchestration.cost`. Completion sizes are the
task's fixed message lengths for scripted and random policies (so the prediction is exact)
and the policy's ``max_new_tokens`` otherwise (an upper bound). For API policies it is an
estimate: the server bills in its own tokenizer's tokens and wraps chat messages in its
own template, neither of which is ours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from marl import prompts
from marl.policies import API_BACKENDS
from marl.team import Team
from marl.tokenizer import CharTokenizer, Tokenizer
from orchestration.cost import CostPrediction, predict

#: Backends whose message lengths are fixed by the task, so token counts are exact.
FIXED_LENGTH_BACKENDS = ("scripted", "random")


def expected_completion(team: Team, agent: str, rnd: int, backend: str | None = None) -> int:
    """Tokens ``agent`` is expected to write in round ``rnd`` (with ``backend`` overriding
    the scenario's)."""
    if (backend or team.backend(agent)) in FIXED_LENGTH_BACKENDS:
        return team.task.output_length(agent, team.is_final_call(agent, rnd))
    return team.max_new_tokens(agent)


def predict_team(team: Team, tokenizer: Tokenizer | None = None,
                 completion: Callable[[str, int], int] | None = None,
                 backend: str | None = None) -> CostPrediction:
    """Predicted tokens and cost of one episode of ``team`` (every policy's backend replaced
    by ``backend`` when given, as ``marl run --policy`` does)."""
    tok = tokenizer or CharTokenizer()
    # Private texts have a fixed length per agent, so any instance gives the header sizes.
    inst = team.task.sample(np.random.default_rng(0))
    header = {a.id: tok.count(prompts.header(a.id, a.role, inst.private[a.id],
                                             prompts.one_line(a.prompt)))
              for a in team.agents}

    def turn(agent: str, rnd: int) -> int:
        final = team.is_final_call(agent, rnd)
        return tok.count(prompts.turn_open(rnd)) + tok.count(prompts.query(agent, final))

    def line(src: str, dst: str, n: int) -> int:
        return tok.count(prompts.message_line(src, "x" * n))

    return predict(team.topo, team.rounds, header=header, turn=turn,
                   completion=completion or (
                       lambda a, r: expected_completion(team, a, r, backend)),
                   line=line, prices=team.prices)


def prediction_json(team: Team, pred: CostPrediction,
                    backend: str | None = None) -> dict[str, Any]:
    """The prediction in the same keys as ``summary.json`` of ``marl run``."""
    backends = {backend or team.backend(a) for a in team.ids}
    exact = backends <= set(FIXED_LENGTH_BACKENDS)
    api = sorted(backends & set(API_BACKENDS))
    return {
        "scenario": team.name,
        "exact": exact,
        "kind": "exact" if exact else "estimate" if api else "upper bound",
        **({"estimate_reason": f"{' and '.join(api)} policies are billed in the server's "
            "tokens (its tokenizer and chat template), which our character tokenizer only "
            "approximates"} if api else {}),
        "tokens_per_episode": pred.total.as_dict(),
        "cost_usd_per_episode": float(pred.cost),
        "cost_usd_per_episode_exact": str(pred.cost),
        "per_agent": {a: {**c.as_dict(), "cost_usd": float(pred.cost_per_agent[a])}
                      for a, c in pred.per_agent.items()},
        "per_edge": {f"{u}->{v}": {"tokens": n, "cost_usd": float(pred.cost_per_edge[(u, v)])}
                     for (u, v), n in pred.per_edge.items()},
        "per_round": {str(r + 1): c.as_dict() for r, c in sorted(pred.per_round.items())},
    }
