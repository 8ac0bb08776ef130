"""A learning rate driven by measured progress (``lr_patience``).

After ``lr_patience`` evaluations in a row without a new best eval success in the current
curriculum stage, every optimizer's learning rate is multiplied by ``lr_decay``, down to
``lr_floor`` times ``lr``: the rule of torch's ``ReduceLROnPlateau`` (mode ``max``, an
absolute threshold of 0, no cooldown), kept by the trainer rather than per optimizer
because the optimizers are rebuilt when RL starts and a population may set ``lr`` anew.
A fixed step size leaves a policy that learns from noisy scores (a vote's label is
right only some of the time) as far from its optimum as its gradient noise carries it;
the smaller steps after a plateau let it settle nearer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Plateau:
    """The schedule's state. ``scale`` multiplies ``lr``.

    >>> p = Plateau(patience=2, decay=0.5, floor=0.2)
    >>> [p.update(s) for s in (0.3, 0.5, 0.5, 0.4, 0.5, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6)]
    [False, False, False, True, False, True, False, False, True, False, False]
    >>> p.scale  # halved twice, then held at the floor
    0.2
    """

    patience: int | None
    decay: float
    floor: float
    best: float = -math.inf
    bad: int = 0
    scale: float = 1.0

    def update(self, success: float) -> bool:
        """Count one evaluation; True when ``scale`` changed."""
        if self.patience is None:
            return False
        if success > self.best:
            self.best, self.bad = success, 0
            return False
        self.bad += 1
        if self.bad < self.patience:
            return False
        self.bad = 0
        scale = max(self.scale * self.decay, self.floor)
        changed, self.scale = scale != self.scale, scale
        return changed

    def reset(self) -> None:
        """A new curriculum stage: a new task to learn, at the full learning rate."""
        self.best, self.bad, self.scale = -math.inf, 0, 1.0

    def state_dict(self) -> dict:
        return {"best": self.best, "bad": self.bad, "scale": self.scale}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.bad, self.scale = state["best"], state["bad"], state["scale"]
