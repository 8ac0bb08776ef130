"""Interventions that need the policies: replays of a checkpoint through the rollout engine.

- **Causal influence of each edge** u→v: play ``episodes`` episodes; then, for every
  message ``c`` that u sent in them (with its empirical probability), replay each episode
  ``samples`` times with every agent repeating what it said, except that u says ``c`` and v
  acts live at the call that reads u. ``p(v's output | do(c))`` per episode gives the causal
  influence of communication (:func:`marl.analysis.emergence.causal_influence`). Every
  intervention draws the same random numbers (the same seeds), so a listener that ignores
  the message gives the same outputs under every ``c`` and scores exactly 0.
- **Counterfactual importance of each agent**: greedy replays of the same instances with
  the agent muted (it sends nothing); the share of episodes whose team answer changes.
  Tokens delivered over an agent's out-edges in episodes where muting it changed nothing
  are tokens that *bought nothing*.

Replays cost tokens like any episode; the result says how many, what they would cost at
the scenario's prices, and how long they took. This is the only analysis module that
imports torch (through the rollout engine).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from marl import seeds
from marl.algorithms.credit import Muted
from marl.analysis.emergence import causal_influence, counterfactual_importance
from marl.cost.ledger import LedgerRow
from marl.policies import Completion, Policy, Request
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import Team


class Replayed(Policy):
    """Says what an agent said in recorded episodes: ``said[b][n]`` is its message in row
    ``b`` of the batch at its ``n``-th call; call ``live`` (if any) goes to ``policy``.

    One agent per object: the engine then hands its requests over in row order.
    """

    def __init__(self, said: Sequence[Sequence[str]], policy: Policy, live: int | None = None):
        self.said, self.policy, self.live, self.calls = said, policy, live, 0
        self.tokenizer = policy.tokenizer

    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        n, self.calls = self.calls, self.calls + 1
        if n == self.live:
            return self.policy.generate(requests, greedy=greedy)
        if len(requests) != len(self.said):
            raise RuntimeError(f"a replay expected {len(self.said)} requests, got "
                               f"{len(requests)}.")
        return [Completion(self.said[b][n]) for b in range(len(requests))]

    def reseed(self, seed: int) -> None:
        self.policy.reseed(seed)

    def rollout(self, calls_per_round: int) -> AbstractContextManager[None]:
        return self.policy.rollout(calls_per_round)


def _said(records: Sequence[dict[str, Any]], agent: str, repeat: int) -> list[list[str]]:
    """``[row][call]``: the agent's messages, each episode repeated ``repeat`` times."""
    own = [[m["message"] for m in r["transcript"] if m["agent"] == agent] for r in records]
    return [calls for calls in own for _ in range(repeat)]


def edge_influence(team: Team, policies: dict[str, Policy], base: list[dict[str, Any]],
                   edge: tuple[str, str, int], samples: int,
                   seed: int) -> tuple[float, list[LedgerRow]]:
    """The causal influence of ``edge = (u, v, delay)``, and the replays' ledger rows."""
    u, v, delay = edge
    rnd = 0 if delay == 0 else team.rounds - 1 - delay  # the last round u's message is read
    if rnd < 0:
        return 0.0, []
    call_u, call_v = rnd, rnd + delay  # every agent acts once per round
    sent = Counter(_said(base, u, 1)[e][call_u] for e in range(len(base)))
    messages = sorted(sent)
    rows: list[LedgerRow] = []
    outputs = []  # [c][row] v's output at the call that reads u
    for c in messages:
        said = {a: _said(base, a, samples) for a in team.ids}
        for calls in said[u]:
            calls[call_u] = c
        acting = {a: Replayed(said[a], policies[a], live=call_v if a == v else None)
                  for a in team.ids}
        replay = collect(team, acting, len(base), samples, seed=seed)
        rows += replay.rows
        outputs.append([_said([r], v, 1)[0][call_v] for r in replay.records])
    answers = sorted({o for per_c in outputs for o in per_c})
    index = {a: i for i, a in enumerate(answers)}
    p = np.zeros((len(base), len(messages), len(answers)))
    for ci, per_c in enumerate(outputs):
        for row, out in enumerate(per_c):
            p[row // samples, ci, index[out]] += 1.0 / samples
    weights = np.array([sent[c] for c in messages], dtype=float) / len(base)
    return causal_influence(weights, p), rows


def agent_importance(team: Team, policies: dict[str, Policy], episodes: int,
                     seed: int) -> tuple[dict[str, Any], list[LedgerRow]]:
    """Greedy replays with each agent muted: per agent the share of episodes whose team
    answer changed, and the share of edge tokens that bought nothing."""
    base = collect(team, policies, episodes, seed=seed, greedy=True)
    rows = list(base.rows)
    changed = np.zeros((episodes, len(team.ids)), dtype=bool)
    for i, agent in enumerate(team.ids):
        muted = collect(team, {**policies, agent: Muted()}, episodes, seed=seed, greedy=True)
        rows += muted.rows
        changed[:, i] = [a["answer"] != b["answer"]
                         for a, b in zip(base.records, muted.records, strict=True)]
    wasted: dict[str, float] = {}
    delivered: dict[str, float] = {}
    for e, rec in enumerate(base.records):
        for row in rec["ledger"]:
            for src, tokens in row["received"].items():
                key = f"{src}->{row['agent']}"
                delivered[key] = delivered.get(key, 0.0) + tokens
                if not changed[e, team.ids.index(src)]:
                    wasted[key] = wasted.get(key, 0.0) + tokens
    total = sum(delivered.values())
    importance = counterfactual_importance(changed)
    return {"importance": {a: float(x) for a, x in zip(team.ids, importance, strict=True)},
            "wasted_share": sum(wasted.values()) / total if total else 0.0,
            "wasted_share_per_edge": {k: wasted.get(k, 0.0) / t for k, t in delivered.items()
                                      if t}}, rows


def interventions(team: Team, checkpoint: Path, episodes: int = 64, samples: int = 8,
                  seed: int = 0) -> dict[str, Any]:
    """Causal influence of every edge and counterfactual importance of every agent for the
    policies in ``checkpoint``, with what the replays cost."""
    start = time.perf_counter()
    stream = seeds.derive_seed(seed, seeds.ANALYSIS)
    policies = build_policies(team, seed=seed, checkpoint=checkpoint)
    base = collect(team, policies, episodes, seed=stream)
    rows = list(base.rows)
    influence = {}
    for u, v, delay in team.topo.edges():
        value, spent = edge_influence(team, policies, base.records, (u, v, delay), samples,
                                      stream)
        influence[f"{u}->{v}"] = value
        rows += spent
    importance, spent = agent_importance(team, policies, episodes, stream)
    rows += spent
    return {"checkpoint": str(checkpoint), "episodes": episodes, "samples": samples,
            "seed": seed, "causal_influence": influence, **importance,
            "replay_cost": {"tokens": sum(r.prompt_tokens + r.completion_tokens for r in rows),
                            "cost_usd": float(sum((r.cost_usd for r in rows), Decimal(0))),
                            "wall_s": time.perf_counter() - start}}



def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """A training run's kept checkpoints, ``(iteration, path)`` in order: the team after
    the warm-up as iteration 0, then the kept RL checkpoints."""
    warmup = Path(run_dir) / "checkpoints" / "warmup"
    found = [(0, warmup)] if warmup.is_dir() else []
    for path in (Path(run_dir) / "checkpoints").glob("iter_*"):
        if path.is_dir() and path.name[5:].isdigit():
            found.append((int(path.name[5:]), path))
    return sorted(found)


def replay_run(run_dir: Path, episodes: int, samples: int, seed: int,
               log: Any = print) -> list[dict[str, Any]]:
    """:func:`interventions` at every kept checkpoint of a training run, each cached in
    ``RUN/analysis/`` (a second analysis reads it back instead of replaying)."""
    import json

    from marl.io import atomic_write_json
    from marl.team import load_team

    team = load_team(Path(run_dir) / "scenario.yaml")
    out = []
    for iteration, path in checkpoints(run_dir):
        cache = Path(run_dir) / "analysis" / f"replay_{path.name}_e{episodes}_k{samples}_" \
                                             f"s{seed}.json"
        if cache.is_file():
            result = json.loads(cache.read_text())
        else:
            result = interventions(team, path, episodes, samples, seed)
            atomic_write_json(cache, result)
            spent = result["replay_cost"]
            log(f"{run_dir}: replayed {path.name}: {spent['tokens']:,} tokens "
                f"(${spent['cost_usd']:.6f} at the scenario's prices) in "
                f"{spent['wall_s']:.1f} s")
        out.append({**result, "iteration": iteration})
    return out
