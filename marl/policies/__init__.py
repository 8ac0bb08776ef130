"""Policy backends. ``BACKENDS`` is the registry: backend name -> ``"module:function"``, each
building a :class:`Policy` from a scenario's policy spec, as
``builder(spec, task, seed, checkpoint, team)``: ``team`` is what the policies of one
team build share (:class:`TeamBuild`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marl.policies.base import Completion, Policy, Request

if TYPE_CHECKING:
    from marl.scenario import PolicySpec
    from marl.tasks import Task

BACKENDS: dict[str, str] = {
    "scripted": "marl.policies.scripted:build_scripted",
    "random": "marl.policies.scripted:build_random",
    "tiny": "marl.policies.factory:build_tiny",
    "hf": "marl.policies.factory:build_hf",
    "vllm": "marl.policies.vllm_engine:build_vllm",
    "openai": "marl.policies.api:build_openai",
}
#: Backends served by a remote API: evaluated, swept and priced, never trained; their
#: ledger rows hold the usage the server billed, and their cost predictions are estimates.
API_BACKENDS: tuple[str, ...] = ("openai",)


@dataclass
class TeamBuild:
    """What the policies of one team build share: the name of the policy being built, and
    the checkpoints already loaded (every LoRA policy on a checkpoint is an adapter on one
    copy of it; :mod:`marl.policies.shared`)."""

    name: str = "default"
    bases: dict[Any, Any] = field(default_factory=dict)


def build_policy(spec: PolicySpec, task: Task, seed: int = 0,
                 checkpoint: Path | None = None, team: TeamBuild | None = None) -> Policy:
    """The policy a scenario's spec describes; ``checkpoint`` holds trained weights."""
    module, attr = BACKENDS[spec.backend].split(":")
    return getattr(import_module(module), attr)(spec, task, seed, checkpoint,
                                                team or TeamBuild())


__all__ = ["API_BACKENDS", "BACKENDS", "Completion", "Policy", "Request", "TeamBuild",
           "build_policy"]
