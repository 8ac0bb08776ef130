"""Play episodes of a team with its policies and summarise them (``marl run``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marl.cost.ledger import Ledger
from marl.cost.predict import MODEL_BACKENDS, predict_team, prediction_json
from marl.errors import MarlError
from marl.policies import API_BACKENDS, BACKENDS, Policy, TeamBuild, build_policy
from marl.rollout import collect
from marl.team import Team

if TYPE_CHECKING:
    from marl.policies.api_cache import ResponseCache
from orchestration.hints import did_you_mean, listing


def build_policies(team: Team, override: str | None = None, seed: int = 0,
                   checkpoint: Path | None = None, cache: Path | ResponseCache | None = None
                   ) -> dict[str, Policy]:
    """One policy object per scenario policy (agents sharing a policy share it), keyed by
    agent id. ``override`` replaces every policy's backend (e.g. ``random``);
    ``checkpoint`` is a directory with one trained-weights folder per policy name;
    ``cache`` a directory (or a :class:`ResponseCache` on one, to set its size cap) where
    API policies store their responses and answer repeated requests from (other backends
    ignore it)."""
    if override is not None and override not in BACKENDS:
        raise MarlError(f"unknown --policy {override!r}.{did_you_mean(override, list(BACKENDS))}"
                        f" Valid: {listing(list(BACKENDS))}.")
    if checkpoint is not None and not Path(checkpoint).is_dir():
        raise MarlError(f"--checkpoint {checkpoint}: no such directory; pass a run's "
                        "checkpoint folder (it holds one folder per policy).")
    specs = {name: spec.model_copy(update={"backend": override}) if override else spec
             for name, spec in team.scenario.policies.items()}
    if checkpoint is not None:
        _check_complete(team, specs, Path(checkpoint))
    by_name: dict[str, Policy] = {}
    bases: dict = {}  # checkpoints the team's LoRA policies share
    for i, (name, spec) in enumerate(specs.items()):
        weights = Path(checkpoint) / name if checkpoint is not None else None
        if weights is not None and not weights.is_dir():
            weights = None  # this policy was not trained (e.g. scripted)
        by_name[name] = build_policy(spec, team.task, seed=seed * 1000 + i, checkpoint=weights,
                                     team=TeamBuild(name, bases))
    if cache is not None:
        from marl.policies.api import APIPolicy
        from marl.policies.api_cache import ResponseCache

        store = cache if isinstance(cache, ResponseCache) else ResponseCache(cache)
        for p in by_name.values():
            if isinstance(p, APIPolicy):
                p.cache = store
    return {a.id: by_name[a.policy] for a in team.agents}


def _check_complete(team: Team, specs: dict, checkpoint: Path) -> None:
    """Refuse a checkpoint without the weights of a model policy that an agent plays: it
    would silently play fresh, untrained weights."""
    played = {a.policy for a in team.agents}
    missing = [name for name, spec in specs.items() if name in played
               and spec.backend in MODEL_BACKENDS and not (checkpoint / name).is_dir()]
    if missing:
        held = sorted(p.name for p in checkpoint.iterdir() if p.is_dir())
        raise MarlError(f"--checkpoint {checkpoint} holds no weights for polic"
                        f"{'ies' if len(missing) > 1 else 'y'} {listing(missing)} (it holds "
                        f"{listing(held) if held else 'no policy folder'}); pass a complete "
                        "checkpoint of this scenario's run, e.g. runs/NAME/checkpoints/best.")


@dataclass
class RunResult:
    team: Team
    episodes: list[dict[str, Any]] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)
    wall_s: float = 0.0
    #: The policies played, by agent id (API policies carry their request statistics).
    policies: dict[str, Policy] = field(default_factory=dict)
    requested: int = 0
    #: Why the run stopped before ``requested`` episodes (``"budget"``), else None.
    stopped: str | None = None
    #: The cost model's worst case of one episode, which the budget check uses.
    worst_episode_usd: Decimal = Decimal(0)
    #: Seconds the task took to score the answers (its verifier), and the split played.
    verify_s: float = 0.0
    split: str = "train"


#: For API teams, the budget's worst case of an episode is at least this multiple of the
#: dearest episode the server billed so far (our token counts miss its chat template).
API_HEADROOM = Decimal("1.25")


def affordable(budget: Decimal, spent: Decimal, worst: Decimal, n: int) -> int:
    """How many of ``n`` episodes, at a worst case of ``worst`` USD each, fit in what is
    left of ``budget`` after ``spent`` (all of them when an episode is free).

    >>> affordable(Decimal("1.0"), Decimal("0.25"), Decimal("0.2"), 8)
    3
    >>> affordable(Decimal("1.0"), Decimal("0.9"), Decimal("0.2"), 8)
    0
    """
    if worst <= 0:
        return n
    return max(0, min(n, int((budget - spent) // worst)))


def run(team: Team, episodes: int, seed: int | None = None, policy: str | None = None,
        checkpoint: Path | None = None, batch_size: int = 64,
        on_episode: Callable[[int], None] | None = None,
        cache: Path | ResponseCache | None = None, split: str | None = None) -> RunResult:
    """Play ``episodes`` episodes of the task's ``split`` (default: the one evaluations
    play, :attr:`Task.eval_split`) through the batched rollout engine, ``batch_size`` at a
    time; same seed, same results.

    With ``costs.budget_usd``, a batch is played only if its worst case (the cost model's
    prediction per episode, an upper bound, times its episodes) fits in what the episodes
    played so far left of the budget; a batch that does not fit shrinks, down to one
    episode, and when not even one fits the run stops (``stopped == "budget"``). The
    spend counted is the ledger's (cached API responses included), so a replay from the
    cache stops where the original run did. API predictions are estimates (the server's
    tokenizer and chat template are not ours), so a budgeted API team plays its first
    episode alone and then takes as worst case the larger of the estimate and
    ``API_HEADROOM`` times the dearest episode billed so far."""
    if episodes < 1:
        raise MarlError(f"--episodes must be at least 1, got {episodes}.")
    seed = team.scenario.seed if seed is None else seed
    budget = team.scenario.costs.budget_usd
    worst = predict_team(team, backend=policy).cost
    if budget is not None and affordable(budget, Decimal(0), worst, 1) == 0:
        raise MarlError(f"costs.budget_usd {budget} is below the worst-case cost of one "
                        f"episode, {worst:.6g} USD (marl cost shows it); raise the budget "
                        "or lower max_new_tokens.")
    split = split or team.task.eval_split
    if split not in team.task.splits:
        raise MarlError(f"--split {split!r}: {team.task.id} has the splits "
                        f"{', '.join(team.task.splits)}.")
    policies = build_policies(team, policy, seed, checkpoint, cache)
    out = RunResult(team, policies=policies, requested=episodes, worst_episode_usd=worst,
                    split=split)
    api = any((policy or spec.backend) in API_BACKENDS
              for spec in team.scenario.policies.values())
    start = time.perf_counter()
    while len(out.episodes) < episodes:
        n = min(batch_size, episodes - len(out.episodes))
        if budget is not None:
            if api and not out.episodes:  # our estimate misses the server's template
                n = 1                         # tokens: calibrate it on one episode first
            elif api:
                billed = max(Decimal(e["cost_usd"]) for e in out.episodes)
                worst = out.worst_episode_usd = max(worst, API_HEADROOM * billed)
            n = affordable(budget, out.ledger.cost(), worst, n)
            if n == 0:
                out.stopped = "budget"
                break
        batch = collect(team, policies, n, seed=seed, first_instance=len(out.episodes),
                        split=split)
        out.verify_s += batch.verify_s
        out.episodes.extend(batch.records)
        out.ledger.extend(batch.rows)
        if on_episode:
            on_episode(len(out.episodes))
    out.wall_s = time.perf_counter() - start
    return out


def api_figures(result: RunResult) -> dict[str, Any]:
    """What the run's API policies did: per policy their request statistics, and in total
    the USD actually paid in this process (calls answered from the cache cost nothing
    here, though their episodes are charged what they cost when first sent), cache hits
    and retries. Nothing when no policy is an API policy."""
    from marl.policies.api import APIPolicy

    team, stats, paid = result.team, {}, Decimal(0)
    for a in team.agents:
        p = result.policies.get(a.id)
        if isinstance(p, APIPolicy) and a.policy not in stats:
            stats[a.policy] = p.stats.to_json()
            paid += team.prices[a.id].cost(*p.stats.paid)
    if not stats:
        return {}
    return {"api": stats, "api_usd_spent": float(paid), "api_usd_spent_exact": str(paid),
            "cache_hits": sum(s["cache_hits"] for s in stats.values()),
            "api_retries": sum(s["retries"] for s in stats.values())}


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
        **({"oracle_agreement": {a: rate("oracle_agrees", a) for a in team.ids}}
           if team.task.provides("oracle") else {}),
        "per_edge": {f"{u}->{v}": t / n for (u, v), t in ledger.per_edge().items()},
        "predicted_tokens_per_episode": predicted["tokens_per_episode"],
        "tokens_per_s": ledger.total().completion / result.wall_s if result.wall_s else None,
        "wall_s": result.wall_s,
        "episodes_per_s": n / result.wall_s if result.wall_s > 0 else None,
        "failed_episodes": sum(1 for e in result.episodes if e.get("error")),
        **({"sides": sides} if sides else {}),
        **_scoring_figures(result),
        **_budget_figures(result),
        **api_figures(result),
    }


def _scoring_figures(result: RunResult) -> dict[str, Any]:
    """The split played (when the task has several), the episodes scored 0 for a reason and
    the time scoring took (when the task reports them)."""
    splits = {"split": result.split} if result.split != "train" else {}
    reasons = sum("score_reason" in e for e in result.episodes)
    if not result.verify_s and not reasons:
        return splits
    return {**splits, "unscored_episodes": reasons, "verify_s_total": result.verify_s,
            "verify_s_per_episode": result.verify_s / len(result.episodes)}


def _budget_figures(result: RunResult) -> dict[str, Any]:
    budget = result.team.scenario.costs.budget_usd
    if budget is None:
        return {}
    return {"budget_usd": float(budget), "episodes_requested": result.requested,
            "worst_episode_usd": float(result.worst_episode_usd),
            **({"stopped": result.stopped} if result.stopped else {})}


def write_run(target: Path, result: RunResult, summary: dict[str, Any]) -> None:
    """A ``marl run`` directory: ``episodes.jsonl``, ``scenario.yaml`` (the team as played)
    and ``summary.json``, each written atomically, the summary last."""
    from marl.io import atomic_write_json, atomic_write_jsonl, atomic_write_text

    atomic_write_jsonl(target / "episodes.jsonl", result.episodes)
    atomic_write_text(target / "scenario.yaml", result.team.to_yaml())
    atomic_write_json(target / "summary.json", summary)
