"""A Ray session for whatever runs on Ray (populations, sweep cells, the RLlib baseline): an
embedded local Ray sized to the machine, or an existing cluster (``--address`` or
``RAY_ADDRESS``). Ray itself is imported only when a session opens."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Quiet, local-only Ray (FIELD-NOTES): no auth token written under $HOME, no usage
#: stats, no Tune config tables on the terminal.
QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AIR_NEW_OUTPUT": "0"}


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None,
                num_gpus: int | None = None,
                object_store_bytes: int | None = None) -> Iterator[None]:
    """Connect to Ray for the duration of the block: to ``address`` (or ``RAY_ADDRESS``)
    when given, else to a local Ray with ``num_cpus`` (default: every core). A session
    that is already connected (a test fixture, a notebook) is used as it is and left
    running."""
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
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), num_gpus=num_gpus,
                 object_store_memory=object_store_bytes, include_dashboard=False,
                 log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
