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

from marl.algorithms.magrpo import MAGRPO
from marl.kernels import group_advantages, group_key
from marl.rollout import EpisodeBatch


class GRPO(MAGRPO):
    def returns(self, batch: EpisodeBatch, seed: int) -> torch.Tensor:
        own_tokens = (batch.ledger["prompt"] + batch.ledger["completion"]).sum(1)  # (B, N)
        penalty = float(self.team.penalty_per_1k) * own_tokens.float() / 1000
        if self.cfg.credit == "team":
            return batch.score[:, None] - penalty
        return super().returns(batch, seed) + batch.token_penalty[:, None] / len(
            batch.agents) - penalty

    def advantages(self, batch: EpisodeBatch, seed: int) -> torch.Tensor:
        ret = self.returns(batch, seed)
        b, n = ret.shape
        keys = group_key(batch.group_ids.repeat_interleave(n), torch.arange(n).repeat(b))
        return group_advantages(ret.reshape(-1), keys, self.cfg.baseline).view(b, n)
