"""MAGRPO: multi-agent group-relative policy optimisation (Liu et al., AAAI 2026).

Each iteration plays G joint rollouts of every sampled task instance. The team return is
``R = score − penalty_per_1k · tokens / 1000`` and its group-relative advantage
``A_j = R_j − mean_g R_g`` (baseline ``mean``, no std division as in Dr. GRPO; ``mean_std``,
``loo`` and ``max`` selectable) is given to every agent (``credit: team``). Each policy is
then updated on its own agents' generated tokens only. With ``credit: difference`` or
``shapley`` the scores are split per agent by counterfactual replays before the baseline.

Where this departs from the paper: one clipped-ratio loss serves all algorithms (with one
epoch it is the paper's REINFORCE gradient), with a KL term to a reference, an entropy bonus
and the answer floor (:func:`marl.algorithms.common.pg_terms`); a model trained from scratch
first gets a format warm-up on the task's random messages (:mod:`marl.algorithms.warmup`),
not the oracle's. The oracle's messages can still be mixed in as demonstrations
(``sft_coef``), an opt-in that labels the run ``uses_oracle``.
"""

from __future__ import annotations

import torch

from marl.algorithms.common import (
    Trainable,
    oracle_episodes,
    policy_updates,
    rollout_cost,
    trainables,
)
from marl.algorithms.config import TrainConfig
from marl.algorithms.credit import agent_credit
from marl.cost.ledger import LedgerRow
from marl.errors import MarlError
from marl.kernels import agent_scale, anchor_advantages, group_advantages, group_key
from marl.rollout import EpisodeBatch
from marl.team import Team


def per_agent_advantages(ret: torch.Tensor, group_ids: torch.Tensor,
                         baseline: str) -> torch.Tensor:
    """``(B, N)`` advantages with one group per (instance, agent): ``ret`` is ``(B, N)``."""
    b, n = ret.shape
    keys = group_key(group_ids.repeat_interleave(n), torch.arange(n).repeat(b))
    return group_advantages(ret.reshape(-1), keys, baseline).view(b, n)


def call_advantages(batch: EpisodeBatch, ret: torch.Tensor, baseline: str) -> torch.Tensor:
    """``(B, K)`` advantages of ``credit: anchor``, one per call: :func:`anchor_advantages`
    over the batch, a call's state its slot (agent and round) and what it read, its action
    what it said; ``ret`` is ``(B, N)``, each agent's return."""
    b, k = len(batch.records), len(batch.call_agent)
    states: dict[tuple[int, str], int] = {}
    actions: dict[tuple[int, str], int] = {}
    state_ids, action_ids = [], []
    for e, record in enumerate(batch.records):
        for slot in range(k):
            state = states.setdefault((slot, batch.observations[e][slot]), len(states))
            said = record["transcript"][slot]["message"]
            state_ids.append(state)
            action_ids.append(actions.setdefault((state, said), len(actions)))
    calls = ret[:, batch.call_agent]  # (B, K): each call's agent's return
    adv = anchor_advantages(calls.reshape(-1), torch.tensor(state_ids),
                            torch.tensor(action_ids), scale=baseline == "mean_std")
    return adv.view(b, k)


def scaled(adv: torch.Tensor, ret: torch.Tensor, batch: EpisodeBatch,
           cfg: TrainConfig) -> torch.Tensor:
    """``adv`` (``(B, N)``, or ``(B, K, L)`` per call) divided by each agent's
    :func:`agent_scale` with ``advantage_scale: agent``; unchanged with ``none``."""
    if cfg.advantage_scale == "none":
        return adv
    scale = agent_scale(ret)  # (N,)
    if adv.dim() == 2:
        return adv / scale
    return adv / scale[batch.call_agent][None, :, None]


class MAGRPO:
    def __init__(self, team: Team, policies: dict, cfg: TrainConfig):
        self.team, self.policies, self.cfg = team, policies, cfg
        if team.competitive and cfg.credit in ("difference", "shapley"):
            raise MarlError(f"credit: {cfg.credit} replays the team with agents muted, which is "
                            f"defined for one team; {team.name} has teams "
                            f"({', '.join(team.sides)}). Use credit: team.")
        self.trainables: list[Trainable] = trainables(team, policies, cfg)
        self.sft_coef = cfg.sft_coef
        self.replays: list[LedgerRow] = []  # counterfactual rollouts of the current update

    def scores(self, batch: EpisodeBatch, seed: int) -> torch.Tensor:
        """``(B, N)``: the team score for every agent, or its counterfactual credit."""
        if self.cfg.credit in ("team", "anchor"):  # every agent: its team's (side's) score
            return batch.agent_score
        episodes = len(batch.records) // self.cfg.group_size
        credit, rows = agent_credit(self.cfg.credit, self.team, self.policies, batch.score,
                                    episodes, self.cfg.group_size, seed)
        self.replays += rows
        return credit

    def penalties(self, batch: EpisodeBatch) -> torch.Tensor:
        """``(B, N)``: the team's token penalty, shared equally when credit is per agent."""
        if self.cfg.credit in ("team", "anchor"):
            return batch.agent_penalty
        return (batch.token_penalty / len(batch.agents))[:, None].expand(-1, len(batch.agents))

    def returns(self, batch: EpisodeBatch, seed: int) -> torch.Tensor:
        """``(B, N)``: each agent's return."""
        return self.scores(batch, seed) - self.penalties(batch)

    def advantages(self, batch: EpisodeBatch, seed: int) -> torch.Tensor:
        ret = self.returns(batch, seed)  # (B, N)
        return scaled(self.relative_advantages(batch, ret), ret, batch, self.cfg)

    def relative_advantages(self, batch: EpisodeBatch, ret: torch.Tensor) -> torch.Tensor:
        """``(B, N)`` per-agent advantages from returns ``ret``, or ``(B, K, L)`` per token."""
        n = ret.shape[1]
        if self.cfg.credit == "anchor":  # (B, K, L): every token of a call, its call's
            adv = call_advantages(batch, ret, self.cfg.baseline)
            return adv[:, :, None].expand(-1, -1, batch.tokens.shape[2])
        if self.cfg.credit == "team" and not self.team.competitive:  # one group per instance
            adv = group_advantages(ret[:, 0], batch.group_ids, self.cfg.baseline)
            return adv[:, None].expand(-1, n)
        return per_agent_advantages(ret, batch.group_ids, self.cfg.baseline)

    def update(self, batch: EpisodeBatch, seed: int,
               learning: set[str] | None = None) -> dict[str, float]:
        self.replays = []
        adv = self.advantages(batch, seed)
        stats: dict[str, float] = rollout_cost("counterfactual", self.replays)
        oracle = (oracle_episodes(self.team, self.policies, self.cfg.demo_episodes, seed)
                  if self.cfg.demo_episodes and self.sft_coef > 0 else None)
        stats.update(rollout_cost("demo", oracle.rows if oracle is not None else []))
        stats.update(policy_updates(self.trainables, self.team, batch, adv, self.cfg,
                                    self.sft_coef, oracle, seed, learning))
        stats["sft_coef"] = self.sft_coef
        self.sft_coef *= self.cfg.sft_decay
        return stats

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [t.optimizer for t in self.trainables]

    def state_dict(self) -> dict:
        return {"sft_coef": self.sft_coef,
                "optimizers": {t.name: t.optimizer.state_dict() for t in self.trainables}}

    def load_state_dict(self, state: dict) -> None:
        self.sft_coef = state["sft_coef"]
        for t in self.trainables:
            t.optimizer.load_state_dict(state["optimizers"][t.name])
