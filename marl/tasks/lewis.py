"""lewis_v0: the Lewis signalling game.

Agents
    A *speaker* (``params.speaker``, default: the first agent that is not an answer agent)
    and one or more *listeners* (the answer agents). Any other agents may relay.
Private information
    The speaker sees which of K objects is the target (``object: 2``); everyone else sees
    ``object: ?``.
Messages
    ``message_length`` lowercase letters. The task fixes no meaning for them: the team has
    to agree on a code (the oracle's is one of many that work).
Answer
    One digit: the target's index.
Reward
    1 if the team names the target, else 0 (chance: 1/K).
Oracle
    The speaker sends the K-th letter of the alphabet for object K (``c`` for object 2),
    repeated ``message_length`` times; relays forward the first message they read;
    listeners decode the first letter of the first message of ``message_length`` letters
    (a message of any other length or charset counts as no code: no demonstration).

Unlike ``signal_v0``, the listener holds no private list to search: decoding is a fixed
mapping from message to answer, the classic setting of emergent-communication studies.

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


class LewisParams(TaskParams):
    objects: int = Field(4, ge=2, le=10, description="Number of objects K.")
    message_length: int = Field(1, ge=1, le=64, description="Letters per message.")
    speaker: str | None = Field(None, description="Agent that sees the target.")


class Lewis(Task):
    id = "lewis_v0"
    Params = LewisParams
    params: LewisParams

    @property
    def speaker(self) -> str:
        return self.role_agent(self.params.speaker)

    def check(self) -> list[Problem]:
        return self.role_problems("speaker", self.params.speaker, may_answer=False)

    def required_sources(self) -> set[str]:
        return {self.speaker}

    def sample(self, rng: np.random.Generator) -> Instance:
        target = int(rng.integers(self.params.objects))
        private = dict.fromkeys(self.agents, "object: ?")
        private[self.speaker] = f"object: {target}"
        return Instance(private, str(target), {"target": target})

    def message_length(self, agent: str) -> int:
        return self.params.message_length

    @property
    def answer_length(self) -> int:
        return 1

    def _code(self, observation: str) -> str | None:
        mine = private_text(observation).removeprefix("object: ")
        if mine.isdigit():
            return LETTERS[int(mine)] * self.params.message_length
        return first_heard(observation, self.agents, self.params.message_length, LETTERS)

    def _answer(self, observation: str) -> str | None:
        """The object the heard code names; None if no code names one."""
        code = self._code(observation)
        index = LETTERS.index(code[0]) if code else self.params.objects
        return str(index) if index < self.params.objects else None

    def oracle(self, agent: str, observation: str, final: bool) -> str:
        if not final:
            return self._code(observation) or "?" * self.params.message_length
        return self._answer(observation) or "0"

    def demonstration(self, agent: str, observation: str, final: bool) -> str | None:
        return self._answer(observation) if final else self.oracle(agent, observation, False)

    def random_message(self, agent: str, final: bool, rng: np.random.Generator) -> str:
        if final:
            return str(int(rng.integers(self.params.objects)))
        return "".join(rng.choice(list(LETTERS), size=self.params.message_length))

    def symbols(self, agent: str, final: bool) -> tuple[str, ...]:
        if final:
            return (string.digits[: self.params.objects],)
        return (LETTERS,) * self.params.message_length

    def valid_message(self, agent: str, message: str, final: bool) -> bool:
        if final:
            return is_index(message, self.params.objects)
        return is_code(message, self.params.message_length, LETTERS)
