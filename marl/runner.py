"""Play episodes of a team with its policies and summarise them (``marl run``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from marl.costing import predict_team, prediction_json
from marl.env import TeamEnv
from marl.errors import MarlError
from marl.ledger import Ledger
from marl.policies import BACKENDS, Policy, Request, policy_class
from marl.team import Team
from orchestration.hints import did_you_mean, listing


def build_policies(team: Team, override: str | None = None, seed: int = 0) -> dict[str, Policy]:
    """One policy object per scenario policy (agents sharing a policy share it), keyed by
    agent id. ``override`` replaces every policy's backend (e.g. ``random``)."""
    if override is not None and override not in BACKENDS:
        raise MarlError(f"unknown --policy {override!r}.{did_you_mean(override, list(BACKENDS))}"
                        f" Valid: {listing(list(BACKENDS))}.")
    by_name: dict[str, Policy] = {}
    for i, (name, spec) in enumerate(team.scenario.policies.items()):
        backend = override or spec.backend
        by_name[name] = policy_class(backend)(team.task, seed=seed * 1000 + i)
    return {a.id: by_name[a.policy] for a in team.agents}


def play_episode(env: TeamEnv, policies: dict[str, Policy]) -> dict[str, Any]:
    """Play one episode; returns its record (answer, score, transcript, ledger rows)."""
    obs, infos = env.reset()
    while env.agents:
        groups: dict[int, tuple[Policy, list[Request]]] = {}
        for a in env.scheduled:
            policy = policies[a]
            req = Request(a, obs[a], infos[a]["final_call"])
            groups.setdefault(id(policy), (policy, []))[1].append(req)
        actions = {}
        for policy, reqs in groups.values():
            for req, out in zip(reqs, policy.generate(reqs), strict=True):
                actions[req.agent] = out.text
        obs, _, _, _, infos = env.step(actions)
    result = dict(env.result or {})
    result["cost_usd"] = str(result["cost_usd"])
    return {"episode": env.episode, **result, "transcript": env.transcript,
            "ledger": [r.to_json() for r in env.rows]}


@dataclass
class RunResult:
    team: Team
    episodes: list[dict[str, Any]] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)
    wall_s: float = 0.0


def run(team: Team, episodes: int, seed: int | None = None, policy: str | None = None,
        on_episode: Callable[[int], None] | None = None) -> RunResult:
    """Play ``episodes`` episodes; same seed, same results."""
    if episodes < 1:
        raise MarlError(f"--episodes must be at least 1, got {episodes}.")
    seed = team.scenario.seed if seed is None else seed
    env = TeamEnv(team, seed=seed)
    policies = build_policies(team, policy, seed)
    out = RunResult(team)
    start = time.perf_counter()
    for i in range(episodes):
        out.episodes.append(play_episode(env, policies))
        out.ledger.extend(env.rows)
        if on_episode:
            on_episode(i + 1)
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
    predicted = prediction_json(team, predict_team(team))
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
        "per_edge": {f"{u}->{v}": t / n for (u, v), t in ledger.per_edge().items()},
        "predicted_tokens_per_episode": predicted["tokens_per_episode"],
        "wall_s": result.wall_s,
        "episodes_per_s": n / result.wall_s if result.wall_s > 0 else None,
    }

