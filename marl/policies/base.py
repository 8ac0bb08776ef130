"""The policy interface shared by every backend.

A policy receives a batch of requests (one per acting agent, possibly from many episodes)
and returns one completion per request. Backends without a model (``scripted``,
``random``) return text only; model backends also fill token ids and log-probs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One call: which agent acts, what it observes, and whether it must answer."""

    agent: str
    observation: str
    final: bool = False


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None


class Policy(ABC):
    """Maps a batch of requests to completions."""

    @abstractmethod
    def generate(self, requests: Sequence[Request]) -> list[Completion]: ...
