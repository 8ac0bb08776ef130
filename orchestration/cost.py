"""Analytic token and cost model of one episode, from the topology and the schedule.

An agent's prompt grows across rounds: round 0 starts from its header; every later prompt
is the previous prompt, the agent's own previous completion, then the new text of this
turn (a round marker, one line per message read, the query). So, per agent ``a`` and
round ``r`` (AgentPrune-style ``rounds · (tokens_per_edge · edges + query_tokens · agents)``,
refined per call)::

    new(a, r)    = (header(a) if r == 0 else completion(a, r-1)) + turn(a, r)
                   + sum over messages (u, r_u) read: line(u, a, completion(u, r_u))
    prompt(a, r) = prompt(a, r-1) + new(a, r)
    cached(a, r) = prompt(a, r-1) + completion(a, r-1)   (the whole previous call is reused)

Sizes are passed in as functions measured by the caller's tokenizer, so this module knows
nothing about text or models. The prediction is exact for tokenizers whose counts add up
over concatenation (the built-in character tokenizer); for others it is an estimate.

Cost = Σ (prompt − cached)·p_in + cached·p_cache + completion·p_out, in exact decimals. The
cost of an edge is what its tokens cost the reader when they first arrive (uncached input).

>>> import networkx as nx
>>> from orchestration.compile import compile_topology
>>> topo = compile_topology(nx.DiGraph([("a", "b", {"delay": 0})]))
>>> p = predict(topo, 1, header={"a": 10, "b": 10}, turn=lambda a, r: 2,
...             completion=lambda a, r: 3, line=lambda u, v, n: n + 3)
>>> p.per_agent["b"], p.per_edge[("a", "b")]
(TokenCounts(prompt=18, cached=0, completion=3), 6)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import NamedTuple

from orchestration.compile import CompiledTopology


class TokenPrice(NamedTuple):
    """USD per single token, in the LiteLLM price table's sense."""

    input: Decimal = Decimal(0)
    cache_read: Decimal = Decimal(0)
    output: Decimal = Decimal(0)

    def cost(self, prompt: int, cached: int, completion: int) -> Decimal:
        return (prompt - cached) * self.input + cached * self.cache_read + completion * self.output


class TokenCounts(NamedTuple):
    prompt: int = 0
    cached: int = 0
    completion: int = 0

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    def __add__(self, other: TokenCounts) -> TokenCounts:  # type: ignore[override]
        return TokenCounts(*(a + b for a, b in zip(self, other, strict=True)))

    def as_dict(self) -> dict[str, int]:
        return {"prompt": self.prompt, "cached": self.cached, "completion": self.completion,
                "total": self.total}


@dataclass
class CostPrediction:
    """Predicted tokens (and cost) of one episode."""

    per_call: dict[tuple[str, int], TokenCounts] = field(default_factory=dict)
    per_edge: dict[tuple[str, str], int] = field(default_factory=dict)
    cost_per_agent: dict[str, Decimal] = field(default_factory=dict)
    cost_per_edge: dict[tuple[str, str], Decimal] = field(default_factory=dict)

    @property
    def per_agent(self) -> dict[str, TokenCounts]:
        out: dict[str, TokenCounts] = {}
        for (a, _), c in self.per_call.items():
            out[a] = out.get(a, TokenCounts()) + c
        return out

    @property
    def per_round(self) -> dict[int, TokenCounts]:
        out: dict[int, TokenCounts] = {}
        for (_, r), c in self.per_call.items():
            out[r] = out.get(r, TokenCounts()) + c
        return out

    @property
    def total(self) -> TokenCounts:
        return sum(self.per_call.values(), TokenCounts())

    @property
    def cost(self) -> Decimal:
        return sum(self.cost_per_agent.values(), Decimal(0))


def predict(
    topo: CompiledTopology,
    rounds: int,
    *,
    header: Mapping[str, int],
    turn: Callable[[str, int], int],
    completion: Callable[[str, int], int],
    line: Callable[[str, str, int], int],
    prices: Mapping[str, TokenPrice] | None = None,
) -> CostPrediction:
    """Predict every call's tokens for ``rounds`` rounds of ``topo``.

    ``header(a)``: tokens of agent a's fixed header; ``turn(a, r)``: tokens of the fixed
    text opening a's turn in round r (marker and query); ``completion(a, r)``: tokens a
    writes in round r; ``line(u, v, n)``: tokens a message of n tokens from u adds to v's
    prompt. ``prices`` maps agents to :class:`TokenPrice` (free when missing).
    """
    prices = prices or {}
    pred = CostPrediction()
    prev_prompt = dict.fromkeys(topo.agents, 0)
    for rnd in range(rounds):
        for layer in topo.layers:
            for a in layer:
                new = header[a] if rnd == 0 else completion(a, rnd - 1)
                new += turn(a, rnd)
                cached = 0 if rnd == 0 else prev_prompt[a] + completion(a, rnd - 1)
                price = prices.get(a, TokenPrice())
                for src, src_round in topo.inbox(a, rnd):
                    n = line(src, a, completion(src, src_round))
                    new += n
                    pred.per_edge[(src, a)] = pred.per_edge.get((src, a), 0) + n
                    pred.cost_per_edge[(src, a)] = (
                        pred.cost_per_edge.get((src, a), Decimal(0)) + n * price.input
                    )
                prompt = prev_prompt[a] + new
                counts = TokenCounts(prompt, cached, completion(a, rnd))
                pred.per_call[(a, rnd)] = counts
                pred.cost_per_agent[a] = pred.cost_per_agent.get(a, Decimal(0)) + price.cost(
                    *counts
                )
                prev_prompt[a] = prompt
    for src, dst, _ in topo.edges():
        pred.per_edge.setdefault((src, dst), 0)
        pred.cost_per_edge.setdefault((src, dst), Decimal(0))
    return pred
