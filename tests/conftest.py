import torch

# Tests use tiny tensors: on a small machine, torch's intra-op threads cost more than they
# save, and they contend with pytest-xdist workers.
torch.set_num_threads(1)
