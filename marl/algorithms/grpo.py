"""Independent GRPO: every agent is its own learner (Dr.MAS-style group key: instance ×
agent).

Agent i's return is the team score minus the token penalty of *its own* tokens, so each
agent optimises its own cost, not the team's. Advantages are normalised within the group
of the same instance and agent (baseline ``mean_std`` by default in
``configs/algorithm/grpo.yaml``: A = (R − mean) / (std + ε)). Updates are as in
:mod:`marl.algorithms.magrpo`.
"""

from __future__ import annotations

import torch

from marl.algorithms.magrpo import MAGRPO, per_agent_advantages
from marl.kernels import token_costs
from marl.rollout import EpisodeBatch


class GRPO(MAGRPO):
    def penalties(self, batch: EpisodeBatch) -> torch.Tensor:
        """``(B, N)``: the penalty for each agent's own prompt and completion tokens."""
        ledger = batch.ledger
        costs = token_costs(ledger["prompt"], ledger["cached"], ledger["completion"],
                            (0.0, 0.0, 0.0), float(self.team.penalty_per_1k))
        return costs.agent_penalty.float()

    def relative_advantages(self, batch: EpisodeBatch, ret: torch.Tensor) -> torch.Tensor:
        return per_agent_advantages(ret, batch.group_ids, self.cfg.baseline)
