"""The task contract: what a task gives the platform, what is required and what optional.

A task is a class deriving from :class:`Task` (built in, or a plugin named
``package.module:Class`` in a scenario; ``docs/tasks.md`` has a worked example). Required:
``id``, ``Params`` and :meth:`Task.sample`; a task whose ``messages`` are ``"codes"`` (the
default: fixed-width symbol strings, whose cost is predicted exactly) also gives
:meth:`Task.message_length` and :attr:`Task.answer_length`. Everything else is optional,
with a default: the score (exact match), a format check, the flow check's sources, and
the scripted oracle and random policy, without which ``--policy scripted|random``, the
random-message warm-up and oracle agreement are refused or skipped with a message.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict

from marl.errors import MarlError, Problem
from marl.prompts import CONTINUATION
from orchestration.hints import did_you_mean, listing


class TaskParams(BaseModel):
    """Base of every task's parameter model: strict, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Verdict(NamedTuple):
    """One scored answer: the score, why it is 0 or partial when that is not a plain wrong
    answer (a malformed row, an answer that cannot be read, a test that hung), and the
    wall time the scoring took."""

    score: float  # in [0, 1]
    reason: str | None
    seconds: float


@dataclass(frozen=True)
class Instance:
    """One procedurally generated task instance."""

    private: dict[str, str]  # agent -> its private text (fixed length per agent)
    answer: str  # the correct team answer
    data: dict[str, Any] = field(default_factory=dict)


_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9_\-]*)> (.*)$")


def inbox_messages(observation: str, agents: Sequence[str]) -> list[tuple[str, str]]:
    """Every ``src> message`` line of a prompt, in order, from known agents only, with the
    continuation lines of a multi-line message joined back.

    Lines before the first round marker (header and scenario prompt) are skipped, and so
    is the query the agent completes (the observation's last line, ``b> ``: no message).

    >>> inbox_messages("you are b (x). v\\n[round 1]\\na> 12\\n  34\\nb> ", ["a", "b"])
    [('a', '12\\n34')]
    """
    known = set(agents)
    out: list[tuple[str, str]] = []
    started = following = False  # following: the previous line belongs to a message read
    lines = observation.split("\n")
    if lines and lines[-1].endswith("> "):
        lines.pop()  # the query: every message line read ends with a line break
    for line in lines:
        if line.startswith("[round "):
            started, following = True, False
            continue
        if following and line.startswith(CONTINUATION):
            src, text = out[-1]
            out[-1] = (src, f"{text}\n{line[len(CONTINUATION):]}")
            continue
        m = _LINE.match(line) if started else None
        following = bool(m and m.group(1) in known)
        if following:
            out.append((m.group(1), m.group(2)))
    return out


def first_heard(observation: str, agents: Sequence[str], length: int,
                alphabet: str) -> str | None:
    """The first message in the prompt made of exactly ``length`` characters of
    ``alphabet`` (the code a listener or relay acts on), or None.

    >>> first_heard("you are b (x). v\\n[round 1]\\na> abc\\na> de\\nb>", ["a", "b"], 2, "de")
    'de'
    """
    for _, msg in inbox_messages(observation, agents):
        if len(msg) == length and all(c in alphabet for c in msg):
            return msg
    return None


def is_code(message: str, length: int, alphabet: str) -> bool:
    """``length`` characters of ``alphabet``, or ``length`` ``?`` marks ("nothing to say").

    >>> is_code("ab", 2, "abc"), is_code("??", 2, "abc"), is_code("a?", 2, "abc")
    (True, True, False)
    """
    return len(message) == length and (all(c in alphabet for c in message)
                                       or message == "?" * length)


def is_index(message: str, count: int) -> bool:
    """One of the indices ``0 .. count - 1`` written in decimal, with no padding.

    >>> is_index("3", 4), is_index("4", 4), is_index("03", 4), is_index(" 1", 4)
    (True, False, False, False)
    """
    return message.isdigit() and message == str(int(message)) and int(message) < count


def private_text(observation: str) -> str:
    """The private information on an observation's first line (after ``). ``), with its
    continuation lines.

    >>> private_text("you are a (x). two\\n  lines\\n[round 1]")
    'two\\nlines'
    """
    first, *rest = observation.split("\n")
    text = first.split("). ", 1)[1] if "). " in first else ""
    for line in rest:
        if not line.startswith(CONTINUATION):
            break
        text += "\n" + line[len(CONTINUATION):]
    return text


class Task(ABC):
    """A team task. Subclasses set ``id`` and ``Params`` and implement :meth:`sample`; the
    other hooks are optional unless their docstring says otherwise."""

    id: ClassVar[str]
    Params: ClassVar[type[TaskParams]]
    #: Competitive tasks score two or more teams (``score_sides``); cooperative ones one.
    competitive: ClassVar[bool] = False
    #: ``codes``: messages and answers are fixed-width strings (``message_length``,
    #: ``answer_length``), so scripted and random teams' costs are predicted exactly;
    #: ``text``: free-form text, whatever the agent writes up to its ``max_new_tokens``.
    messages: ClassVar[Literal["codes", "text"]] = "codes"

    #: The optional hooks :meth:`provides` reports on.
    OPTIONAL: ClassVar[tuple[str, ...]] = ("oracle", "random_message", "valid_message",
                                          "message_length", "answer_length",
                                          "private_extremes")

    @classmethod
    def provides(cls, hook: str) -> bool:
        """Whether this task defines the optional ``hook`` (``oracle``, ``random_message``,
        ...) rather than inheriting the base class's refusal or default."""
        return getattr(cls, hook) is not getattr(Task, hook)

    def __init__(self, params: TaskParams, agents: Sequence[str], answer_agents: Sequence[str],
                 sides: dict[str, Sequence[str]] | None = None,
                 roles: dict[str, str] | None = None):
        self.params = params
        self.agents = tuple(agents)
        self.answer_agents = tuple(answer_agents)
        self.sides = {k: tuple(v) for k, v in (sides or {"team": agents}).items()}
        self.roles = {a: (roles or {}).get(a, "agent") for a in self.agents}

    def describe(self) -> str:
        """Optional: one line about this task's instance (its data), which ``marl
        validate`` prints; default: nothing."""
        return ""

    def check(self) -> list[Problem]:
        """Cross-field problems of this task with this team (paths start at ``task``)."""
        return []

    def role_agent(self, chosen: str | None) -> str:
        """A role such as speaker or source: ``chosen``, else the first non-answer agent."""
        if chosen:
            return chosen
        return next((a for a in self.agents if a not in self.answer_agents), self.agents[0])

    def role_problems(self, key: str, chosen: str | None, may_answer: bool) -> list[Problem]:
        """An unknown agent in ``params.<key>``, or (unless ``may_answer``) a role agent
        that is also an answer agent, which makes the game trivial."""
        if chosen is not None and chosen not in self.agents:
            return [Problem(f"task.params.{key}", f"unknown agent {chosen!r}."
                            f"{did_you_mean(chosen, self.agents)} Agents: "
                            f"{listing(self.agents)}.")]
        agent = self.role_agent(chosen)
        if not may_answer and agent in self.answer_agents:
            return [Problem(f"task.params.{key}", f"the {key} {agent!r} is also an answer "
                            f"agent, so the game is trivial; {self.id} needs a {key} that is "
                            "not among protocol.answer (add another agent or choose another "
                            f"{key}).")]
        return []

    def required_sources(self) -> set[str]:
        """Agents whose private information every answer agent needs to answer correctly;
        loading checks that the topology lets it reach them in time. Default: none."""
        return set()

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> Instance:
        """Required: a new instance drawn with ``rng`` (private text per agent, the
        reference answer, structured data for analysis)."""

    def message_length(self, agent: str) -> int:
        """Required with ``messages = "codes"``: characters of ``agent``'s messages."""
        raise MarlError(f"{self.id} has no fixed message length: its messages are "
                        f"{self.messages!r}.")

    @property
    def answer_length(self) -> int:
        """Required with ``messages = "codes"``: characters of an answer."""
        raise MarlError(f"{self.id} has no fixed answer length: its messages are "
                        f"{self.messages!r}.")

    def private_extremes(self) -> dict[str, tuple[str, str]]:
        """The shortest and the longest private text of each agent, which bound the cost
        model's range and the observation spaces. Default: one instance's (codes tasks
        give every agent a private text of fixed length); for free-form tasks the extremes
        of 256 sampled instances: a task whose private texts vary should give exact ones."""
        rng = np.random.default_rng(0)
        samples = [self.sample(rng) for _ in range(1 if self.messages == "codes" else 256)]
        return {a: (min((s.private[a] for s in samples), key=len),
                    max((s.private[a] for s in samples), key=len)) for a in self.agents}

    def oracle(self, agent: str, observation: str, final: bool) -> str:
        """Optional: the scripted policy, acting from the observation text alone (backend
        ``scripted``, oracle agreement, oracle demonstrations)."""
        raise MarlError(f"{self.id} has no scripted oracle (Task.oracle): play it with a "
                        "model or random policy, and train without oracle demonstrations.")

    def demonstration(self, agent: str, observation: str, final: bool) -> str | None:
        """The oracle's action as a training target, or ``None`` where the oracle would only
        guess (an answer whose inputs never arrived or arrived garbled), or where the task
        has no oracle.

        Imitating guesses teaches a bias, not the task: early in training most messages are
        noise, and a listener drilled to answer the oracle's fallback to noise settles there.
        """
        return self.oracle(agent, observation, final) if self.provides("oracle") else None

    def random_message(self, agent: str, final: bool, rng: np.random.Generator) -> str:
        """Optional: a random message (or answer) of the right form and no meaning (backend
        ``random``, the format warm-up of models trained from scratch)."""
        raise MarlError(f"{self.id} has no random policy (Task.random_message): play it with "
                        "a model or scripted policy, and train without the random warm-up "
                        "(warmup_source: none, as for pretrained models).")

    def valid_message(self, agent: str, message: str, final: bool) -> bool:
        """Whether ``message`` has the format of ``agent``'s messages (or, when ``final``,
        of an answer): the form, not the meaning. Every oracle and random message is valid.
        Default: the right length for codes, any non-blank text for free-form messages."""
        if self.messages == "codes":
            return len(message) == self.output_length(agent, final)
        return bool(message.strip())

    def symbols(self, agent: str, final: bool) -> tuple[str, ...] | None:
        """The finite alphabet of every position of ``agent``'s messages (or, when
        ``final``, answers): one string of symbols per character, so that a message is a
        choice of one symbol per position (what classic MARL baselines act with, see
        :mod:`marl.baseline.symbols`). ``None``: this task's messages are not drawn from a finite
        alphabet of fixed length."""
        return None

    #: Named instance distributions: ``train`` (what training samples) and, for tasks that
    #: study generalisation, held-out ones that evaluation reports separately.
    splits: ClassVar[tuple[str, ...]] = ("train",)
    #: The split ``eval_success_rate`` is measured on (and ``marl run`` plays): new
    #: instances of ``train`` for generated tasks, a split of its own for a dataset.
    eval_split: ClassVar[str] = "train"

    def draw(self, rng: np.random.Generator, split: str = "train") -> Instance:
        """An instance of ``split`` (tasks with held-out splits override this)."""
        if split not in self.splits:
            raise MarlError(f"{self.id} has no instance split {split!r}; its splits: "
                            f"{listing(list(self.splits))}.")
        return self.sample(rng)

    def output_length(self, agent: str, final: bool) -> int:
        return self.answer_length if final else self.message_length(agent)

    def team_answer(self, answers: Sequence[str]) -> str:
        """Majority of the answer agents' answers; ties go to the earliest voter."""
        counts = Counter(a.strip() for a in answers)
        best = max(counts.values())
        return next(a.strip() for a in answers if counts[a.strip()] == best)

    def score(self, instance: Instance, answer: str) -> float:
        """1.0 for the correct answer, else 0.0 (surrounding spaces ignored)."""
        return float(answer.strip() == instance.answer)

    def verdict(self, instance: Instance, answer: str) -> Verdict:
        """The score of a cooperative team's answer with its reason and time (episode
        records keep the reason); default: :meth:`score`, with neither."""
        return Verdict(self.score(instance, answer), None, 0.0)

    def score_sides(self, instance: Instance, answers: dict[str, str]) -> dict[str, float]:
        """Each side's score from each side's answer; a cooperative task has one side."""
        return {side: self.score(instance, answer) for side, answer in answers.items()}
