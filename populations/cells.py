"""Sweep cells as Ray tasks (``marl sweep --ray``): one CPU each, on a local Ray sized to
the machine or on a cluster (``--address`` / ``RAY_ADDRESS``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import ray

from marl.cluster import ray_session
from marl.errors import MarlError
from marl.sweep.run import Job, run_cell
from marl.tasks import plugin_root


def _run(job: Job) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # one CPU per task, as Ray reserved
    return run_cell(job)


#: Seconds a sweep may go without any cell finishing before it stops with an error.
STALL_S = 24 * 3600.0


def execute_on_ray(jobs: Sequence[Job], address: str | None = None,
                   stall_s: float | None = None) -> Iterator[dict[str, Any]]:
    """Rows of the jobs as they finish, each cell a Ray task (a plugin task's module goes
    with them); an error when no cell finishes for ``stall_s`` seconds (default
    :data:`STALL_S`)."""
    stall_s = STALL_S if stall_s is None else stall_s
    roots = {plugin_root(job.scenario["task"]["name"]) for job in jobs}
    with ray_session(address, modules=[root[0] for root in roots if root]):
        task = ray.remote(num_cpus=1, max_retries=0)(_run)
        pending = [task.remote(job) for job in jobs]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=stall_s)
                if not done:
                    raise MarlError(f"no sweep cell finished in {stall_s:g} s ({len(pending)} "
                                    "still running): the cluster may be short of free CPUs, "
                                    "or a cell hangs (see `ray status`).")
                try:
                    yield ray.get(done[0])
                except ray.exceptions.RayTaskError as exc:
                    if isinstance(exc.cause, MarlError):
                        raise exc.cause from None  # the cell's own error, as in-process
                    raise
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
