"""Tasks: the built-in registry, and how a scenario's ``task.name`` resolves.

A name is, in this order: a built-in id (``TASKS``: id -> ``"module:Class"``); an id an
installed package registers under the ``llm_marl.tasks`` entry-point group; or a
``package.module:Class`` path, imported like any module (installed, or on ``PYTHONPATH``).
Every process that loads a scenario resolves it the same way: the CLI, spawned sweep
workers, and Ray workers (:mod:`marl.cluster` passes plugin modules on to them). Each
task's module docstring is its documentation card; the contract is :class:`Task`.
"""

from __future__ import annotations

import sys
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

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
    "dataset_v0": "marl.tasks.dataset:Dataset",
}
#: The entry-point group through which an installed package registers task ids.
ENTRY_POINTS = "llm_marl.tasks"


def registered() -> dict[str, EntryPoint]:
    """Task ids registered by installed packages (built-in ids take precedence)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINTS) if ep.name not in TASKS}


def task_path(name: str) -> str:
    """The ``module:Class`` a task name stands for."""
    if name in TASKS:
        return TASKS[name]
    plugins = registered()
    if name in plugins:
        return plugins[name].value
    if ":" in name:
        return name
    known = [*TASKS, *plugins]
    raise MarlError(f"unknown task {name!r}.{did_you_mean(name, known)} Known tasks: "
                    f"{listing(known)}; a task of your own is named by its class, "
                    "'package.module:Class' (installed or on PYTHONPATH), or registered "
                    f"under the {ENTRY_POINTS!r} entry-point group of an installed package.")


def task_class(name: str) -> type[Task]:
    """The task class a scenario's ``task.name`` names; a failure says which part failed
    (module, attribute, class) and how to fix it."""
    path = task_path(name)
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise MarlError(f"task {name!r}: {path!r} is not 'package.module:Class'; write the "
                        "module's import path, a colon, then the class name.")
    try:
        module = import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        on_path = module_name == missing or module_name.startswith(missing + ".")
        where = "" if on_path else f" (while importing {module_name!r}: a dependency of it)"
        raise MarlError(f"task {name!r}: module {missing!r} not found{where}; install the "
                        "package that provides it (pip install -e PATH) or put its folder on "
                        "PYTHONPATH.") from None
    except Exception as exc:  # the user's module failed while it was imported
        raise MarlError(f"task {name!r}: importing module {module_name!r} failed: "
                        f"{type(exc).__name__}: {exc}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        found = [k for k, v in vars(module).items()
                 if isinstance(v, type) and issubclass(v, Task) and v is not Task]
        raise MarlError(f"task {name!r}: module {module_name!r} has no attribute {attr!r}."
                        f"{did_you_mean(attr, found)} Task classes there: "
                        f"{listing(found) if found else 'none'}.")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise MarlError(f"task {name!r}: {path} is not a subclass of marl.tasks.Task; a task "
                        "class derives from it (docs/tasks.md).")
    return cls


def plugin_root(name: str) -> tuple[str, Path] | None:
    """For a task that is not built in: its module's top-level package (or module) name and
    the folder on ``sys.path`` it was imported from, which other processes need too."""
    module_name = task_path(name).partition(":")[0]
    if module_name.split(".")[0] == "marl":
        return None
    task_class(name)  # imported, with its errors
    top = module_name.split(".")[0]
    file = Path(sys.modules[top].__file__ or "")
    folder = file.parent.parent if file.name == "__init__.py" else file.parent
    return top, folder


__all__ = ["ENTRY_POINTS", "TASKS", "Instance", "Task", "TaskParams", "plugin_root",
           "registered", "task_class", "task_path"]
