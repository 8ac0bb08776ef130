"""Run the ``marl`` command line with a SIGKILL planted in it: ``python -m
tests.faults.killer POINT K -- ARGS`` kills the process (``kill -9``, nothing cleans up)
at the K-th time it reaches POINT:

- ``warmup``: a format warm-up step has updated the weights in memory;
- ``update``: an RL update has changed the weights and optimizers in memory;
- ``evaluation``: an evaluation has played its episodes;
- ``checkpoint``: a checkpoint's files are written, not yet renamed into place;
- ``rename``: a checkpoint replacing an older one (``best``) has moved the old version
  aside, and the new one is not yet in place;
- ``never``: no kill (the parent kills it at a random time instead).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def counting(k: int, fn: Callable[..., Any], when: Callable[..., bool] = lambda *a: True
             ) -> Callable[..., Any]:
    """``fn``, dying right after its K-th call that ``when`` accepts."""
    calls = [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if when(*args, **kwargs):
            calls[0] += 1
            if calls[0] == k:
                die()
        return out

    return wrapped


class _OS:
    """``os`` for :mod:`marl.io`, with ``replace`` dying after its K-th move aside."""

    def __init__(self, k: int):
        self.replace = counting(k, os.replace, lambda src, dst: str(dst).endswith(".old"))

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def plant(point: str, k: int) -> None:
    import marl.algorithms.warmup as warmup
    import marl.io as io
    import marl.training.trainer as trainer

    if point == "warmup":
        warmup.warmup_step = counting(k, warmup.warmup_step)
    elif point == "update":
        learner_class = trainer.learner_class

        def planted(name: str) -> type:
            cls = learner_class(name)
            return type(cls.__name__, (cls,), {"update": counting(k, cls.update)})

        trainer.learner_class = planted
    elif point == "evaluation":
        trainer.evaluation = counting(k, trainer.evaluation)
    elif point == "checkpoint":
        io.fsync_tree = counting(k, io.fsync_tree)
    elif point == "rename":
        io.os = _OS(k)
    elif point != "never":
        raise SystemExit(f"unknown point {point!r}")


if __name__ == "__main__":
    point, k, sep, *args = sys.argv[1:]
    assert sep == "--"
    plant(point, int(k))
    from marl.cli import app

    app(args, prog_name="marl")
