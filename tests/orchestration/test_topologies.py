import inspect
import random
from itertools import pairwise

import networkx as nx
import pytest

from orchestration.topologies import (
    TOPOLOGIES,
    TopologyError,
    build,
    chain,
    complete,
    custom,
    debate,
    layered,
    random_dag,
    ring,
    star,
    tree,
)


def _custom_example(agents):
    """A spatial chain closed by a temporal back edge."""
    if len(agents) < 2:
        return {"edges": []}
    chain_edges = [[u, v] for u, v in pairwise(agents)]
    return {"edges": chain_edges + [(agents[-1], agents[0], {"delay": 1})]}


# Parameters a generator needs (or should be exercised with) beyond `agents`, and its
# smallest team; new registry entries are tested with no parameters from 1 agent up.
EXAMPLE_PARAMS = {
    "custom": _custom_example,
    "random": lambda agents: {"p": 0.4, "p_delayed": 0.2, "seed": 3},
}
MIN_AGENTS = {"ring": 2}


def ids(n: int) -> list[str]:
    return [f"a{i}" for i in range(n)]


def edges(G: nx.DiGraph) -> list[tuple[str, str, int]]:
    return sorted(G.edges(data="delay"))


def spatial(G: nx.DiGraph) -> nx.DiGraph:
    return nx.DiGraph([(u, v) for u, v, d in G.edges(data="delay") if d == 0])


def build_example(kind: str, agents: list[str]) -> nx.DiGraph:
    params = EXAMPLE_PARAMS.get(kind, lambda _: {})(agents)
    return build(kind, agents, **params)


# ---------------------------------------------------------------- registry contract


@pytest.mark.parametrize("kind", sorted(TOPOLOGIES))
def test_registry_contract(kind):
    for n in range(MIN_AGENTS.get(kind, 1), 41):
        agents = ids(n)
        given = list(agents)
        G = build_example(kind, agents)
        assert agents == given, "the agents list must not be mutated"
        assert type(G) is nx.DiGraph
        assert list(G.nodes) == agents, (kind, n)
        assert nx.number_of_selfloops(G) == 0
        for u, v, d in G.edges(data="delay"):
            assert type(d) is int and d >= 0, (kind, n, u, v, d)
        if kind != "custom":
            assert nx.is_directed_acyclic_graph(spatial(G)), (kind, n)
        assert edges(build_example(kind, agents)) == edges(G), "generators must be pure"


@pytest.mark.parametrize("kind", sorted(TOPOLOGIES))
def test_registry_generators_take_agents_first_and_document_themselves(kind):
    fn = TOPOLOGIES[kind]
    assert next(iter(inspect.signature(fn).parameters)) == "agents"
    assert ">>> sorted(" in fn.__doc__


@pytest.mark.parametrize("kind", sorted(TOPOLOGIES))
def test_registry_accepts_tuples(kind):
    agents = tuple(ids(MIN_AGENTS.get(kind, 1) + 3))
    assert list(build_example(kind, list(agents)).nodes) == list(agents)
    assert edges(build_example(kind, agents)) == edges(build_example(kind, list(agents)))


# ---------------------------------------------------------------- small edge sets


def test_star_small():
    assert edges(star(["a", "b", "c"], hub="c")) == [
        ("a", "c", 0), ("b", "c", 0), ("c", "a", 1), ("c", "b", 1),
    ]  # fmt: skip
    assert edges(star(["a"])) == []


def test_star_structure():
    agents = ids(9)
    G = star(agents, hub="a4")
    for spoke in agents:
        if spoke != "a4":
            assert G["a4"][spoke]["delay"] == 1 and G[spoke]["a4"]["delay"] == 0
            assert set(G.successors(spoke)) == {"a4"}
    assert G.number_of_edges() == 2 * 8


def test_chain_small():
    assert edges(chain(["a", "b", "c"])) == [("a", "b", 0), ("b", "c", 0)]
    assert edges(chain(["a", "b", "c"], order=("b", "c", "a"))) == [("b", "c", 0), ("c", "a", 0)]
    assert edges(chain(["a"])) == []


def test_ring_small_and_structure():
    assert edges(ring(["a", "b"])) == [("a", "b", 1), ("b", "a", 1)]
    G = ring(ids(7))
    assert all(G.in_degree(v) == 1 and G.out_degree(v) == 1 for v in G)
    assert all(d == 1 for _, _, d in G.edges(data="delay"))
    assert sorted(len(c) for c in nx.simple_cycles(G)) == [7]


def test_complete_small():
    assert edges(complete(["a", "b", "c"])) == [("a", "b", 0), ("a", "c", 0), ("b", "c", 0)]
    assert complete(ids(10)).number_of_edges() == 45


def test_debate_small():
    assert edges(debate(["a", "b", "c"])) == [
        ("a", "b", 1), ("a", "c", 1), ("b", "a", 1), ("b", "c", 1), ("c", "a", 1), ("c", "b", 1),
    ]  # fmt: skip
    assert {d for _, _, d in debate(ids(4), delay=3).edges(data="delay")} == {3}
    assert edges(debate(["a"])) == []


@pytest.mark.parametrize(
    ("direction", "expected"),
    [
        ("up", [("b", "a", 0), ("c", "a", 0), ("d", "b", 0), ("e", "b", 0)]),
        ("down", [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("b", "e", 0)]),
        ("both", [
            ("a", "b", 1), ("a", "c", 1), ("b", "a", 0), ("b", "d", 1), ("b", "e", 1),
            ("c", "a", 0), ("d", "b", 0), ("e", "b", 0),
        ]),
    ],
)  # fmt: skip
def test_tree_small(direction, expected):
    assert edges(tree(["a", "b", "c", "d", "e"], k=2, direction=direction)) == expected


def test_tree_root_moves_to_front_and_rest_keep_order():
    G = tree(["a", "b", "c", "d"], k=2, root="c", direction="up")
    assert list(G.nodes) == ["a", "b", "c", "d"]
    # heap layout c, a, b, d: a and b report to c, d (position 3) reports to a
    assert edges(G) == [("a", "c", 0), ("b", "c", 0), ("d", "a", 0)]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [1, 2, 7, 20, 40])
def test_tree_structure(k, n):
    agents = ids(n)
    G = tree(agents, k=k, direction="up")
    assert G.number_of_edges() == n - 1
    for i, child in enumerate(agents[1:], start=1):
        assert list(G.successors(child)) == [agents[(i - 1) // k]]
        assert G.in_degree(child) <= k
    assert G.out_degree(agents[0]) == 0
    if n > 1:
        assert nx.is_arborescence(G.reverse())
    both = tree(agents, k=k)
    assert both.number_of_edges() == 2 * (n - 1)
    assert {(u, v) for u, v, d in both.edges(data="delay") if d == 0} == set(G.edges)
    assert all(both[parent][child]["delay"] == 1 for child, parent in G.edges)


def test_tree_k1_is_a_chain_towards_the_root():
    assert edges(tree(["a", "b", "c"], k=1, direction="down")) == edges(chain(["a", "b", "c"]))


@pytest.mark.parametrize(
    ("n", "sizes"),
    [(1, [1]), (2, [1, 1]), (3, [1, 1, 1]), (4, [2, 1, 1]), (5, [2, 2, 1]), (6, [3, 2, 1]),
     (9, [4, 4, 1]), (32, [16, 15, 1])],
)  # fmt: skip
def test_layered_default_sizes(n, sizes):
    G = layered(ids(n))
    layers = [sorted(layer) for layer in nx.topological_generations(G)]
    assert [len(layer) for layer in layers] == sizes
    assert G.number_of_edges() == sum(a * b for a, b in pairwise(sizes))


def test_layered_explicit():
    assert edges(layered(["a", "b", "c"], layers=[1, 2])) == [("a", "b", 0), ("a", "c", 0)]
    assert edges(layered(["a", "b", "c"], layers=[3])) == []
    G = layered(ids(6), layers=(2, 3, 1))
    assert set(G.predecessors("a5")) == {"a2", "a3", "a4"}
    assert set(G.successors("a0")) == {"a2", "a3", "a4"}


def test_custom_small():
    G = custom(["a", "b", "c"], [("a", "b"), ["b", "c", {"delay": 2}], ["c", "a", {}]])
    assert edges(G) == [("a", "b", 0), ("b", "c", 2), ("c", "a", 0)]
    assert edges(custom(["a", "b"], [])) == []


def test_custom_allows_a_spatial_cycle_for_compile_to_report():
    assert not nx.is_directed_acyclic_graph(custom(["a", "b"], [["a", "b"], ["b", "a"]]))


# ---------------------------------------------------------------- random_dag


def test_random_extremes():
    agents = ids(6)
    assert edges(random_dag(agents, p=0.0)) == []
    assert edges(random_dag(agents, p=1.0)) == edges(complete(agents))
    assert edges(random_dag(agents, p=0.0, p_delayed=1.0)) == edges(debate(agents))
    full = random_dag(agents, p=1.0, p_delayed=1.0)
    assert full.number_of_edges() == 30  # forward spatial, backward temporal
    assert all(d == (0 if u < v else 1) for u, v, d in full.edges(data="delay"))


def test_random_spatial_edges_point_forward():
    agents = ids(25)
    rank = {a: i for i, a in enumerate(agents)}
    G = random_dag(agents, p=0.5, p_delayed=0.3, seed=11)
    assert all(rank[u] < rank[v] for u, v, d in G.edges(data="delay") if d == 0)
    assert {d for _, _, d in G.edges(data="delay")} == {0, 1}


def test_random_is_deterministic_per_seed():
    agents = ids(12)
    same = [edges(random_dag(agents, 0.3, 0.1, seed=5)) for _ in range(2)]
    assert same[0] == same[1] and same[0]
    distinct = {tuple(edges(random_dag(agents, 0.3, 0.1, seed=s))) for s in range(10)}
    assert len(distinct) >= 8


def test_random_ignores_and_keeps_global_random_state():
    agents = ids(12)
    random.seed(1)
    first = edges(random_dag(agents, seed=4))
    random.seed(2)
    random.random()
    state = random.getstate()
    assert edges(random_dag(agents, seed=4)) == first
    assert random.getstate() == state


# ---------------------------------------------------------------- build and errors


def test_build_looks_up_the_kind_and_passes_params():
    assert edges(build("star", ["a", "b"], hub="b")) == edges(star(["a", "b"], hub="b"))
    assert edges(build("random", ids(8), p=0.5, seed=2)) == edges(random_dag(ids(8), 0.5, seed=2))


AGENTS = ["lead", "w1", "w2"]
ERRORS = [
    # (callable, args, kwargs, key, fragments the message must contain)
    (build, ("strr", AGENTS), {}, "kind", ["'strr'", "'star'", "custom"]),
    (build, (None, AGENTS), {}, "kind", ["None", "ring"]),
    (build, ("star", AGENTS), {"hubb": "lead"}, "hubb", ["'hubb'", "'hub'", "Valid"]),
    (build, ("ring", AGENTS), {"delay": 2}, "delay", ["'delay'", "none besides agents"]),
    (build, ("custom", AGENTS), {}, "edges", ["'edges'"]),
    (star, ([],), {}, "agents", ["empty"]),
    (star, ("lead",), {}, "agents", ["'lead'", "list"]),
    (star, (["a", "b", "a"],), {}, "agents[2]", ["'a'", "agents[0]", "unique"]),
    (star, (["a", 3],), {}, "agents[1]", ["agents[1]=3", "type int", "string"]),
    (star, (AGENTS,), {"hub": "laed"}, "hub", ["'laed'", "'lead'", "'w2'"]),
    (chain, (AGENTS,), {"order": ["w1", "lead", "w3"]}, "order[2]", ["'w3'", "'w1'"]),
    (chain, (AGENTS,), {"order": ["w1", "lead"]}, "order", ["'w2'", "missing", "permutation"]),
    (chain, (AGENTS,), {"order": ["w1", "w1", "lead", "w2"]}, "order", ["'w1'", "repeated"]),
    (chain, (AGENTS,), {"order": "lead"}, "order", ["'lead'", "list"]),
    (ring, (["solo"],), {}, "agents", ["at least 2", "'solo'", "chain"]),
    (debate, (AGENTS,), {"delay": 0}, "delay", ["delay=0", ">= 1"]),
    (debate, (AGENTS,), {"delay": 1.5}, "delay", ["1.5", "integer"]),
    (debate, (AGENTS,), {"delay": True}, "delay", ["True", "integer"]),
    (tree, (AGENTS,), {"k": 0}, "k", ["k=0", ">= 1"]),
    (tree, (AGENTS,), {"root": "boss"}, "root", ["'boss'", "'lead'"]),
    (tree, (AGENTS,), {"direction": "upp"}, "direction", ["'upp'", "'up'", "'both'"]),
    (layered, (AGENTS,), {"layers": [1, 1]}, "layers", ["[1, 1]", "2", "3 agents"]),
    (layered, (AGENTS,), {"layers": [2, 0, 1]}, "layers[1]", ["layers[1]=0", ">= 1"]),
    (layered, (AGENTS,), {"layers": 3}, "layers", ["3", "list"]),
    (random_dag, (AGENTS,), {"p": 1.5}, "p", ["p=1.5", "[0, 1]"]),
    (random_dag, (AGENTS,), {"p_delayed": -0.1}, "p_delayed", ["p_delayed=-0.1", "[0, 1]"]),
    (random_dag, (AGENTS,), {"p": float("nan")}, "p", ["nan"]),
    (random_dag, (AGENTS,), {"seed": "x"}, "seed", ["'x'", "integer"]),
    (custom, (AGENTS, [["lead", "w1"], ["w1", "w3"]]), {}, "edges[1][1]", ["'w3'", "'w1'"]),
    (custom, (AGENTS, [["leed", "w1"]]), {}, "edges[0][0]", ["'leed'", "'lead'"]),
    (custom, (AGENTS, [["w1", "w1"]]), {}, "edges[0]", ["self-loop", "'w1'"]),
    (custom, (AGENTS, [["lead", "w1"], ("lead", "w1", {"delay": 1})]), {}, "edges[1]",
     ["'lead' -> 'w1'", "edges[0]", "remove"]),
    (custom, (AGENTS, [["lead"]]), {}, "edges[0]", ["['lead']", "[src, dst]"]),
    (custom, (AGENTS, ["lead->w1"]), {}, "edges[0]", ["'lead->w1'", "[src, dst]"]),
    (custom, (AGENTS, [["lead", "w1", 1]]), {}, "edges[0][2]", ["1", "dict"]),
    (custom, (AGENTS, [["lead", "w1", {"dealy": 1}]]), {}, "edges[0][2].dealy",
     ["'dealy'", "'delay'"]),
    (custom, (AGENTS, [["lead", "w1", {"delay": -1}]]), {}, "edges[0][2].delay", ["-1", ">= 0"]),
    (custom, (AGENTS, [["lead", "w1", {"delay": 0.5}]]), {}, "edges[0][2].delay", ["0.5"]),
    (custom, (AGENTS, [["lead", "w1", "x", "y"]]), {}, "edges[0]", ["malformed"]),
    (custom, (AGENTS, "lead w1"), {}, "edges", ["'lead w1'", "list"]),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "args", "kwargs", "key", "fragments"), ERRORS)
def test_errors_name_the_offending_value(fn, args, kwargs, key, fragments):
    with pytest.raises(TopologyError) as info:
        fn(*args, **kwargs)
    assert info.value.key == key
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_topology_error_is_a_value_error():
    with pytest.raises(ValueError):
        build("nope", AGENTS)


def test_long_agent_lists_are_truncated_in_messages():
    agents = ids(30)
    with pytest.raises(TopologyError, match="'zz'") as info:
        star(agents, hub="zz")
    message = str(info.value)
    assert "'a0'" in message and "…" in message and "30 in all" in message
    assert "'a29'" not in message
