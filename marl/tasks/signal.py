"""signal_v0: a referential game.

Agents
    A *speaker* (``params.speaker``, default: the first agent that is not an answer agent)
    and one or more *listeners* (the answer agents). Any other agents may relay.
Private information
    The speaker sees the target word (``target: kqz``). Listeners see the K candidate
    words in an order private to the episode (``candidates: 0=abc 1=kqz ...``). Everyone
    else sees ``target: ???``.
Messages
    ``message_length`` lowercase letters (default: the word length). Candidates differ in
    their first ``message_length`` letters, so a prefix always identifies the target.
Answer
    One digit: the target's index in the listener's candidate list.
Reward
    1 if the team names the target, else 0 (chance: 1/K).
Oracle
    The speaker sends the target's prefix; relays forward the first prefix they read;
    listeners answer the index of the candidate with that prefix.

The listener must find the heard word in its own list and read off the index in front of
it: an induction-style lookup, far harder for a small model trained from scratch than the
fixed decoding of ``lewis_v0``, the same game without the private list.

Version history
    v0: initial version.
"""

from __future__ import annotations

import string

import numpy as np
from pydantic import Field

from marl.errors import Problem
from marl.tasks.base import (
    Instance,
    Task,
    TaskParams,
    first_heard,
    is_code,
    is_index,
    private_text,
)

LETTERS = string.ascii_lowercase


class SignalParams(TaskParams):
    candidates: int = Field(4, ge=2, le=10, description="Number of candidate words K.")
    word_length: int = Field(3, ge=1, le=8, description="Letters per candidate word.")
    message_length: int | None = Field(
        None, ge=1, le=8, description="Letters per message; default: word_length."
    )
    speaker: str | None = Field(None, description="Agent that sees the target.")


class Signal(Task):
    id = "signal_v0"
    Params = SignalParams
    params: SignalParams

    @property
    def m(self) -> int:
        p = self.params
        return min(p.message_length or p.word_length, p.word_length)

    @property
    def speaker(self) -> str:
        return self.role_agent(self.params.speaker)

    def check(self) -> list[Problem]:
        p = self.params
        if problems := self.role_problems("speaker", p.speaker, may_answer=False):
            return problems
        if 26**self.m < p.candidates:
            return [Problem("task.params.message_length", f"{self.m} letters cannot tell "
                            f"{p.candidates} candidates apart; raise message_length.")]
        return []

    def required_sources(self) -> set[str]:
        return {self.speaker}

    def sample(self, rng: np.random.Generator) -> Instance:
        p = self.params
        words: list[str] = []
        while len(words) < p.candidates:
            w = "".join(rng.choice(list(LETTERS), size=p.word_length))
            if all(w[: self.m] != u[: self.m] for u in words):
                words.append(w)
        target = int(rng.integers(p.candidates))
        order = [int(i) for i in rng.permutation(p.candidates)]  # listener's list order
        shown = " ".join(f"{i}={words[j]}" for i, j in enumerate(order))
        private = {a: f"target: {'?' * p.word_length}" for a in self.agents}
        private[self.speaker] = f"target: {words[target]}"
        for a in self.answer_agents:
            private[a] = f"candidates: {shown}"
        return Instance(private, str(order.index(target)), {"words": words, "target": target})

    def message_length(self, agent: str) -> int:
        return self.m

    @property
    def answer_length(self) -> int:
        return 1

    def _prefix(self, observation: str) -> str | None:
        mine = private_text(observation)
        if mine.startswith("target: ") and "?" not in mine:
            return mine[len("target: "):][: self.m]
        return first_heard(observation, self.agents, self.m, LETTERS)

    def _answer(self, observation: str) -> str | None:
        """The index of the candidate with the heard prefix; None if none matches."""
        prefix = self._prefix(observation)
        if prefix is None:
            return None
        for item in private_text(observation).removeprefix("candidates: ").split():
            index, _, word = item.partition("=")
            if word.startswith(prefix):
                return index
        return None

    def oracle(self, agent: str, observation: str, final: bool) -> str:
        if not final:
            return self._prefix(observation) or "?" * self.m
        return self._answer(observation) or "0"

    def demonstration(self, agent: str, observation: str, final: bool) -> str | None:
        return self._answer(observation) if final else self.oracle(agent, observation, False)

    def random_message(self, agent: str, final: bool, rng: np.random.Generator) -> str:
        if final:
            return str(int(rng.integers(self.params.candidates)))
        return "".join(rng.choice(list(LETTERS), size=self.m))

    def symbols(self, agent: str, final: bool) -> tuple[str, ...]:
        if final:
            return (string.digits[: self.params.candidates],)
        return (LETTERS,) * self.m

    def valid_message(self, agent: str, message: str, final: bool) -> bool:
        if final:
            return is_index(message, self.params.candidates)
        return is_code(message, self.m, LETTERS)
