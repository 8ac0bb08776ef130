"""Policies that come from the task: the scripted oracle and a uniformly random policy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from marl.policies.base import Completion, Policy, Request
from marl.tasks import Task
from marl.tokenizer import Tokenizer


class ScriptedPolicy(Policy):
    """The task's oracle, acting from the observation text alone. ``tokenizer`` counts its
    tokens (default: the character tokenizer)."""

    def __init__(self, task: Task, seed: int = 0, tokenizer: Tokenizer | None = None):
        self.task = task
        if tokenizer is not None:
            self.tokenizer = tokenizer

    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        return [Completion(self.task.oracle(r.agent, r.observation, r.final)) for r in requests]


class RandomPolicy(Policy):
    """Uniformly random messages and answers of the task's format (chance level)."""

    def __init__(self, task: Task, seed: int = 0):
        self.task = task
        self.rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        return [Completion(self.task.random_message(r.agent, r.final, self.rng))
                for r in requests]


def build_scripted(spec, task: Task, seed: int, checkpoint=None, team=None) -> ScriptedPolicy:
    if not task.provides("oracle"):
        task.oracle("", "", False)  # the task's refusal, which says what to do instead
    return ScriptedPolicy(task, seed)


def build_random(spec, task: Task, seed: int, checkpoint=None, team=None) -> RandomPolicy:
    if not task.provides("random_message"):
        task.random_message("", False, np.random.default_rng(0))  # the task's refusal
    return RandomPolicy(task, seed)
