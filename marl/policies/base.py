"""The policy interface shared by every backend.

A policy receives a batch of requests (one per acting agent, possibly from many episodes)
and returns one completion per request. Backends without a model (``scripted``,
``random``) return text only; model backends also fill token ids and log-probs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from marl.cost.ledger import Usage
from marl.tokenizer import CharTokenizer, Tokenizer


@dataclass(frozen=True)
class Request:
    """One call: which agent acts, what it observes, and whether it must answer."""

    agent: str
    observation: str
    final: bool = False


@dataclass(frozen=True)
class Completion:
    """The message, and for model backends the generated ids (stop token included), their
    log-probs, why generation ended (``eos``, ``stop`` or ``length``) and the prompt ids.

    Remote backends fill ``usage`` (what the server billed, which the ledger records
    instead of our own token counts) and, for a call that finally failed, ``error`` (the
    reason; ``text`` is then empty): the rollout ends that episode as failed instead of
    stopping the run."""

    text: str
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    finish: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    usage: Usage | None = None
    error: str | None = None


class Policy(ABC):
    """Maps a batch of requests to completions.

    ``tokenizer`` counts the agent's tokens in the ledger, except for calls whose
    completion carries the server's billed ``usage`` (remote APIs); it also sizes
    observations and the cost model's predictions.
    """

    tokenizer: Tokenizer = CharTokenizer()

    @abstractmethod
    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        """One completion per request; ``greedy`` asks for the most likely output."""

    def stats(self) -> dict[str, float]:
        """Engine figures since the last call, for the metrics rows (e.g. how far a separate
        generation engine's log-probs are from the training model's); none by default."""
        return {}

    def reseed(self, seed: int) -> None:  # noqa: B027 - deterministic backends need nothing
        """Restart the policy's sampling randomness from ``seed``."""

    def rollout(self, calls_per_round: int) -> AbstractContextManager[None]:
        """The scope of one rollout, in which the policy is called ``calls_per_round``
        times per round and its parameters do not change: model backends reuse each
        agent's KV cache across its turns within it. Others need nothing."""
        return nullcontext()
