"""Play episodes of a team with its policies and summarise them (``marl run``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl.costing import predict_team, prediction_json
from marl.errors import MarlError
from marl.ledger import Ledger
from marl.policies import BACKENDS, Policy, build_policy
from marl.rollout import collect
from marl.team import Team
from orchestration.hints import did_you_mean, listing


def build_policies(team: Team, override: str | None = None, seed: int = 0,
                   checkpoint: Path | None = None) -> dict[str, Policy]:
    """One policy object per scenario policy (agents sharing a policy share it), keyed by
    agent id. ``override`` replaces every policy's backend (e.g. ``random``);
    ``checkpoint`` is a directory with one trained-weights folder per policy name."""
    if override is not None and override not in BACKENDS:
        raise MarlError(f"unknown --policy {override!r}.{did_you_mean(override, list(BACKENDS))}"
                        f" Valid: {listing(list(BACKENDS))}.")
    if checkpoint is not None and not Path(checkpoint).is_dir():
        raise MarlError(f"--checkpoint {checkpoint}: no such directory; pass a run's "
                        "checkpoint folder (it holds one folder per policy).")
    by_name: dict[str, Policy] = {}
    for i, (name, spec) in enumerate(team.scenario.policies.items()):
        if override is not None:
            spec = spec.model_copy(update={"backend": override})
        weights = Path(checkpoint) / name if checkpoint is not None else None
        if weights is not None and not weights.is_dir():
            weights = None  # this policy was not trained (e.g. scripted)
        by_name[name] = build_policy(spec, team.task, seed=seed * 1000 + i, checkpoint=weights)
    return {a.id: by_name[a.policy] for a in team.agents}


@dataclass
class RunResult:
    team: Team
    episodes: list[dict[str, Any]] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)
    wall_s: float = 0.0


def run(team: Team, episodes: int, seed: int | None = None, policy: str | None = None,
        checkpoint: Path | None = None, batch_size: int = 64,
        on_episode: Callable[[int], None] | None = None) -> RunResult:
    """Play ``episodes`` episodes through the batched rollout engine, ``batch_size`` at a
    time; same seed, same results."""
    if episodes < 1:
        raise MarlError(f"--episodes must be at least 1, got {episodes}.")
    seed = team.scenario.seed if seed is None else seed
    policies = build_policies(team, policy, seed, checkpoint)
    out = RunResult(team)
    start = time.perf_counter()
    while len(out.episodes) < episodes:
        n = min(batch_size, episodes - len(out.episodes))
        batch = collect(team, policies, n, seed=seed, first_instance=len(out.episodes))
        out.episodes.extend(batch.records)
        out.ledger.extend(batch.rows)
        if on_episode:
            on_episode(len(out.episodes))
    out.wall_s = time.perf_counter() - start
    return out


def summarize(result: RunResult, policy: str | None = None) -> dict[str, Any]:
    """``summary.json``: success, reward, tokens and cost per episode, in total and per agent."""
    team, n = result.team, len(result.episodes)
    ledger = result.ledger

    def mean(key: str) -> float:
        return sum(float(e[key]) for e in result.episodes) / n

    def per_episode(counts) -> dict[str, float]:
        return {k: v / n for k, v in counts.as_dict().items()}

    costs = ledger.cost_per_agent()
    calls = [m for e in result.episodes for m in e["transcript"]]

    def rate(key: str, agent: str) -> float:
        mine = [m[key] for m in calls if m["agent"] == agent]
        return sum(mine) / len(mine)

    predicted = prediction_json(team, predict_team(team, backend=policy), backend=policy)
    sides = {}
    if team.competitive:  # every team's own figures; the top-level ones are the first team's
        for side in team.sides:
            mine = [e["sides"][side] for e in result.episodes]
            sides[side] = {"success_rate": sum(bool(x["success"]) for x in mine) / n,
                           "score_mean": sum(x["score"] for x in mine) / n,
                           "reward_mean": sum(x["reward"] for x in mine) / n,
                           "tokens_per_episode": sum(x["tokens"] for x in mine) / n}
    return {
        "scenario": team.name,
        "policy": policy or {name: p.backend for name, p in team.scenario.policies.items()},
        "episodes": n,
        "success_rate": sum(bool(e["success"]) for e in result.episodes) / n,
        "reward_mean": mean("reward"),
        "score_mean": mean("score"),
        "token_penalty_mean": mean("token_penalty"),
        "tokens_per_episode": per_episode(ledger.total()),
        "cost_usd_per_episode": float(ledger.cost() / n),
        "cost_usd_total": str(ledger.cost()),
        "per_agent": {a: {**per_episode(c), "cost_usd_per_episode": float(costs[a] / n)}
                      for a, c in ledger.per_agent().items()},
        "format_valid_rate": {a: rate("valid", a) for a in team.ids},
        "oracle_agreement": {a: rate("oracle_agrees", a) for a in team.ids},
        "per_edge": {f"{u}->{v}": t / n for (u, v), t in ledger.per_edge().items()},
        "predicted_tokens_per_episode": predicted["tokens_per_episode"],
        "tokens_per_s": ledger.total().completion / result.wall_s if result.wall_s else None,
        "wall_s": result.wall_s,
        "episodes_per_s": n / result.wall_s if result.wall_s > 0 else None,
        **({"sides": sides} if sides else {}),
    }

