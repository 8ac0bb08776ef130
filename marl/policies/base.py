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
    log-probs, why generation ended (``eos``, ``stop`` or ``length``) and the prompt ids."""

    text: str
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    finish: str | None = None
    prompt_ids: tuple[int, ...] | None = None


class Policy(ABC):
    """Maps a batch of requests to completions.

    ``tokenizer`` counts the agent's tokens in the ledger. Backends that report usage
    themselves (remote APIs) will override how tokens are counted.
    """

    tokenizer: Tokenizer = CharTokenizer()

    @abstractmethod
    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        """One completion per request; ``greedy`` asks for the most likely output."""

    def reseed(self, seed: int) -> None:  # noqa: B027 - deterministic backends need nothing
        """Restart the policy's sampling randomness from ``seed``."""

    def rollout(self, calls_per_round: int) -> AbstractContextManager[None]:
        """The scope of one rollout, in which the policy is called ``calls_per_round``
        times per round and its parameters do not change: model backends reuse each
        agent's KV cache across its turns within it. Others need nothing."""
        return nullcontext()
