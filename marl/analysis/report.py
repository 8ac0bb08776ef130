"""The report of ``marl analyze``: figures (PNG, embedded in one self-contained HTML page
that needs no network) and a plain-text summary, from the numbers of
:func:`marl.analysis.analyze.analyze`.

Every run trained with oracle demonstrations, or played by the scripted oracle, is labelled
so in each figure legend and table it appears in; so is every classic MARL baseline
(``marl baseline``), whose agents exchange symbols and whose tokens count symbols. Runs
whose task writes free-form text (``Task.messages == "text"``) also get a figure and a
table of their messages (length, tokens, vocabulary, empty and cut shares).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

LANGUAGE = ("entropy", "mutual_information", "speaker_consistency", "topographic_similarity",
            "posdis", "bosdis")
#: Free-form message metrics: (key in each sender's series, column of the messages table).
MESSAGES = (("mean_chars", "chars/message"), ("max_chars", "max chars"),
            ("mean_words", "words/message"), ("tokens_per_message", "tokens/message"),
            ("vocabulary_entropy", "vocabulary entropy (bits)"), ("empty_share", "empty"),
            ("cut_share", "cut at max_new_tokens"))
MAX_RUN_FIGURES = 24  # runs drawn one by one (tokens, emergence, messages); tables list all


def label(run: dict[str, Any]) -> str:
    """The run's name in figures: oracle use is always said, and so are a classic MARL
    baseline (symbol agents, whose tokens are symbols) and answers told the score of every
    alternative (``answer_feedback: full``).

    >>> label({"label": "r", "kind": "train", "answer_feedback": "full"})
    'r (answers told)'
    """
    name = run["label"]
    if run.get("tokens_are") == "symbols":
        name = f"{name} (RLlib baseline, symbols)"
    if run.get("answer_feedback") == "full":
        name = f"{name} (answers told)"
    if run["kind"] == "eval" and run.get("uses_oracle"):
        return f"{name} (scripted oracle)"
    return f"{name} (oracle demos)" if run.get("uses_oracle") else name


def _figure(cols: int = 1, rows: int = 1, width: float = 5.0,
            height: float = 3.6) -> tuple[Figure, Any]:
    w, h = width * cols, height * rows
    fig = Figure(figsize=(w, h))  # fixed margins: a layout engine would double the time
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    fig.subplots_adjust(left=0.75 / w, right=1 - 0.2 / w, bottom=0.6 / h, top=1 - 0.6 / h,
                        wspace=0.35, hspace=0.6)
    return fig, axes


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


def learning_figure(runs: Sequence[dict[str, Any]]) -> Figure | None:
    """Success and tokens per episode against iteration, cumulative tokens and USD."""
    trained = [r for r in runs if r["kind"] == "train" and r["curve"]["iteration"]]
    if not trained:
        return None
    fig, ax = _figure(3, 2)
    xs = (("iteration", "eval_iteration", "iteration"),
          ("cum_tokens", "eval_cum_tokens", "tokens spent (cumulative)"),
          ("cum_usd", "eval_cum_usd", "USD spent (cumulative)"))
    for j, (x, ex, name) in enumerate(xs):
        for r in trained:
            c = r["curve"]
            line, = ax[0, j].plot(c[x], c["success"], lw=0.8, alpha=0.6, label=label(r))
            ax[0, j].plot(c[ex], c["eval_success"], "o-", ms=3, color=line.get_color())
            ax[1, j].plot(c[x], c["tokens_per_episode"], lw=0.8, color=line.get_color())
        ax[0, j].set(xlabel=name, ylabel="success", ylim=(-0.02, 1.02))
        ax[1, j].set(xlabel=name, ylabel="tokens per episode")
    ax[0, 0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Learning: success (line: sampled, dots: greedy evaluation) and tokens per "
                 "episode, against steps and against spend")
    return fig


def _front_line(axis: Any, xs: list[float], ys: list[float]) -> None:
    axis.step(xs, ys, where="post", color="crimson", lw=1.2, marker="o", mfc="none", ms=9,
              label="Pareto front")


def cost_figure(runs: Sequence[dict[str, Any]], scenario: str,
                fronts: dict[str, Any]) -> Figure:
    """USD and tokens per episode against success, with each front."""
    fig, ax = _figure(2, 1)
    for j, (key, front, name) in enumerate((("usd_per_episode", fronts["usd"], "USD"),
                                            ("tokens_per_episode", fronts["tokens"],
                                             "tokens"))):
        for r in runs:
            if r[key] is None or r["success"] is None:  # nothing played yet: no point
                continue
            ax[0, j].scatter(r[key], r["success"], s=18)
            ax[0, j].annotate(label(r), (r[key], r["success"]), fontsize=6,
                              xytext=(3, 3), textcoords="offset points")
        on = sorted((r[key], r["success"]) for r in runs if r["label"] in front)
        if on:
            _front_line(ax[0, j], [x for x, _ in on], [y for _, y in on])
            ax[0, j].legend(fontsize=7, loc="lower right")
        ax[0, j].set(xlabel=f"{name} per episode", ylabel="success", ylim=(-0.02, 1.02))
    fig.suptitle(f"{scenario}: cost against success (the last evaluation of each run)")
    return fig


def agent_cost_figure(runs: Sequence[dict[str, Any]], scenario: str,
                      fronts: dict[str, list[str]]) -> Figure:
    """Each agent's own USD per episode against the team's success."""
    agents = sorted(fronts)
    fig, ax = _figure(min(len(agents), 4), (len(agents) + 3) // 4, width=3.6, height=3.0)
    for k, agent in enumerate(agents):
        axis = ax[k // 4, k % 4]
        pts = [(r["tokens"]["per_agent"][agent]["cost_usd"], r["success"], r) for r in runs
               if agent in r["tokens"]["per_agent"]]
        axis.scatter([x for x, _, _ in pts], [y for _, y, _ in pts], s=14)
        on = sorted((x, y) for x, y, r in pts if r["label"] in fronts[agent])
        if on:
            _front_line(axis, [x for x, _ in on], [y for _, y in on])
        axis.set(title=agent, xlabel="its USD per episode", ylabel="team success",
                 ylim=(-0.02, 1.02))
    for k in range(len(agents), ax.size):
        ax[k // 4, k % 4].set_axis_off()
    fig.suptitle(f"{scenario}: per agent")
    return fig


def tokens_figure(run: dict[str, Any], graph: Any | None) -> Figure | None:
    """Where one run's tokens go: per agent (uncached prompt, cached, completion) and per
    edge, drawn on the team's graph."""
    per_agent = run["tokens"]["per_agent"]
    if not per_agent:
        return None
    fig, ax = _figure(2 if graph is not None else 1, 1)
    agents = list(per_agent)
    bottom = [0.0] * len(agents)
    for part, color in (("uncached prompt", "#8fb3d9"), ("cached", "#c8d9ea"),
                        ("completion", "#e08a3c")):
        vals = [per_agent[a]["prompt"] - per_agent[a]["cached"] if part == "uncached prompt"
                else per_agent[a][part] for a in agents]
        ax[0, 0].bar(agents, vals, bottom=bottom, label=part, color=color)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax[0, 0].set(ylabel="tokens per episode", title="per agent")
    ax[0, 0].legend(fontsize=7, loc="lower right")
    ax[0, 0].tick_params(axis="x", labelrotation=30, labelsize=7)
    if graph is not None:
        _draw_graph(ax[0, 1], graph, run["tokens"]["per_edge"])
    fig.suptitle(f"{label(run)}: tokens per episode (last evaluation)")
    return fig


def _draw_graph(axis: Any, graph: Any, per_edge: dict[str, float]) -> None:
    import networkx as nx

    pos = nx.circular_layout(graph) if graph.number_of_nodes() > 2 else {
        n: (float(i), 0.0) for i, n in enumerate(graph)}
    top = max(per_edge.values(), default=1.0) or 1.0
    for u, v in graph.edges():
        tokens = per_edge.get(f"{u}->{v}", 0.0)
        axis.annotate("", xy=pos[v], xytext=pos[u], arrowprops={
            "arrowstyle": "-|>", "lw": 0.5 + 5.0 * tokens / top, "color": "0.3",
            "shrinkA": 14, "shrinkB": 14, "connectionstyle": "arc3,rad=0.12"})
        mid = ((pos[u][0] + pos[v][0]) / 2, (pos[u][1] + pos[v][1]) / 2)
        axis.text(*mid, f"{tokens:.0f}", fontsize=7, color="crimson", ha="center")
    for n, (x, y) in pos.items():
        axis.text(x, y, str(n), ha="center", va="center", fontsize=8,
                  bbox={"boxstyle": "circle", "fc": "#cfe3f7", "ec": "#2b5d8a"})
    xs, ys = [x for x, _ in pos.values()], [y for _, y in pos.values()]
    axis.set_xlim(min(xs) - 0.4, max(xs) + 0.4)  # text and arrows do not move the limits
    axis.set_ylim(min(ys) - 0.4, max(ys) + 0.4)
    axis.set_axis_off()
    axis.set_title("tokens delivered per edge")


def emergence_figure(run: dict[str, Any]) -> Figure | None:
    """The language metrics of each sender over training, and replayed interventions."""
    em = run["emergence"]
    replays = run.get("interventions") or []
    if not em["agents"] and not replays:
        return None
    panels = [k for k in LANGUAGE if any(any(v is not None for v in s.get(k, []))
                                         for s in em["agents"].values())]
    panels += ["causal_influence", "importance"] if replays else []
    fig, ax = _figure(min(len(panels), 4), (len(panels) + 3) // 4, width=3.6, height=3.0)
    for k, name in enumerate(panels):
        axis = ax[k // 4, k % 4]
        if name in ("causal_influence", "importance"):
            its = [r["iteration"] for r in replays]
            for key in replays[0][name]:
                axis.plot(its, [r[name][key] for r in replays], "o-", ms=3, label=key)
        else:
            for agent, series in em["agents"].items():
                if name in series:
                    axis.plot(em["iteration"], [float("nan") if v is None else v
                                                for v in series[name]], "o-", ms=3,
                              label=agent)
        axis.set(title=name.replace("_", " "), xlabel="iteration")
        axis.legend(fontsize=6, loc="upper left")
    for k in range(len(panels), ax.size):
        ax[k // 4, k % 4].set_axis_off()
    fig.suptitle(f"{label(run)}: emergence over training (bits; greedy evaluations"
                 + ("; causal influence and importance from replays)" if replays else ")"))
    return fig


def messages_figure(run: dict[str, Any]) -> Figure | None:
    """Each sender's free-form messages over training: characters and completion tokens
    per message, vocabulary entropy, and the shares empty and cut at ``max_new_tokens``.
    Only for runs whose task writes text: symbol codes have the emergence figure."""
    msgs = run["messages"]
    if msgs["format"] != "text" or not msgs["agents"]:
        return None
    fig, ax = _figure(4, 1, width=3.6, height=3.0)
    for k, (agent, s) in enumerate(msgs["agents"].items()):
        color = f"C{k % 10}"
        for axis, key in zip(ax[0, :3], ("mean_chars", "tokens_per_message",
                                         "vocabulary_entropy"), strict=True):
            axis.plot(s["iteration"], [float("nan") if v is None else v for v in s[key]],
                      "o-", ms=3, color=color, label=agent)
        ax[0, 3].plot(s["iteration"], s["empty_share"], "o--", ms=3, color=color,
                      label=f"{agent} empty")
        ax[0, 3].plot(s["iteration"], s["cut_share"], "s-", ms=3, color=color,
                      label=f"{agent} cut")
    for axis, title in zip(ax[0], ("characters per message", "completion tokens per message",
                                   "vocabulary entropy (bits)", "share empty / cut"),
                           strict=True):
        axis.set(title=title, xlabel="iteration")
        axis.legend(fontsize=6, loc="upper left")
    ax[0, 3].set_ylim(-0.02, 1.02)
    fig.suptitle(f"Messages over training: {label(run)} (greedy evaluations)")
    return fig


def _graph(run: dict[str, Any]) -> Any | None:
    if not run.get("edges"):
        return None
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(run["tokens"]["per_agent"])
    graph.add_edges_from((u, v) for u, v, _ in run["edges"])
    return graph


def figures(data: dict[str, Any]) -> list[tuple[str, str, Figure]]:
    """``(name, caption, figure)`` for every figure of the report."""
    out = []
    runs = data["runs"]
    fig = learning_figure(runs)
    if fig is not None:
        out.append(("learning", "Learning curves (one line per training run).", fig))
    for scenario, fronts in data["pareto"].items():
        mine = [r for r in runs if r["scenario"] == scenario]
        out.append((f"cost-{scenario}", f"Cost vs success, {scenario}.",
                    cost_figure(mine, scenario, fronts)))
        if fronts["per_agent_usd"]:
            out.append((f"agents-{scenario}", f"Per-agent cost vs success, {scenario}.",
                        agent_cost_figure(mine, scenario, fronts["per_agent_usd"])))
    for i, run in enumerate(runs[:MAX_RUN_FIGURES]):
        for kind, what, fig in (("tokens", "tokens", tokens_figure(run, _graph(run))),
                                ("emergence", "emergence", emergence_figure(run)),
                                ("messages", "messages over training", messages_figure(run))):
            if fig is not None:
                out.append((f"{kind}-{i:02d}", f"{label(run)}: {what}.", fig))
    return out


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-3 and value else f"{value:.3f}"
    return str(value)


def run_rows(data: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    header = ["run", "scenario", "kind", "finished", "algorithm", "success", "best eval",
              "tokens/ep", "USD/ep", "values"]
    rows = [[label(r), r["scenario"], r["kind"], r["finished"], r.get("algorithm"),
             r["success"], r.get("best_eval_success"), r["tokens_per_episode"],
             r["usd_per_episode"], ", ".join(f"{k}={v}" for k, v in r["values"].items())]
            for r in data["runs"]]
    return header, rows


def _final(series: dict[str, list[Any]], key: str) -> Any:
    values = [v for v in series.get(key, []) if v is not None]
    return values[-1] if values else None


def language_rows(data: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    header = ["run", "agent", *LANGUAGE]
    rows = [[label(r), agent, *(_final(s, k) for k in LANGUAGE)]
            for r in data["runs"] for agent, s in r["emergence"]["agents"].items()]
    return header, rows


def message_rows(data: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The free-form message metrics of each sender at its last evaluation, for the runs
    whose task writes text (none for symbol codes)."""
    header = ["run", "agent", "iteration", *(name for _, name in MESSAGES)]
    rows = [[label(r), agent, s["iteration"][-1], *(s[k][-1] for k, _ in MESSAGES)]
            for r in data["runs"] if r["messages"]["format"] == "text"
            for agent, s in r["messages"]["agents"].items()]
    return header, rows


def replay_rows(data: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    header = ["run", "iteration", "checkpoint", "causal influence (bits)", "importance",
              "tokens that bought nothing", "replay tokens", "replay USD", "replay s"]
    rows = []
    for r in data["runs"]:
        for x in r.get("interventions") or []:
            rows.append([label(r), x["iteration"], Path(x["checkpoint"]).name,
                         ", ".join(f"{k} {v:.3f}" for k, v in x["causal_influence"].items()),
                         ", ".join(f"{k} {v:.2f}" for k, v in x["importance"].items()),
                         x["wasted_share"], x["replay_cost"]["tokens"],
                         x["replay_cost"]["cost_usd"], x["replay_cost"]["wall_s"]])
    return header, rows


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}
img{max-width:100%;border:1px solid #eee}.note{color:#a33}"""


def html_report(data: dict[str, Any], figs: list[tuple[str, str, Figure]]) -> str:
    """One self-contained page: tables, then every figure as an inline PNG."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>marl analyze</title>"
             f"<style>{STYLE}</style></head><body><h1>marl analyze: {len(data['runs'])} "
             "run(s)</h1>"]
    problems = data["problems"] + [f"{r['label']}: {n}" for r in data["runs"]
                                   for n in r["notes"]]
    if problems:
        parts.append("<h2>Problems</h2><ul>" + "".join(
            f"<li class='note'>{html.escape(p)}</li>" for p in problems) + "</ul>")
    parts.append("<h2>Runs</h2>" + _table(*run_rows(data)))
    for scenario, fronts in data["pareto"].items():
        parts.append(f"<p>Pareto front of {html.escape(scenario)} (USD per episode vs "
                     f"success): {html.escape(', '.join(fronts['usd']) or 'none')}</p>")
    parts.append("<h2>Emergence (last evaluation)</h2>" + _table(*language_rows(data)))
    header, rows = message_rows(data)
    if rows:
        parts.append("<h2>Messages (last evaluation)</h2>" + _table(header, rows))
    header, rows = replay_rows(data)
    if rows:
        parts.append("<h2>Interventions (replays)</h2>" + _table(header, rows))
    parts.append("<h2>Figures</h2>")
    for name, caption, fig in figs:
        b64 = base64.b64encode(_png(fig)).decode()
        parts.append(f"<figure id='{name}'><img alt='{html.escape(caption)}' "
                     f"src='data:image/png;base64,{b64}'><figcaption>"
                     f"{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def export_pngs(figs: list[tuple[str, str, Figure]], folder: Path) -> list[Path]:
    from marl.io import atomic_write_bytes

    return [atomic_write_bytes(folder / f"{name}.png", _png(fig)) for name, _, fig in figs]


def text_summary(data: dict[str, Any]) -> str:
    """The report's numbers as plain text for the terminal."""
    lines = []
    for header, rows in (run_rows(data), language_rows(data), message_rows(data),
                         replay_rows(data)):
        if rows:
            lines.append(" | ".join(header))
            lines += [" | ".join(_fmt(c) for c in row) for row in rows]
            lines.append("")
    for scenario, fronts in data["pareto"].items():
        lines.append(f"Pareto front, {scenario} (USD/episode vs success): "
                     f"{', '.join(fronts['usd']) or 'none'}")
    for p in data["problems"]:
        lines.append(f"problem: {p}")
    for r in data["runs"]:
        lines += [f"note: {r['label']}: {n}" for n in r["notes"]]
    return "\n".join(lines)
