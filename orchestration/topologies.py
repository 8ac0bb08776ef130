"""Topology generators: pure functions from agent ids to a ``networkx.DiGraph``.

An edge ``u -> v`` means *v reads u's message*. Every edge carries an int ``delay``:
``0`` is spatial (same round: v acts after u and reads u's message of this round),
``d >= 1`` is temporal (v reads u's message from d rounds earlier). Nodes are added in the
order of ``agents``, so ``list(G.nodes) == list(agents)``; there are no self-loops.

Every built-in generator except ``custom`` yields an acyclic spatial subgraph. Bad input
raises ``TopologyError`` naming the offending parameter in ``key``.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Sequence
from itertools import accumulate, pairwise
from numbers import Integral, Real
from typing import Any, Literal

import networkx as nx

from orchestration.hints import did_you_mean, listing

#: Largest edge delay: delays are stored in an int64 matrix, and a delay beyond the
#: longest episode (1000 rounds) would never deliver anything.
MAX_DELAY = 1000


class TopologyError(ValueError):
    """Invalid topology input; ``key`` names the offending parameter (e.g. ``"edges[2][1]"``)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def _list(value: Any, key: str, example: str) -> list[Any]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TopologyError(f"{key} must be a list, got {value!r}; write e.g. {example}.", key)
    return list(value)


def _agents(agents: Sequence[str]) -> list[str]:
    ids = _list(agents, "agents", "['lead', 'w1']")
    if not ids:
        raise TopologyError("agents is empty; a topology needs at least one agent id.", "agents")
    seen: dict[str, int] = {}
    for i, agent in enumerate(ids):
        if not isinstance(agent, str):
            raise TopologyError(
                f"agents[{i}]={agent!r} is of type {type(agent).__name__}; agent ids are strings "
                f"(quote it in YAML: '{agent}').",
                key=f"agents[{i}]",
            )
        if agent in seen:
            raise TopologyError(
                f"duplicate agent id {agent!r} at agents[{seen[agent]}] and agents[{i}]; "
                "agent ids must be unique, rename one.",
                key=f"agents[{i}]",
            )
        seen[agent] = i
    return ids


def _member(value: Any, ids: Sequence[str], key: str) -> str:
    if not isinstance(value, str) or value not in ids:
        raise TopologyError(
            f"{key}={value!r} is not one of the agents.{did_you_mean(value, ids)} "
            f"Use one of: {listing(ids)}.",
            key=key,
        )
    return value


def _int(value: Any, key: str, minimum: int, maximum: int | None = None) -> int:
    too_big = maximum is not None and isinstance(value, Integral) and value > maximum
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum or too_big:
        limit = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise TopologyError(f"{key}={value!r} is invalid; use an integer {limit}.", key)
    return int(value)


def _prob(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 <= value <= 1:
        raise TopologyError(f"{key}={value!r} is not a probability; use a number in [0, 1].", key)
    return float(value)


def _graph(ids: Sequence[str]) -> nx.DiGraph:
    G = nx.DiGraph()
    G.add_nodes_from(ids)
    return G


def star(agents: Sequence[str], hub: str | None = None) -> nx.DiGraph:
    """Hub and spokes: spokes report to the hub this round, the hub replies next round.

    >>> sorted(star(["a", "b", "c"]).edges(data="delay"))
    [('a', 'b', 1), ('a', 'c', 1), ('b', 'a', 0), ('c', 'a', 0)]
    """
    ids = _agents(agents)
    hub = ids[0] if hub is None else _member(hub, ids, "hub")
    G = _graph(ids)
    for spoke in ids:
        if spoke != hub:
            G.add_edge(spoke, hub, delay=0)
            G.add_edge(hub, spoke, delay=1)
    return G


def chain(agents: Sequence[str], order: Sequence[str] | None = None) -> nx.DiGraph:
    """Pipeline ``order[0] -> order[1] -> …`` within one round; ``order`` defaults to agents.

    >>> sorted(chain(["a", "b", "c"], order=["c", "a", "b"]).edges(data="delay"))
    [('a', 'b', 0), ('c', 'a', 0)]
    """
    ids = _agents(agents)
    order = ids if order is None else _list(order, "order", "['w2', 'w1', 'lead']")
    for i, agent in enumerate(order):
        _member(agent, ids, f"order[{i}]")
    if len(set(order)) != len(order) or len(order) != len(ids):
        repeated = sorted({a for a in order if order.count(a) > 1})
        missing = [a for a in ids if a not in order]
        raise TopologyError(
            f"order is not a permutation of the agents (repeated: {listing(repeated)}; "
            f"missing: {listing(missing)}); list every agent exactly once.",
            key="order",
        )
    G = _graph(ids)
    G.add_edges_from(pairwise(order), delay=0)
    return G


def ring(agents: Sequence[str]) -> nx.DiGraph:
    """Temporal ring ``a_i ~> a_(i+1 mod n)``: each agent reads its predecessor's last message.

    >>> sorted(ring(["a", "b", "c"]).edges(data="delay"))
    [('a', 'b', 1), ('b', 'c', 1), ('c', 'a', 1)]
    """
    ids = _agents(agents)
    if len(ids) < 2:
        raise TopologyError(
            f"ring needs at least 2 agents, got {ids!r}; add agents or use 'chain'.", "agents"
        )
    G = _graph(ids)
    G.add_edges_from(zip(ids, ids[1:] + ids[:1], strict=True), delay=1)
    return G


def complete(agents: Sequence[str]) -> nx.DiGraph:
    """Complete DAG: ``a_i -> a_j`` for every ``i < j``, all in the same round.

    >>> sorted(complete(["a", "b", "c"]).edges(data="delay"))
    [('a', 'b', 0), ('a', 'c', 0), ('b', 'c', 0)]
    """
    ids = _agents(agents)
    G = _graph(ids)
    G.add_edges_from(((u, v) for i, u in enumerate(ids) for v in ids[i + 1 :]), delay=0)
    return G


def debate(agents: Sequence[str], delay: int = 1) -> nx.DiGraph:
    """All-to-all temporal: every agent reads every other agent's message ``delay`` rounds ago.

    >>> sorted(debate(["a", "b"], delay=2).edges(data="delay"))
    [('a', 'b', 2), ('b', 'a', 2)]
    """
    ids = _agents(agents)
    delay = _int(delay, "delay", 1, MAX_DELAY)
    G = _graph(ids)
    G.add_edges_from(((u, v) for u in ids for v in ids if u != v), delay=delay)
    return G


def tree(
    agents: Sequence[str],
    k: int = 2,
    root: str | None = None,
    direction: Literal["up", "down", "both"] = "both",
) -> nx.DiGraph:
    """k-ary hierarchy in heap layout (root first, parent of position i is ``(i - 1) // k``).

    ``direction="up"``: child -> parent (reports flow up); ``"down"``: parent -> child;
    ``"both"``: child -> parent this round and parent ~> child next round.

    >>> sorted(tree(["r", "x", "y", "z"], k=2, direction="both").edges(data="delay"))
    [('r', 'x', 1), ('r', 'y', 1), ('x', 'r', 0), ('x', 'z', 1), ('y', 'r', 0), ('z', 'x', 0)]
    """
    ids = _agents(agents)
    k = _int(k, "k", 1)
    if direction not in ("up", "down", "both"):
        raise TopologyError(
            f"direction={direction!r} is invalid.{did_you_mean(direction, ['up', 'down', 'both'])} "
            "Use 'up', 'down' or 'both'.",
            key="direction",
        )
    heap = ids
    if root is not None:
        root = _member(root, ids, "root")
        heap = [root] + [a for a in ids if a != root]
    G = _graph(ids)
    for i, child in enumerate(heap[1:], start=1):
        parent = heap[(i - 1) // k]
        if direction in ("up", "both"):
            G.add_edge(child, parent, delay=0)
        if direction in ("down", "both"):
            G.add_edge(parent, child, delay=0 if direction == "down" else 1)
    return G


def _default_layers(n: int) -> list[int]:
    if n <= 2:
        return [1] * n
    proposers = n - 1  # split as evenly as possible, the first layer takes the extra one
    return [(proposers + 1) // 2, proposers // 2, 1]


def layered(agents: Sequence[str], layers: Sequence[int] | None = None) -> nx.DiGraph:
    """Mixture-of-agents layers: every agent of layer i -> every agent of layer i + 1.

    Consecutive agents fill the layers in order. Default: two even proposer layers over the
    first n - 1 agents (the first gets the extra one) and a final aggregator of 1.

    >>> sorted(layered(["a", "b", "c", "d"]).edges(data="delay"))
    [('a', 'c', 0), ('b', 'c', 0), ('c', 'd', 0)]
    """
    ids = _agents(agents)
    layers = _default_layers(len(ids)) if layers is None else _list(layers, "layers", "[2, 2, 1]")
    sizes = [_int(size, f"layers[{i}]", 1) for i, size in enumerate(layers)]
    if sum(sizes) != len(ids):
        raise TopologyError(
            f"layers={sizes} sum to {sum(sizes)} but there are {len(ids)} agents; "
            f"make the sizes sum to {len(ids)}.",
            key="layers",
        )
    groups = [ids[a:b] for a, b in pairwise([0, *accumulate(sizes)])]
    G = _graph(ids)
    for upper, lower in pairwise(groups):
        G.add_edges_from(((u, v) for u in upper for v in lower), delay=0)
    return G


def random_dag(
    agents: Sequence[str], p: float = 0.3, p_delayed: float = 0.0, seed: int = 0
) -> nx.DiGraph:
    """Random DAG: ``a_i -> a_j`` (i < j) with probability ``p``, then each ordered pair
    still without an edge gets a delay-1 edge with probability ``p_delayed``.

    Uses a local ``random.Random(seed)``: same seed, same graph; global state untouched.

    >>> sorted(random_dag(["a", "b", "c"], p=1.0).edges(data="delay"))
    [('a', 'b', 0), ('a', 'c', 0), ('b', 'c', 0)]
    """
    ids = _agents(agents)
    p, p_delayed = _prob(p, "p"), _prob(p_delayed, "p_delayed")
    rng = random.Random(_int(seed, "seed", 0))  # local RNG: never touches global state
    G = _graph(ids)
    for i, u in enumerate(ids):
        for v in ids[i + 1 :]:
            if rng.random() < p:
                G.add_edge(u, v, delay=0)
    for u in ids:
        for v in ids:
            if u != v and not G.has_edge(u, v) and rng.random() < p_delayed:
                G.add_edge(u, v, delay=1)
    return G


def _edge(entry: Any, i: int, ids: Sequence[str]) -> tuple[str, str, int]:
    form = "[src, dst] or [src, dst, {'delay': d}]"
    if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
        raise TopologyError(f"edges[{i}]={entry!r} is malformed; write {form}.", f"edges[{i}]")
    src = _member(entry[0], ids, f"edges[{i}][0]")
    dst = _member(entry[1], ids, f"edges[{i}][1]")
    options = entry[2] if len(entry) == 3 else {}
    if not isinstance(options, dict):
        raise TopologyError(f"edges[{i}][2]={options!r} is not a dict; {form}.", f"edges[{i}][2]")
    if unknown := [name for name in options if name != "delay"]:
        raise TopologyError(
            f"edges[{i}][2] has unknown option {unknown[0]!r}."
            f"{did_you_mean(unknown[0], ['delay'])} "
            "The only edge option is 'delay'.",
            key=f"edges[{i}][2].{unknown[0]}",
        )
    delay = _int(options.get("delay", 0), f"edges[{i}][2].delay", 0, MAX_DELAY)
    if src == dst:
        raise TopologyError(
            f"edges[{i}]={entry!r} is a self-loop on {src!r}; topologies have no self-loops, "
            "remove this edge.",
            key=f"edges[{i}]",
        )
    return src, dst, delay


def custom(agents: Sequence[str], edges: Sequence[Sequence[Any]]) -> nx.DiGraph:
    """Explicit edge list: ``[src, dst]`` (delay 0) or ``[src, dst, {"delay": d}]``.

    The spatial subgraph is not checked for cycles here; compiling the topology is.

    >>> sorted(custom(["a", "b"], [["a", "b"], ("b", "a", {"delay": 1})]).edges(data="delay"))
    [('a', 'b', 0), ('b', 'a', 1)]
    """
    ids = _agents(agents)
    G, first = _graph(ids), {}
    for i, entry in enumerate(_list(edges, "edges", "[['a', 'b'], ['b', 'a', {'delay': 1}]]")):
        src, dst, delay = _edge(entry, i, ids)
        if (src, dst) in first:
            raise TopologyError(
                f"edges[{i}] repeats {src!r} -> {dst!r} (first at edges[{first[src, dst]}]); "
                "each ordered pair may appear once, remove one.",
                key=f"edges[{i}]",
            )
        first[src, dst] = i
        G.add_edge(src, dst, delay=delay)
    return G


TOPOLOGIES: dict[str, Callable[..., nx.DiGraph]] = {
    "star": star,
    "chain": chain,
    "ring": ring,
    "complete": complete,
    "debate": debate,
    "tree": tree,
    "layered": layered,
    "random": random_dag,
    "custom": custom,
}


def build(kind: str, agents: Sequence[str], **params: Any) -> nx.DiGraph:
    """Build the topology ``kind`` from the registry, checking parameter names strictly.

    >>> sorted(build("chain", ["a", "b"]).edges(data="delay"))
    [('a', 'b', 0)]
    """
    if not isinstance(kind, str) or kind not in TOPOLOGIES:
        raise TopologyError(
            f"unknown topology kind {kind!r}.{did_you_mean(kind, list(TOPOLOGIES))} "
            f"Valid kinds: {listing(list(TOPOLOGIES), limit=len(TOPOLOGIES))}.",
            key="kind",
        )
    signature = inspect.signature(TOPOLOGIES[kind]).parameters
    valid = [name for name in signature if name != "agents"]
    for name in params:
        if name not in valid:
            raise TopologyError(
                f"topology {kind!r} has no parameter {name!r}.{did_you_mean(name, valid)} "
                f"Valid parameters: {listing(valid) if valid else 'none besides agents'}.",
                key=name,
            )
    for name in valid:
        if signature[name].default is inspect.Parameter.empty and name not in params:
            raise TopologyError(f"topology {kind!r} needs the parameter {name!r}; pass it.", name)
    return TOPOLOGIES[kind](agents, **params)
