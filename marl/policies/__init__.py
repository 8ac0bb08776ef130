"""Policy backends. ``BACKENDS`` is the registry: backend name -> ``"module:Class"``."""

from __future__ import annotations

from importlib import import_module

from marl.policies.base import Completion, Policy, Request

BACKENDS: dict[str, str] = {
    "scripted": "marl.policies.scripted:ScriptedPolicy",
    "random": "marl.policies.scripted:RandomPolicy",
}


def policy_class(backend: str) -> type[Policy]:
    module, attr = BACKENDS[backend].split(":")
    return getattr(import_module(module), attr)


__all__ = ["BACKENDS", "Completion", "Policy", "Request", "policy_class"]
