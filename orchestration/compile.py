"""Compile a topology graph into masks and the episode schedule.

A topology is a ``networkx.DiGraph`` over agent ids; edge ``u -> v`` means *v reads
u's message*. Each edge has an integer ``delay``: 0 is a *spatial* edge (same round,
so ``u`` must act before ``v``) and ``d >= 1`` a *temporal* edge (``v`` reads ``u``'s
message from ``d`` rounds earlier).

Compilation yields a spatial mask (which must be a DAG), a temporal delay matrix, and
the schedule: within a round, agents act in topological layers of the spatial DAG
(``networkx.topological_generations``); one environment step is one layer.

>>> import networkx as nx
>>> g = nx.DiGraph()
>>> g.add_nodes_from(["a", "b", "c"])
>>> g.add_edge("a", "c", delay=0); g.add_edge("b", "c", delay=0); g.add_edge("c", "a", delay=1)
>>> topo = compile_topology(g)
>>> topo.layers
(('a', 'b'), ('c',))
>>> topo.inbox("a", 1), topo.inbox("c", 0)
([('c', 0)], [('a', 0), ('b', 0)])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice

import networkx as nx
import numpy as np

from orchestration.topologies import TopologyError


class SpatialCycleError(TopologyError):
    """Same-round edges form a cycle, so no agent of the cycle could act first."""

    def __init__(self, cycle: list[str]):
        self.cycle = cycle
        path = " -> ".join([*cycle, cycle[0]])
        super().__init__(
            f"same-round edges form a cycle: {path}. Agents on a cycle would each wait for "
            "the other; give one of these edges a delay (e.g. [src, dst, {delay: 1}]) so it "
            "is read in the next round",
            key="edges",
        )


@dataclass(frozen=True)
class CompiledTopology:
    """Masks and schedule of a topology. Agent order is the graph's node order.

    ``spatial[i, j]`` is True when agent j reads agent i in the same round; ``temporal[i, j]``
    is the delay d >= 1 with which j reads i (0 = no temporal edge).
    """

    agents: tuple[str, ...]
    spatial: np.ndarray  # (N, N) bool
    temporal: np.ndarray  # (N, N) int
    layers: tuple[tuple[str, ...], ...]
    index: dict[str, int] = field(repr=False)
    layer_of: dict[str, int] = field(repr=False)
    _inbox: dict[str, tuple[tuple[str, int], ...]] = field(repr=False)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def edges(self) -> list[tuple[str, str, int]]:
        """All edges as ``(src, dst, delay)`` in agent order."""
        out = []
        for dst in self.agents:
            for src, delay in self._inbox[dst]:
                out.append((src, dst, delay))
        return sorted(out, key=lambda e: (self.index[e[0]], self.index[e[1]]))

    def inbox(self, agent: str, rnd: int) -> list[tuple[str, int]]:
        """Messages ``agent`` reads when it acts in round ``rnd``: ``(src, src_round)`` pairs.

        Order is fixed: temporal edges first, then spatial ones, each in agent order. Edges
        whose source round would be negative deliver nothing.
        """
        return [(src, rnd - d) for src, d in self._inbox[agent] if rnd - d >= 0]


def compile_topology(graph: nx.DiGraph) -> CompiledTopology:
    """Compile ``graph`` (edge attribute ``delay``, default 0) into masks and layers.

    Raises :class:`SpatialCycleError` naming the cycle when same-round edges are cyclic.
    """
    agents = tuple(graph.nodes)
    index = {a: i for i, a in enumerate(agents)}
    n = len(agents)
    spatial = np.zeros((n, n), dtype=bool)
    temporal = np.zeros((n, n), dtype=np.int64)
    dag = nx.DiGraph()
    dag.add_nodes_from(agents)
    for u, v, d in graph.edges(data="delay", default=0):
        if d == 0:
            spatial[index[u], index[v]] = True
            dag.add_edge(u, v)
        else:
            temporal[index[u], index[v]] = d
    try:
        generations = list(nx.topological_generations(dag))
    except nx.NetworkXUnfeasible:
        cycle = [u for u, _ in nx.find_cycle(dag)]
        raise SpatialCycleError(cycle) from None
    layers = tuple(tuple(sorted(g, key=index.__getitem__)) for g in generations)
    layer_of = {a: i for i, layer in enumerate(layers) for a in layer}
    inbox = {}
    for j, dst in enumerate(agents):
        temporal_in = [(agents[i], int(temporal[i, j])) for i in range(n) if temporal[i, j]]
        spatial_in = [(agents[i], 0) for i in range(n) if spatial[i, j]]
        inbox[dst] = tuple(temporal_in + spatial_in)
    return CompiledTopology(agents, spatial, temporal, layers, index, layer_of, inbox)


def knowledge_by_round(topo: CompiledTopology) -> Iterator[dict[str, frozenset[str]]]:
    """Yield, round after round, whose private information each agent can hold after its call.

    An agent knows its own information, everything it knew in earlier rounds (its history
    stays in its prompt), and everything the senders of the messages it reads knew when
    they wrote them: what a perfect relaying policy could achieve.
    """
    history: list[dict[str, frozenset[str]]] = []
    while True:
        rnd = len(history)
        now: dict[str, frozenset[str]] = {}
        for layer in topo.layers:
            for a in layer:
                k = {a} | (history[-1][a] if history else set())
                for src, src_round in topo.inbox(a, rnd):
                    k |= now[src] if src_round == rnd else history[src_round][src]
                now[a] = frozenset(k)
        history.append(now)
        yield now


def knowledge(topo: CompiledTopology, rounds: int) -> dict[str, frozenset[str]]:
    """Whose information each agent can hold at its call in the last of ``rounds`` rounds.

    >>> g = nx.DiGraph([("a", "b", {"delay": 0}), ("b", "c", {"delay": 1})])
    >>> topo = compile_topology(g)
    >>> sorted(knowledge(topo, 1)["c"]), sorted(knowledge(topo, 2)["c"])
    (['c'], ['a', 'b', 'c'])
    """
    return next(islice(knowledge_by_round(topo), rounds - 1, None))


def rounds_needed(topo: CompiledTopology, target: str, sources: set[str], limit: int) -> int | None:
    """Fewest rounds after which ``target`` can know every source's information, or None
    if that takes more than ``limit`` rounds (or never happens)."""
    for rounds, known in enumerate(islice(knowledge_by_round(topo), limit), start=1):
        if sources <= known[target]:
            return rounds
    return None
