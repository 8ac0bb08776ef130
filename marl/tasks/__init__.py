"""Task registry: task id -> ``"module:Class"``; each task's docstring is its card."""

from __future__ import annotations

from importlib import import_module

from marl.errors import MarlError
from marl.tasks.base import Instance, Task, TaskParams
from orchestration.hints import did_you_mean, listing

TASKS: dict[str, str] = {
    "signal_v0": "marl.tasks.signal:Signal",
    "lewis_v0": "marl.tasks.lewis:Lewis",
    "gather_v1": "marl.tasks.gather:Gather",
    "gather_v0": "marl.tasks.gather:GatherV0",
    "vote_v0": "marl.tasks.vote:Vote",
    "relay_v0": "marl.tasks.relay:Relay",
    "ref_v0": "marl.tasks.ref:Ref",
    "cipher_v0": "marl.tasks.cipher:Cipher",
}


def task_class(name: str) -> type[Task]:
    """Look a task up by id; an unknown id names the closest and lists all."""
    if name not in TASKS:
        raise MarlError(
            f"unknown task {name!r}.{did_you_mean(name, list(TASKS))} "
            f"Valid tasks: {listing(list(TASKS))}."
        )
    module, attr = TASKS[name].split(":")
    return getattr(import_module(module), attr)


__all__ = ["TASKS", "Instance", "Task", "TaskParams", "task_class"]
