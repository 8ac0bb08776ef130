"""cipher_v0: pass a secret to a teammate while an opposing team listens in.

A competitive game in the spirit of Abadi & Andersen's "learning to protect
communications" (2016), with discrete messages.

Agents
    Two teams (scenario ``teams:``). The *sender* (``params.sender``, default: the first
    agent that does not answer) and the *receiver* (``params.receiver``, default: the
    answer agent on the sender's team) share a key; the *eavesdropper* (``params.
    eavesdropper``, default: the answer agent of another team) reads the same message
    without it. Any other agents may relay.
Private information
    The sender sees the secret and the key (``secret: 2 key: 3``), the receiver the key
    (``key: 3``), everyone else ``key: ?``. Secret and key are uniform over ``values``.
Messages
    ``message_length`` lowercase letters. The task fixes no meaning for them.
Answer
    Receiver and eavesdropper each answer one digit: the secret as they read it.
Reward
    Zero-sum. Sender's team: ``[receiver right] − [eavesdropper right]``; the
    eavesdropper's team the negative. Success for a team is a score of 1 (its reader
    right, the other wrong). Sending the secret in the clear gives both readers the answer
    (score 0 each); a code that uses the key keeps the eavesdropper at chance (1/values).
Oracle
    The sender sends the letter ``(secret + key) mod values``; the receiver subtracts the
    key; the eavesdropper, who has no key, reads the letter as if the key were 0.

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
from orchestration.hints import listing

LETTERS = string.ascii_lowercase


class CipherParams(TaskParams):
    values: int = Field(4, ge=2, le=10, description="Secrets and keys are 0 .. values - 1.")
    message_length: int = Field(1, ge=1, le=64, description="Letters per message.")
    sender: str | None = Field(None, description="Agent that sees the secret and the key.")
    receiver: str | None = Field(None, description="Sender's teammate who answers.")
    eavesdropper: str | None = Field(None, description="Opponent who answers.")


class Cipher(Task):
    id = "cipher_v0"
    Params = CipherParams
    params: CipherParams
    competitive = True

    def _side(self, agent: str) -> str | None:
        return next((s for s, members in self.sides.items() if agent in members), None)

    @property
    def sender(self) -> str:
        return self.role_agent(self.params.sender)

    @property
    def receiver(self) -> str:
        own = self._side(self.sender)
        return self.params.receiver or next(
            (a for a in self.answer_agents if self._side(a) == own), self.answer_agents[0])

    @property
    def eavesdropper(self) -> str:
        own = self._side(self.sender)
        return self.params.eavesdropper or next(
            (a for a in self.answer_agents if self._side(a) != own), self.answer_agents[-1])

    def check(self) -> list[Problem]:
        problems = self.role_problems("sender", self.params.sender, may_answer=False)
        for key in ("receiver", "eavesdropper"):
            chosen = getattr(self.params, key)
            if chosen is not None and chosen not in self.answer_agents:
                problems.append(Problem(f"task.params.{key}", f"the {key} {chosen!r} must answer "
                                        f"for its team; answer agents: "
                                        f"{listing(self.answer_agents)}."))
        if problems:
            return problems
        if self._side(self.receiver) != self._side(self.sender):
            problems.append(Problem("teams", f"the receiver {self.receiver!r} must be on the "
                                    f"sender {self.sender!r}'s team."))
        if self._side(self.eavesdropper) == self._side(self.sender):
            problems.append(Problem("teams", f"the eavesdropper {self.eavesdropper!r} must be "
                                    f"on another team than the sender {self.sender!r}."))
        return problems

    def required_sources(self) -> set[str]:
        return {self.sender}

    def sample(self, rng: np.random.Generator) -> Instance:
        secret, key = (int(x) for x in rng.integers(self.params.values, size=2))
        private = dict.fromkeys(self.agents, "key: ?")
        private[self.sender] = f"secret: {secret} key: {key}"
        private[self.receiver] = f"key: {key}"
        return Instance(private, str(secret), {"target": secret, "secret": secret, "key": key})

    def message_length(self, agent: str) -> int:
        return self.params.message_length

    @property
    def answer_length(self) -> int:
        return 1

    def _key(self, observation: str) -> int:
        """The key on the observation's first line, 0 for an agent without one."""
        mine = private_text(observation).split("key: ")[-1]
        return int(mine) if mine.isdigit() else 0

    def _code(self, observation: str) -> str | None:
        mine = private_text(observation)
        if mine.startswith("secret: "):
            secret = int(mine.split()[1])
            letter = LETTERS[(secret + self._key(observation)) % self.params.values]
            return letter * self.params.message_length
        return first_heard(observation, self.agents, self.params.message_length, LETTERS)

    def _answer(self, observation: str) -> str | None:
        code = self._code(observation)
        if code is None or LETTERS.index(code[0]) >= self.params.values:
            return None
        return str((LETTERS.index(code[0]) - self._key(observation)) % self.params.values)

    def oracle(self, agent: str, observation: str, final: bool) -> str:
        if not final:
            return self._code(observation) or "?" * self.params.message_length
        return self._answer(observation) or "0"

    def demonstration(self, agent: str, observation: str, final: bool) -> str | None:
        return self._answer(observation) if final else self.oracle(agent, observation, False)

    def random_message(self, agent: str, final: bool, rng: np.random.Generator) -> str:
        if final:
            return str(int(rng.integers(self.params.values)))
        return "".join(rng.choice(list(LETTERS), size=self.params.message_length))

    def symbols(self, agent: str, final: bool) -> tuple[str, ...]:
        if final:
            return (string.digits[: self.params.values],)
        return (LETTERS,) * self.params.message_length

    def valid_message(self, agent: str, message: str, final: bool) -> bool:
        if final:
            return is_index(message, self.params.values)
        return is_code(message, self.params.message_length, LETTERS)

    def score_sides(self, instance: Instance, answers: dict[str, str]) -> dict[str, float]:
        """Zero-sum: the sender's side gains what the eavesdropper's loses.

        The answers arrive per side; the receiver's and the eavesdropper's are their sides'.
        """
        own, other = self._side(self.receiver), self._side(self.eavesdropper)
        right = {side: float(answers[side].strip() == instance.answer) for side in (own, other)}
        score = right[own] - right[other]
        return {side: score if side == own else (-score or 0.0) if side == other else 0.0
                for side in answers}
