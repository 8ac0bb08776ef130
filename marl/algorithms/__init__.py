"""Training algorithms, one per file. ``ALGORITHMS``: name -> ``"module:Learner"``."""

from __future__ import annotations

from importlib import import_module

ALGORITHMS: dict[str, str] = {
    "magrpo": "marl.algorithms.magrpo:MAGRPO",
    "grpo": "marl.algorithms.grpo:GRPO",
    "ppo": "marl.algorithms.ppo:PPO",
}


def learner_class(name: str) -> type:
    module, attr = ALGORITHMS[name].split(":")
    return getattr(import_module(module), attr)


__all__ = ["ALGORITHMS", "learner_class"]
