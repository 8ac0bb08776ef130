import os

import pytest
import torch

# Tests use tiny tensors: on a small machine, torch's intra-op threads cost more than they
# save, and they contend with pytest-xdist workers.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def ray_local(tmp_path_factory):
    """One local Ray for the whole test session: 2 CPUs, a small object store, quiet."""
    from marl.cluster import QUIET

    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    import ray

    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False,
             log_to_driver=False, _temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield ray
    ray.shutdown()
