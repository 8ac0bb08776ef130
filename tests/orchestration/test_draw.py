from itertools import pairwise

import networkx as nx
import pytest

from orchestration.draw import draw_png, render_text
from orchestration.topologies import TOPOLOGIES, build, custom, layered, star

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def example(kind: str, n: int) -> nx.DiGraph:
    """A team of n (ring: at least 2) built by `kind`; custom gets a chain plus temporal edges."""
    agents = [f"agent{i}" for i in range(max(n, 2) if kind == "ring" else n)]
    params = {}
    if kind == "custom":
        back = [(v, u, {"delay": 1 + i % 3}) for i, (u, v) in enumerate(pairwise(agents))]
        params = {"edges": [[u, v] for u, v in pairwise(agents)] + back}
    elif kind == "random":
        params = {"p": 0.2, "p_delayed": 0.05, "seed": n}
    return build(kind, agents, **params)


def assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > len(PNG_MAGIC)


# ---------------------------------------------------------------- render_text


def test_render_text_star():
    text = render_text(star(["lead", "w1", "w2"]))
    assert text.splitlines()[0] == "3 agents, 4 edges (2 spatial, 2 temporal)"
    assert "  layer 0: w1, w2" in text and "  layer 1: lead" in text
    assert "  w1 -> lead" in text and "  lead ~> w2 (delay 1)" in text


@pytest.mark.parametrize("kind", sorted(TOPOLOGIES))
@pytest.mark.parametrize("n", [1, 5, 32])
def test_render_text_mentions_every_layer_node_and_edge(kind, n):
    G = example(kind, n)
    text = render_text(G)
    assert text.startswith(f"{G.number_of_nodes()} agents, {G.number_of_edges()} edges")
    spatial = nx.DiGraph([(u, v) for u, v, d in G.edges(data="delay") if d == 0])
    spatial.add_nodes_from(G)
    if nx.is_directed_acyclic_graph(spatial):
        rank = {v: i for i, v in enumerate(G)}
        for i, layer in enumerate(nx.topological_generations(spatial)):
            names = ", ".join(sorted(layer, key=rank.__getitem__))
            assert f"  layer {i}: {names}\n" in text + "\n"
    for u, v, d in G.edges(data="delay"):
        assert (f"  {u} -> {v}" if d == 0 else f"  {u} ~> {v} (delay {d})") in text


def test_render_text_layers_in_agent_order():
    text = render_text(layered(["z", "y", "x", "w", "v"]))  # layers [z, y] [x, w] [v]
    assert "layer 0: z, y\n  layer 1: x, w\n  layer 2: v" in text


def test_render_text_names_a_spatial_cycle():
    G = custom(["a", "b", "c"], [["a", "b"], ["b", "c"], ["c", "a"], ["a", "c", {"delay": 2}]])
    text = render_text(G)
    assert "cycle: a -> b -> c -> a" in text
    assert "  a ~> c (delay 2)" in text


def test_render_text_without_edges():
    assert "edges: none" in render_text(build("complete", ["solo"]))


# ---------------------------------------------------------------- draw_png


@pytest.mark.parametrize("kind", sorted(TOPOLOGIES))
@pytest.mark.parametrize("n", [1, 4, 32])
def test_draw_png_writes_a_png(tmp_path, kind, n):
    out = draw_png(example(kind, n), tmp_path / f"{kind}.png", title=f"{kind} ({n})")
    assert out == tmp_path / f"{kind}.png"
    assert_png(out)
    assert [p.name for p in tmp_path.iterdir()] == [f"{kind}.png"], "temp file left behind"


def test_draw_png_creates_parent_dirs_and_accepts_str(tmp_path):
    target = tmp_path / "runs" / "x" / "topology.png"
    out = draw_png(star(["a", "b"]), str(target))
    assert out == target
    assert_png(target)


def test_draw_png_overwrites(tmp_path):
    target = tmp_path / "t.png"
    draw_png(star(["a", "b"]), target)
    first = target.read_bytes()
    draw_png(layered([f"a{i}" for i in range(9)]), target)
    assert_png(target)
    assert target.read_bytes() != first


def test_draw_png_survives_a_spatial_cycle_and_long_delays(tmp_path):
    G = custom(["a", "b", "c"], [["a", "b"], ["b", "a"], ["b", "c", {"delay": 7}]])
    assert_png(draw_png(G, tmp_path / "cycle.png"))


def test_draw_png_failure_leaves_no_temp_file(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()  # os.replace cannot put a file over a directory
    with pytest.raises(OSError):
        draw_png(star(["a", "b"]), target)
    assert list(tmp_path.iterdir()) == [target]
    assert list(target.iterdir()) == []
