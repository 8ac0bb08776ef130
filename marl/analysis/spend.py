"""What success costs: Pareto fronts, cumulative spend and where the tokens go.

Plain functions over numbers and ledger rows; no torch, so a report opens in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def pareto_front(costs: Sequence[float], values: Sequence[float]) -> list[int]:
    """Indices of the points that no other point dominates, by increasing cost.

    A point dominates another when it costs no more and is worth at least as much, and is
    strictly better in one of the two (lower cost, or higher value). Equal points are all
    on the front. NaN points are never on it.

    >>> pareto_front([1.0, 2.0, 3.0, 2.0], [0.5, 0.4, 0.9, 0.7])
    [0, 3, 2]
    >>> pareto_front([], [])
    []
    """
    if len(costs) != len(values):
        raise ValueError(f"{len(costs)} costs but {len(values)} values.")
    points = [(float(c), -float(v), i) for i, (c, v) in enumerate(zip(costs, values, strict=True))
              if c == c and v == v]
    front: list[int] = []
    best = float("inf")  # lowest -value seen so far (the highest value)
    last: tuple[float, float] | None = None
    for c, nv, i in sorted(points):
        if nv < best or (c, nv) == last:
            front.append(i)
            best = min(best, nv)
            last = (c, nv)
    return front


def cumulative(values: Iterable[float]) -> list[float]:
    """Running totals.

    >>> cumulative([1, 2, 3.5])
    [1.0, 3.0, 6.5]
    """
    out, total = [], 0.0
    for v in values:
        total += float(v)
        out.append(total)
    return out


def token_breakdown(ledgers: Iterable[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Mean tokens per episode by agent (prompt, cached, completion, USD), by edge (tokens
    delivered) and in total (``tokens`` = prompt + completion), from each episode's ledger
    rows as written in ``episodes.jsonl``.

    >>> rows = [{"agent": "a", "prompt_tokens": 5, "cached_tokens": 1, "completion_tokens": 2,
    ...          "cost_usd": "0.5", "received": {}},
    ...         {"agent": "b", "prompt_tokens": 7, "cached_tokens": 0, "completion_tokens": 1,
    ...          "cost_usd": "0.25", "received": {"a": 4}}]
    >>> out = token_breakdown([rows, rows])
    >>> out["per_agent"]["b"], out["per_edge"], out["episodes"]
    ({'prompt': 7.0, 'cached': 0.0, 'completion': 1.0, 'cost_usd': 0.25}, {'a->b': 4.0}, 2)
    >>> out["total"]["tokens"], out["total"]["cost_usd"]
    (15.0, 0.75)
    """
    agents: dict[str, dict[str, float]] = {}
    edges: dict[str, float] = {}
    n = 0
    for rows in ledgers:
        n += 1
        for r in rows:
            a = agents.setdefault(r["agent"], dict.fromkeys(
                ("prompt", "cached", "completion", "cost_usd"), 0.0))
            a["prompt"] += r["prompt_tokens"]
            a["cached"] += r["cached_tokens"]
            a["completion"] += r["completion_tokens"]
            a["cost_usd"] += float(r["cost_usd"])
            for src, tokens in r.get("received", {}).items():
                key = f"{src}->{r['agent']}"
                edges[key] = edges.get(key, 0.0) + tokens
    per_agent = {a: {k: v / n for k, v in c.items()} for a, c in agents.items()} if n else {}
    total = {k: sum(a[k] for a in per_agent.values())
             for k in ("prompt", "cached", "completion", "cost_usd")}
    return {"episodes": n, "per_agent": per_agent,
            "per_edge": {e: t / n for e, t in edges.items()} if n else {},
            "total": {**total, "tokens": total["prompt"] + total["completion"]}}
