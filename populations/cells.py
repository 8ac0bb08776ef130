"""Sweep cells as Ray tasks (``marl sweep --ray``): one CPU each, on a local Ray sized to
the machine or on a cluster (``--address`` / ``RAY_ADDRESS``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import ray

from marl.cluster import ray_session
from marl.sweep.run import Job, run_cell


def _run(job: Job) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # one CPU per task, as Ray reserved
    return run_cell(job)


def execute_on_ray(jobs: Sequence[Job], address: str | None = None) -> Iterator[dict[str, Any]]:
    """Rows of the jobs as they finish, each cell a Ray task."""
    with ray_session(address):
        task = ray.remote(num_cpus=1, max_retries=0)(_run)
        pending = [task.remote(job) for job in jobs]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
