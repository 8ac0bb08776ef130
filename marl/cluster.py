"""A Ray session for whatever runs on Ray (populations, sweep cells, the RLlib baseline): an
embedded local Ray sized to the machine, or an existing cluster (``--address`` or
``RAY_ADDRESS``). Ray itself is imported only when a session opens."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from marl.errors import MarlError
from marl.tasks import plugin_root

if TYPE_CHECKING:
    from marl.team import Team

ROOT = Path(__file__).resolve().parents[1]

#: Quiet, local-only Ray (FIELD-NOTES): no auth token written under $HOME, no usage
#: stats, no Tune config tables on the terminal.
QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AIR_NEW_OUTPUT": "0"}


def shipped(modules: Sequence[str]) -> list[ModuleType]:
    """The modules among ``modules`` (top-level names, e.g. a plugin task's package) that
    Ray must send to its workers: those not installed in a site-packages folder, which
    the workers of another machine cannot import otherwise."""
    out = []
    for name in dict.fromkeys(modules):
        module = sys.modules.get(name) or import_module(name)
        parts = Path(module.__file__ or "").parts
        if "site-packages" not in parts and "dist-packages" not in parts:
            out.append(module)
    return out


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None,
                num_gpus: int | None = None, object_store_bytes: int | None = None,
                modules: Sequence[str] = ()) -> Iterator[None]:
    """Connect to Ray for the duration of the block: to ``address`` (or ``RAY_ADDRESS``)
    when given, else to a local Ray with ``num_cpus`` (default: every core). ``modules``
    (a plugin task's top-level package) reach every worker: installed ones must be
    installed on every node, the others are shipped in the job's ``runtime_env``
    (``py_modules``). A session that is already connected (a test fixture, a notebook) is
    used as it is and left running."""
    import ray

    if ray.is_initialized():
        yield
        return
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    # Workers import the trainable from this project; an editable install is enough, a
    # checkout run through PYTHONPATH needs it passed on.
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)
    ship = shipped(modules)
    runtime_env = {"py_modules": ship} if ship else None
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False, runtime_env=runtime_env)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), num_gpus=num_gpus,
                 object_store_memory=object_store_bytes, include_dashboard=False,
                 log_to_driver=False, runtime_env=runtime_env)
    try:
        yield
    finally:
        ray.shutdown()


def gather(refs: Sequence[Any], timeout_s: float, what: str, setting: str) -> list[Any]:
    """``ray.get`` of ``refs`` with a deadline. A task's own :class:`MarlError` is raised as
    it is; a deadline passed, or a worker or node lost beyond Ray's retries, is a
    :class:`MarlError` naming ``what`` and the ``setting`` that sets the deadline (the
    tasks still running are cancelled)."""
    import ray

    try:
        return ray.get(list(refs), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise MarlError(f"{what} did not finish within {timeout_s:g} s: the cluster may be "
                        "short of free CPUs, or a worker hangs (see `ray status`). Raise "
                        f"{setting} if they need longer.") from None
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, MarlError):
            raise exc.cause from None
        raise MarlError(f"{what} failed: {type(exc.cause).__name__}: {exc.cause}") from None
    except ray.exceptions.RayError as exc:  # a worker or node died more often than retried
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise MarlError(f"{what} failed on the cluster ({type(exc).__name__}: {first}); "
                        "Ray retried it and gave up. Check the nodes (`ray status`) and "
                        "run again.") from None


def task_modules(team: Team) -> list[str]:
    """The top-level module of the team's task when it is a plugin (not built in)."""
    root = plugin_root(team.scenario.task.name)
    return [root[0]] if root else []
