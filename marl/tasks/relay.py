"""relay_v0: carry a fact across several hops.

Agents
    One *source* agent (``params.source``, default: the first agent that is not an answer
    agent) knows a fact; the answer agents must state it. Everyone else relays.
Private information
    The source sees ``fact: kqzw``; everyone else ``fact: ????``.
Messages
    ``fact_length`` lowercase letters: the fact if known, otherwise ``?`` marks.
Answer
    The fact.
Reward
    1 if the team states the fact exactly, else 0 (chance: 26^-fact_length).
Oracle
    Send the fact as soon as it is known (own or read); answer it.

Version history
    v0: initial version.
"""

from __future__ import annotations

import string

import numpy as np
from pydantic import Field

from marl.errors import Problem
from marl.tasks.base import Instance, Task, TaskParams, first_heard, is_code, private_text

LETTERS = string.ascii_lowercase


class RelayParams(TaskParams):
    fact_length: int = Field(4, ge=1, le=16, description="Letters in the fact.")
    source: str | None = Field(None, description="Agent that knows the fact.")


class Relay(Task):
    id = "relay_v0"
    Params = RelayParams
    params: RelayParams

    @property
    def source(self) -> str:
        return self.role_agent(self.params.source)

    def check(self) -> list[Problem]:
        return self.role_problems("source", self.params.source, may_answer=True)

    def required_sources(self) -> set[str]:
        return {self.source}

    def sample(self, rng: np.random.Generator) -> Instance:
        n = self.params.fact_length
        fact = "".join(rng.choice(list(LETTERS), size=n))
        private = {a: f"fact: {'?' * n}" for a in self.agents}
        private[self.source] = f"fact: {fact}"
        return Instance(private, fact, {"fact": fact})

    def message_length(self, agent: str) -> int:
        return self.params.fact_length

    @property
    def answer_length(self) -> int:
        return self.params.fact_length

    def oracle(self, agent: str, observation: str, final: bool) -> str:
        return self.known_fact(observation) or "?" * self.params.fact_length

    def demonstration(self, agent: str, observation: str, final: bool) -> str | None:
        answer = self.oracle(agent, observation, final)
        return None if final and "?" in answer else answer

    def random_message(self, agent: str, final: bool, rng: np.random.Generator) -> str:
        return "".join(rng.choice(list(LETTERS), size=self.params.fact_length))

    def symbols(self, agent: str, final: bool) -> tuple[str, ...]:
        return (LETTERS,) * self.params.fact_length

    def known_fact(self, observation: str) -> str | None:
        """The fact this agent knows, else the first well-formed fact it heard (the
        oracle's)."""
        n = self.params.fact_length
        own = private_text(observation).removeprefix("fact: ")
        if len(own) == n and all(c in LETTERS for c in own):
            return own
        return first_heard(observation, self.agents, n, LETTERS)

    def valid_message(self, agent: str, message: str, final: bool) -> bool:
        return is_code(message, self.params.fact_length, LETTERS)
