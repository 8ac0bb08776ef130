"""vote_v0: noisy labels, one team answer; talking (debate) helps.

Agents
    Every agent sees a noisy copy of a hidden label in ``[0, classes)``: correct with
    probability ``1 - noise``, otherwise a uniformly chosen wrong label.
Private information
    ``label: 1``.
Messages
    One digit: the agent's current belief.
Answer
    One digit; with ``protocol.answer: {vote: [...]}`` the team answer is the voters'
    majority (ties go to the earliest voter).
Reward
    1 if the team answer equals the hidden label, else 0 (chance: 1/classes).
Oracle
    Believe the majority of the own label and the latest message of every agent read
    (ties keep the own label). With more agents heard, the majority is right more often.

Version history
    v0: initial version.
"""

from __future__ import annotations

import string
from collections import Counter

import numpy as np
from pydantic import Field

from marl.tasks.base import Instance, Task, TaskParams, inbox_messages, is_index, private_text


class VoteParams(TaskParams):
    classes: int = Field(2, ge=2, le=10, description="Number of labels.")
    noise: float = Field(0.3, ge=0.0, le=1.0, description="Probability a copy is wrong.")


class Vote(Task):
    id = "vote_v0"
    Params = VoteParams
    params: VoteParams

    def required_sources(self) -> set[str]:
        return set()

    def sample(self, rng: np.random.Generator) -> Instance:
        k = self.params.classes
        label = int(rng.integers(k))
        private, copies = {}, {}
        for a in self.agents:
            seen = label
            if rng.random() < self.params.noise:
                seen = (label + 1 + int(rng.integers(k - 1))) % k
            private[a], copies[a] = f"label: {seen}", seen
        return Instance(private, str(label), {"label": label, "seen": copies})

    def message_length(self, agent: str) -> int:
        return 1

    @property
    def answer_length(self) -> int:
        return 1

    def oracle(self, agent: str, observation: str, final: bool) -> str:
        own = private_text(observation).removeprefix("label: ")
        latest = dict(inbox_messages(observation, self.agents))  # last message per source
        latest[agent] = own
        counts = Counter(v for v in latest.values() if v.isdigit())
        best = max(counts.values())
        return own if counts[own] == best else min(v for v, c in counts.items() if c == best)

    def random_message(self, agent: str, final: bool, rng: np.random.Generator) -> str:
        return str(int(rng.integers(self.params.classes)))

    def symbols(self, agent: str, final: bool) -> tuple[str, ...]:
        return (string.digits[: self.params.classes],)

    def valid_message(self, agent: str, message: str, final: bool) -> bool:
        return is_index(message, self.params.classes)
