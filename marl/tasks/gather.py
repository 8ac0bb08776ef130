"""gather_v0: aggregate private values over the topology.

Agents
    Every agent holds a private value in ``[0, values)``; the answer agents must output
    the sum of all values modulo ``values``.
Private information
    ``value: 07`` (zero-padded to the width of ``values - 1``).
Messages
    A knowledge table: one fixed-width slot per agent, in team order, holding that agent's
    value or ``?`` marks (``07????03``). Tables merge without double counting on any
    topology, so information must really flow: the answer agent can only be right if every
    value reaches it.
Answer
    The zero-padded sum modulo ``values``.
Reward
    1 if correct, else 0 (chance: 1/values).
Oracle
    Merge the own value with every table read; send the table; answer the sum.

Version history
    v0: initial version.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from marl.tasks.base import Instance, Task, TaskParams, inbox_messages, private_text

DIGITS = "0123456789"


class GatherParams(TaskParams):
    values: int = Field(10, ge=2, le=1000, description="Values are drawn from [0, values).")


class Gather(Task):
    id = "gather_v0"
    Params = GatherParams
    params: GatherParams

    @property
    def width(self) -> int:
        return len(str(self.params.values - 1))

    def required_sources(self) -> set[str]:
        return set(self.agents)

    def sample(self, rng: np.random.Generator) -> Instance:
        vals = [int(v) for v in rng.integers(self.params.values, size=len(self.agents))]
        private = {a: f"value: {v:0{self.width}d}" for a, v in zip(self.agents, vals, strict=True)}
        answer = f"{sum(vals) % self.params.values:0{self.width}d}"
        return Instance(private, answer, {"values": vals})

    def message_length(self, agent: str) -> int:
        return self.width * len(self.agents)

    @property
    def answer_length(self) -> int:
        return self.width

    def _known(self, agent: str, observation: str) -> dict[int, int]:
        w = self.width
        known: dict[int, int] = {}
        own = private_text(observation).removeprefix("value: ")
        if own.isdigit():
            known[self.agents.index(agent)] = int(own)
        for _, msg in inbox_messages(observation, self.agents):
            if len(msg) != w * len(self.agents):
                continue
            for i in range(len(self.agents)):
                slot = msg[i * w : (i + 1) * w]
                if slot.isdigit():
                    known.setdefault(i, int(slot))
        return known

    def oracle(self, agent: str, observation: str, final: bool) -> str:
        known = self._known(agent, observation)
        w = self.width
        if final:
            return f"{sum(known.values()) % self.params.values:0{w}d}"
        return "".join(
            f"{known[i]:0{w}d}" if i in known else "?" * w for i in range(len(self.agents))
        )

    def demonstration(self, agent: str, observation: str, final: bool) -> str | None:
        if final and len(self._known(agent, observation)) < len(self.agents):
            return None  # a partial sum
        return self.oracle(agent, observation, final)

    def random_message(self, agent: str, final: bool, rng: np.random.Generator) -> str:
        if final:
            return f"{int(rng.integers(self.params.values)):0{self.width}d}"
        return "".join(rng.choice(list(DIGITS), size=self.message_length(agent)))
