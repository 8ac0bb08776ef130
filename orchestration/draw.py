"""Views of a topology: a plain-text summary and a PNG picture.

Both read the int ``delay`` on each edge (missing counts as 0): delay-0 edges form the
spatial subgraph, laid out in topological generations (one round runs them in order);
delay >= 1 edges are temporal. A spatial cycle is reported, never raised.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Hashable
from pathlib import Path

import networkx as nx

_TEMPORAL_COLORS = ["tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:pink"]


def _spatial(G: nx.DiGraph) -> nx.DiGraph:
    S = nx.DiGraph()
    S.add_nodes_from(G)
    S.add_edges_from((u, v) for u, v, d in G.edges(data="delay", default=0) if d == 0)
    return S


def _layers(G: nx.DiGraph) -> list[list[Hashable]] | None:
    """Spatial layers with nodes in agent order, or None when the spatial subgraph is cyclic."""
    S = _spatial(G)
    if not nx.is_directed_acyclic_graph(S):
        return None
    rank = {node: i for i, node in enumerate(G)}
    return [sorted(layer, key=rank.__getitem__) for layer in nx.topological_generations(S)]


def _sorted_edges(G: nx.DiGraph) -> list[tuple[Hashable, Hashable, int]]:
    """Edges as ``(u, v, delay)``: spatial first, then by delay, each group in agent order."""
    rank = {node: i for i, node in enumerate(G)}
    edges = G.edges(data="delay", default=0)
    return sorted(edges, key=lambda e: (e[2], rank[e[0]], rank[e[1]]))


def render_text(G: nx.DiGraph) -> str:
    """Describe ``G``: sizes, spatial layers (or the spatial cycle), then every edge.

    >>> from orchestration.topologies import star
    >>> print(render_text(star(["lead", "w1", "w2"])))
    3 agents, 4 edges (2 spatial, 2 temporal)
    spatial layers (one round runs them in order):
      layer 0: w1, w2
      layer 1: lead
    edges:
      w1 -> lead
      w2 -> lead
      lead ~> w1 (delay 1)
      lead ~> w2 (delay 1)
    """
    edges = _sorted_edges(G)
    n_spatial = sum(1 for _, _, d in edges if d == 0)
    lines = [
        f"{G.number_of_nodes()} agents, {len(edges)} edges "
        f"({n_spatial} spatial, {len(edges) - n_spatial} temporal)"
    ]
    layers = _layers(G)
    if layers is None:
        cycle = nx.find_cycle(_spatial(G))
        names = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
        lines.append(
            f"spatial subgraph has a cycle: {names}; spatial edges must form a DAG "
            "(give one of these edges delay >= 1)"
        )
    else:
        lines.append("spatial layers (one round runs them in order):")
        lines += [f"  layer {i}: {', '.join(map(str, layer))}" for i, layer in enumerate(layers)]
    lines.append("edges:" if edges else "edges: none")
    for u, v, d in edges:
        lines.append(f"  {u} -> {v}" if d == 0 else f"  {u} ~> {v} (delay {d})")
    return "\n".join(lines)


def _positions(
    G: nx.DiGraph, layers: list[list[Hashable]] | None
) -> tuple[dict[Hashable, tuple[float, float]], bool]:
    """Layer layout (x = spatial layer, y spread and centred) or a circle; True if layered."""
    if layers is None or len(layers) <= 1:  # a cycle, or no spatial edges at all
        return {node: tuple(xy) for node, xy in nx.circular_layout(G).items()}, False
    pos = {}
    for x, layer in enumerate(layers):
        for y, node in enumerate(layer):
            pos[node] = (float(x), (len(layer) - 1) / 2 - y)
    return pos, True


def draw_png(G: nx.DiGraph, path: str | os.PathLike[str], title: str | None = None) -> Path:
    """Write a PNG of ``G`` to ``path`` atomically and return the path.

    Spatial edges are solid (curved when they skip a layer), temporal edges dashed and
    curved, coloured by delay. Rendered on an Agg canvas; the global backend is untouched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch

    n, edges = G.number_of_nodes(), _sorted_edges(G)
    layers = _layers(G)
    pos, layered = _positions(G, layers)
    xs, ys = [x for x, _ in pos.values()] or [0.0], [y for _, y in pos.values()] or [0.0]
    font = 9 if n <= 12 else 7
    longest = max((len(str(node)) for node in G), default=1)
    diameter = max(18.0, 0.62 * font * longest + 8)  # points: each circle fits its label
    gap = diameter / 72 + 0.2  # inches from one node to the next
    if layered:  # ~1.8 in per layer, `gap` per node of the tallest layer, capped
        width, height = 1.8 * (max(xs) + 1) + 1, gap * (max(ys) - min(ys) + 1) + 1.5
        size, pad = (min(max(6.0, width), 26.0), min(max(4.0, height), 26.0)), 1.0
    else:  # the unit circle's circumference holds n gaps
        size, pad = (min(max(6.0, 1.5 * n * gap / 3.14 + 1), 16.0),) * 2, 0.2
    lw, alpha = (1.3, 0.85) if len(edges) <= 60 else (0.6, 0.4)

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_ylim(min(ys) - pad, max(ys) + pad)

    shrink = diameter / 2 + 1  # points from a node's centre to just past its rim
    legend = {}
    for u, v, d in edges:
        spatial = d == 0
        skips = layered and abs(pos[v][0] - pos[u][0]) > 1  # would cross the layers between
        dist = max(math.dist(pos[u], pos[v]), 1.0)  # an arc bulges rad * dist / 2: grow slowly
        rad = 0.0 if spatial and not skips else 0.25 / math.sqrt(dist)
        color = "0.25" if spatial else _TEMPORAL_COLORS[(d - 1) % len(_TEMPORAL_COLORS)]
        style = "-" if spatial else "--"
        arrow = FancyArrowPatch(
            pos[u], pos[v], connectionstyle=f"arc3,rad={rad}", arrowstyle="-|>",
            mutation_scale=10, shrinkA=shrink, shrinkB=shrink, color=color,
            linestyle=style, linewidth=lw, alpha=alpha, zorder=1,
        )  # fmt: skip
        ax.add_patch(arrow)
        label = "spatial (same round)" if spatial else f"temporal (delay {d})"
        legend[label] = Line2D([], [], color=color, linestyle=style, linewidth=1.5, label=label)

    nodes = list(G)
    ax.scatter(
        [pos[v][0] for v in nodes], [pos[v][1] for v in nodes], s=diameter**2,
        c="#cfe3f7", edgecolors="#2b5d8a", linewidths=1.0, zorder=2,
    )  # fmt: skip
    for node in nodes:
        ax.text(*pos[node], str(node), ha="center", va="center", fontsize=font, zorder=3)
    if legend:
        fig.legend(handles=list(legend.values()), loc="outside lower center", ncol=4, frameon=False)
    n_spatial = sum(1 for _, _, d in edges if d == 0)
    default = f"{n} agents, {n_spatial} spatial + {len(edges) - n_spatial} temporal edges"
    if layers is None:
        default += " (spatial cycle!)"
    ax.set_title(title if title is not None else default)

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=100, bbox_inches="tight")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
