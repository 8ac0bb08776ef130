"""Per-agent credit from counterfactual replays: the same task instances and sampling
seeds, with some agents muted (they send empty messages).

``coalition_scores`` replays a batch once per coalition ``S`` (agents outside ``S`` muted)
and returns ``v(S)`` per episode; difference rewards are ``v(all) − v(all ∖ {i})`` and
Shapley values come from the full table through :func:`marl.kernels.shapley_exact`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from marl.cost.ledger import LedgerRow
from marl.errors import MarlError
from marl.kernels import difference_rewards, shapley_exact
from marl.policies import Completion, Policy, Request
from marl.rollout import collect
from marl.team import Team

MAX_SHAPLEY_AGENTS = 8


class Muted(Policy):
    """Sends nothing: the counterfactual "agent i contributes no message"."""

    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        return [Completion("") for _ in requests]


def coalition_scores(team: Team, policies: dict[str, Policy], masks: list[int], episodes: int,
                     group_size: int, seed: int) -> tuple[torch.Tensor, list[LedgerRow]]:
    """``(B, len(masks))``: team score when only the agents whose bit is set in a mask act,
    and the ledger rows of every replay (what the counterfactuals cost)."""
    muted = Muted()
    cols, rows = [], []
    for m in masks:
        acting = {a: (p if m >> team.topo.index[a] & 1 else muted) for a, p in policies.items()}
        replay = collect(team, acting, episodes, group_size, seed=seed)
        cols.append(replay.score)
        rows += replay.rows
    return torch.stack(cols, dim=1), rows


def agent_credit(kind: str, team: Team, policies: dict[str, Policy], full: torch.Tensor,
                 episodes: int, group_size: int,
                 seed: int) -> tuple[torch.Tensor, list[LedgerRow]]:
    """``(B, N)`` per-agent credit for the batch whose scores are ``full (B,)``, and the
    ledger rows of the replays it took."""
    n = len(team.ids)
    everyone = (1 << n) - 1
    if kind == "difference":
        without, rows = coalition_scores(team, policies,
                                         [everyone ^ (1 << i) for i in range(n)], episodes,
                                         group_size, seed)
        return difference_rewards(full, without), rows
    if n > MAX_SHAPLEY_AGENTS:
        raise MarlError(f"credit: shapley replays 2^N coalitions; {n} agents is more than "
                        f"{MAX_SHAPLEY_AGENTS}. Use credit: difference for large teams.")
    table, rows = coalition_scores(team, policies, list(range(everyone)), episodes, group_size,
                                   seed)
    return shapley_exact(torch.cat([table, full[:, None]], dim=1)), rows
