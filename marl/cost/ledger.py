"""The token ledger: one row per policy call, exact decimal costs, and aggregates.

Field names follow OpenAI's usage object where one exists (``prompt_tokens``,
``completion_tokens``, ``cached_tokens`` as in ``prompt_tokens_details``). Costs are
``decimal.Decimal`` and serialise as strings, so sums are exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from orchestration.cost import TokenCounts, TokenPrice

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Usage:
    """What one call read and wrote: for an API call, what the server billed (OpenAI's
    ``usage`` object: prompt tokens, the part of them read from its prompt cache,
    ``prompt_tokens_details.cached_tokens``, and completion tokens); for a model policy,
    its model's own input and generated ids (:func:`marl.rollout.model_usage`). A ledger
    row of a call that reports usage takes these numbers instead of counting the text with
    the agent's tokenizer."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    def to_json(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens}


@dataclass(frozen=True)
class LedgerRow:
    """One policy call."""

    episode: int
    round: int
    layer: int
    agent: str
    model: str
    prompt_tokens: int
    cached_tokens: int  # prefix reused from the agent's previous call
    completion_tokens: int
    received: dict[str, int] = field(default_factory=dict)  # in-edge source -> tokens
    cost_usd: Decimal = Decimal(0)

    @property
    def counts(self) -> TokenCounts:
        return TokenCounts(self.prompt_tokens, self.cached_tokens, self.completion_tokens)

    def to_json(self) -> dict[str, Any]:
        return {"episode": self.episode, "round": self.round, "layer": self.layer,
                "agent": self.agent, "model": self.model, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "received": dict(self.received), "cost_usd": str(self.cost_usd)}


def make_row(episode: int, rnd: int, layer: int, agent: str, model: str, price: TokenPrice,
             prompt: int, cached: int, completion: int, received: dict[str, int]) -> LedgerRow:
    """A row with its cost computed from ``price``."""
    cost = price.cost(prompt, cached, completion)
    return LedgerRow(episode, rnd, layer, agent, model, prompt, cached, completion,
                     received, cost)


class Ledger:
    """Rows of many calls, with aggregates per agent, edge, round and episode."""

    def __init__(self, rows: Iterable[LedgerRow] = ()):
        self.rows: list[LedgerRow] = list(rows)

    def add(self, row: LedgerRow) -> None:
        self.rows.append(row)

    def extend(self, rows: Iterable[LedgerRow]) -> None:
        self.rows.extend(rows)

    def group(self, key: Callable[[LedgerRow], Any]) -> dict[Any, TokenCounts]:
        """Token counts summed over rows with the same ``key(row)``."""
        out: dict[Any, TokenCounts] = {}
        for r in self.rows:
            k = key(r)
            out[k] = out.get(k, TokenCounts()) + r.counts
        return out

    def per_agent(self) -> dict[str, TokenCounts]:
        return self.group(lambda r: r.agent)

    def per_round(self) -> dict[int, TokenCounts]:
        return self.group(lambda r: r.round)

    def per_episode(self) -> dict[int, TokenCounts]:
        return self.group(lambda r: r.episode)

    def per_call(self) -> dict[tuple[str, int], TokenCounts]:
        return self.group(lambda r: (r.agent, r.round))

    def per_edge(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for r in self.rows:
            for src, n in r.received.items():
                out[(src, r.agent)] = out.get((src, r.agent), 0) + n
        return out

    def cost_per_agent(self) -> dict[str, Decimal]:
        out: dict[str, Decimal] = {}
        for r in self.rows:
            out[r.agent] = out.get(r.agent, Decimal(0)) + r.cost_usd
        return out

    def cost_per_episode(self) -> dict[int, Decimal]:
        out: dict[int, Decimal] = {}
        for r in self.rows:
            out[r.episode] = out.get(r.episode, Decimal(0)) + r.cost_usd
        return out

    def total(self) -> TokenCounts:
        return sum((r.counts for r in self.rows), TokenCounts())

    def cost(self) -> Decimal:
        return sum((r.cost_usd for r in self.rows), Decimal(0))

    def to_tensors(self, episodes: list[int], rounds: int,
                   agents: list[str]) -> dict[str, torch.Tensor]:
        """Dense ``[episodes, rounds, agents]`` int64 tensors of prompt, cached and
        completion tokens (summed when an agent makes several calls in one round)."""
        import torch

        e_index = {e: i for i, e in enumerate(episodes)}
        a_index = {a: i for i, a in enumerate(agents)}
        cells = [0] * (len(episodes) * rounds * len(agents))
        flat = {k: list(cells) for k in ("prompt", "cached", "completion")}
        for r in self.rows:
            at = (e_index[r.episode] * rounds + r.round) * len(agents) + a_index[r.agent]
            flat["prompt"][at] += r.prompt_tokens
            flat["cached"][at] += r.cached_tokens
            flat["completion"][at] += r.completion_tokens
        shape = (len(episodes), rounds, len(agents))
        return {k: torch.tensor(v, dtype=torch.int64).view(shape) for k, v in flat.items()}


def token_penalty(tokens: int, penalty_per_1k: Decimal) -> float:
    """The reward an episode loses for its tokens: ``penalty_per_1k · tokens / 1000``, with
    tokens its prompt plus completion tokens (the scalar twin of
    :func:`marl.kernels.token_costs`).

    >>> token_penalty(2500, Decimal("0.4"))
    1.0
    """
    return float(penalty_per_1k * Decimal(tokens) / 1000)
