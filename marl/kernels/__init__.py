"""Pure tensor kernels for credit assignment and token costs (no I/O, logging or config).

Each kernel has a plain-loop twin in :mod:`marl.kernels.reference`; the group and broadcast
kernels also have Triton twins (:mod:`marl.kernels.triton_kernels`) used on CUDA tensors.
"""

from marl.kernels.advantages import (
    BASELINES,
    agent_scale,
    anchor_advantages,
    dense_group_index,
    dense_rank,
    group_advantages,
    group_key,
)
from marl.kernels.broadcast import broadcast_to_tokens
from marl.kernels.costs import TokenCosts, token_costs
from marl.kernels.gae import gae
from marl.kernels.multiturn import gigpo_step_advantages, node_depth, tree_returns
from marl.kernels.scan import discounted_reverse_cumsum, masked_reverse_cumsum
from marl.kernels.shapley import (
    ValueFn,
    coalition_index,
    difference_rewards,
    random_orders,
    shapley_exact,
    shapley_mc,
    shapley_weights,
)

__all__ = [
    "BASELINES",
    "TokenCosts",
    "ValueFn",
    "agent_scale",
    "anchor_advantages",
    "broadcast_to_tokens",
    "coalition_index",
    "dense_group_index",
    "dense_rank",
    "difference_rewards",
    "discounted_reverse_cumsum",
    "gae",
    "gigpo_step_advantages",
    "group_advantages",
    "group_key",
    "masked_reverse_cumsum",
    "node_depth",
    "random_orders",
    "shapley_exact",
    "shapley_mc",
    "shapley_weights",
    "token_costs",
    "tree_returns",
]
