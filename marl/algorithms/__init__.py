"""Training algorithms, one per file. ``ALGORITHMS``: name -> ``"module:Learner"``."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from marl.algorithms.common import Trainable
    from marl.algorithms.config import TrainConfig
    from marl.rollout import EpisodeBatch
    from marl.team import Team

ALGORITHMS: dict[str, str] = {
    "magrpo": "marl.algorithms.magrpo:MAGRPO",
    "grpo": "marl.algorithms.grpo:GRPO",
    "ppo": "marl.algorithms.ppo:PPO",
}


class Learner(Protocol):
    """What the trainer (and a population through it) drives; every algorithm implements
    it. ``team`` and ``cfg`` may be replaced between updates (a curriculum stage, a setting
    changed by ``Trainer.set``)."""

    team: Team
    cfg: TrainConfig
    trainables: list[Trainable]

    def update(self, batch: EpisodeBatch, seed: int) -> dict[str, float]:
        """One update on a batch of rollouts; returns the iteration's loss statistics."""

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimizer (policies and critics), so the learning rate can change."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def learner_class(name: str) -> type[Learner]:
    module, attr = ALGORITHMS[name].split(":")
    return getattr(import_module(module), attr)


__all__ = ["ALGORITHMS", "Learner", "learner_class"]
