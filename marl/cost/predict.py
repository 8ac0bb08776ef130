"""Predict a team's tokens and cost per episode before running it (``marl cost``).

Measures the fixed text pieces of :mod:`marl.prompts` with the agents' tokenizer and hands
them to the topology-level model in :mod:`orchestration.cost`. Completion sizes are the
task's fixed message lengths for scripted and random policies (so the prediction is exact)
and the policy's ``max_new_tokens`` otherwise (an upper bound). For API policies it is an
estimate: the server bills in its own tokenizer's tokens and wraps chat messages in its
own template, neither of which is ours. For free-form tasks (``Task.messages == "text"``)
:func:`predict_range` gives the exact fixed part (the prompt template, with no private
text and no message) and the range of the whole, from the shortest private texts and
empty messages to the longest private texts and every message at ``max_new_tokens``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, Literal

from marl import prompts
from marl.policies import API_BACKENDS
from marl.team import Team
from marl.tokenizer import CharTokenizer, Tokenizer
from orchestration.cost import CostPrediction, predict

#: Backends whose message lengths are fixed by the task, so token counts are exact.
FIXED_LENGTH_BACKENDS = ("scripted", "random")
#: Backends whose calls run a model: the ledger counts the model's own input ids, which
#: add a BOS token or a chat template around the observation text.
MODEL_BACKENDS = ("tiny", "hf", "vllm")


def _sample(rounds: int, agent: str) -> str:
    """A prompt of ``agent`` of ``rounds`` rounds, each with one message heard and (before
    the last) its own message: what the template wraps, whatever the text."""
    text = prompts.header(agent, "agent", "x", "")
    for r in range(rounds):
        text += (prompts.turn_open(r) + prompts.message_line("b", "y")
                 + prompts.query(agent, False))
        text += "z" if r < rounds - 1 else ""
    return text


@functools.lru_cache(maxsize=64)
def _hf_overhead(path: str, chat: bool, kwargs: str, rounds: int, agent: str) -> int:
    from marl.policies.hf import hf_tokenizer

    tok = hf_tokenizer(path, chat=chat, template_kwargs=json.loads(kwargs))
    sample = _sample(rounds, agent)
    return len(tok.encode_prompt(sample)) - tok.count(sample)


def prompt_overhead(team: Team, agent: str, backend: str | None = None,
                    rounds: int = 1) -> int:
    """Tokens a model policy's input adds around the text of a prompt of ``rounds`` rounds:
    the tiny models' BOS token; an HF tokenizer's BOS or chat template, read from the
    checkpoint's tokenizer files (with ``prompt_format: chat`` it grows with the turns);
    0 for policies without a model (scripted, random) and for API policies (billed in the
    server's tokens)."""
    spec = team.scenario.policies[team.agent(agent).policy]
    kind = backend or spec.backend
    if kind not in MODEL_BACKENDS:
        return 0
    if kind == "tiny":
        tok = CharTokenizer()
        return len(tok.encode_prompt(_sample(rounds, agent))) - tok.count(_sample(rounds, agent))
    return _hf_overhead(str(spec.path), spec.prompt_format == "chat",
                        json.dumps(spec.chat_template_kwargs or {}, sort_keys=True), rounds,
                        agent)


def expected_completion(team: Team, agent: str, rnd: int, backend: str | None = None) -> int:
    """Tokens ``agent`` is expected to write in round ``rnd`` (with ``backend`` overriding
    the scenario's): a codes task's fixed length for scripted and random policies, else
    the token limit."""
    if ((backend or team.backend(agent)) in FIXED_LENGTH_BACKENDS
            and team.task.messages == "codes"):
        return team.task.output_length(agent, team.is_final_call(agent, rnd))
    return team.max_new_tokens(agent)


def predict_team(team: Team, tokenizer: Tokenizer | None = None,
                 completion: Callable[[str, int], int] | None = None,
                 backend: str | None = None,
                 private: Literal["shortest", "longest", "none"] = "longest",
                 model_input: bool = True) -> CostPrediction:
    """Predicted tokens and cost of one episode of ``team`` (every policy's backend replaced
    by ``backend`` when given, as ``marl run --policy`` does), with each agent's
    ``private`` text the shortest or the longest it can get (a codes task's have one
    length), or none. ``model_input``: count what a model policy's model reads (its
    :func:`prompt_overhead` on every prompt), as the ledger does; else the text alone."""
    tok = tokenizer or CharTokenizer()
    extremes = team.task.private_extremes()
    text = {a: "" if private == "none" else extremes[a][private == "longest"] for a in team.ids}
    # The overhead wraps every prompt once; each prompt extends the previous one, so it
    # is counted with the header.
    header = {a.id: tok.count(prompts.header(a.id, a.role, text[a.id],
                                             prompts.one_line(a.prompt)))
              + (prompt_overhead(team, a.id, backend) if model_input else 0)
              for a in team.agents}

    def turn(agent: str, rnd: int) -> int:
        final = team.is_final_call(agent, rnd)
        grown = (prompt_overhead(team, agent, backend, rnd + 1)  # a chat's turns add up
                 - prompt_overhead(team, agent, backend, rnd) if model_input and rnd else 0)
        return tok.count(prompts.turn_open(rnd)) + tok.count(prompts.query(agent, final)) + grown

    def line(src: str, dst: str, n: int) -> int:
        return tok.count(prompts.message_line(src, "x" * n))

    return predict(team.topo, team.rounds, header=header, turn=turn,
                   completion=completion or (
                       lambda a, r: expected_completion(team, a, r, backend)),
                   line=line, prices=team.prices)


def predict_range(team: Team, tokenizer: Tokenizer | None = None,
                  backend: str | None = None) -> dict[str, CostPrediction]:
    """A free-form task's episode: ``fixed`` (the template alone: no private text, no
    message), ``min`` (the shortest private texts, every message empty) and ``max`` (the
    longest private texts, every message at the token limit)."""
    return {"fixed": predict_team(team, tokenizer, lambda a, r: 0, backend, "none"),
            "min": predict_team(team, tokenizer, lambda a, r: 0, backend, "shortest"),
            "max": predict_team(team, tokenizer, None, backend, "longest")}


def prediction_json(team: Team, pred: CostPrediction,
                    backend: str | None = None) -> dict[str, Any]:
    """The prediction in the same keys as ``summary.json`` of ``marl run`` (for a free-form
    task ``pred`` is the upper end, and ``range`` holds the fixed part and both ends)."""
    backends = {backend or team.backend(a) for a in team.ids}
    free = team.task.messages == "text"
    exact = backends <= set(FIXED_LENGTH_BACKENDS) and not free
    api = sorted(backends & set(API_BACKENDS))
    reasons = ([f"{' and '.join(api)} policies are billed in the server's tokens (its "
                "tokenizer and chat template), which our character tokenizer only "
                "approximates"] if api else [])
    reasons += (["free-form messages: the fixed part is exact, the rest anywhere from the "
                 "shortest private texts and empty messages to the longest private texts "
                 "and every message at max_new_tokens (range)"] if free else [])
    ranged = ({"range": {k: {"tokens_per_episode": p.total.as_dict(),
                             "cost_usd_per_episode": float(p.cost)}
                         for k, p in predict_range(team, backend=backend).items()}}
              if free else {})
    return {
        "scenario": team.name,
        "exact": exact,
        "kind": "exact" if exact else "estimate" if reasons else "upper bound",
        **({"estimate_reason": "; ".join(reasons)} if reasons else {}),
        **ranged,
        "tokens_per_episode": pred.total.as_dict(),
        "cost_usd_per_episode": float(pred.cost),
        "cost_usd_per_episode_exact": str(pred.cost),
        "per_agent": {a: {**c.as_dict(), "cost_usd": float(pred.cost_per_agent[a])}
                      for a, c in pred.per_agent.items()},
        "per_edge": {f"{u}->{v}": {"tokens": n, "cost_usd": float(pred.cost_per_edge[(u, v)])}
                     for (u, v), n in pred.per_edge.items()},
        "per_round": {str(r + 1): c.as_dict() for r, c in sorted(pred.per_round.items())},
    }
