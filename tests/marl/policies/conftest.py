import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tensors here are tiny: extra intra-op threads only wait on each other, and on a
    busy 2-core machine that turns milliseconds into seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
