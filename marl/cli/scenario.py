"""``marl validate``, ``marl cost``, ``marl run`` and ``marl topology show``: check a scenario,
predict its cost, play it, and look at a topology."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from marl.cli.shared import err, guarded, out, progress_bar
from marl.errors import ConfigError, MarlError
from marl.overrides import parse_sets


def validate(files: list[Path] = typer.Argument(..., help="Scenario files.")) -> None:
    """Check scenario files; print every problem with its key path."""
    from marl.team import load_team

    failed = 0
    for f in files:
        try:
            team = load_team(f)
        except MarlError as exc:
            failed += 1
            err.print(f"[red]✗[/] {escape(str(exc))}", highlight=False)
            continue
        t = team.topo
        out.print(f"[green]✓[/] {f}: {team.name}: {len(t.agents)} agents, "
                  f"{team.scenario.topology.kind} topology ({len(t.edges())} edges, "
                  f"{t.n_layers} layers per round), {team.rounds} round(s), {team.task.id}"
                  + (f"; {team.task.describe()}" if team.task.describe() else ""),
                  highlight=False)
    if failed:
        err.print(f"{failed} of {len(files)} file(s) invalid.")
        raise typer.Exit(2)


def _token_table(title: str, rows: dict[str, dict[str, float]], total: dict[str, float],
                 cost_key: str) -> Table:
    table = Table(title=title)
    for col in ("agent", "prompt", "cached", "completion", "total", "cost (USD)"):
        table.add_column(col, justify="left" if col == "agent" else "right")
    for name, r in [*rows.items(), ("TOTAL", total)]:
        table.add_row(name, *(f"{r[k]:,.1f}" for k in ("prompt", "cached", "completion",
                                                        "total")), f"{r[cost_key]:.8f}",
                      style="bold" if name == "TOTAL" else None)
    return table


@guarded
def cost(
    scenario: Path,
    policy: str | None = typer.Option(None, help="Predict as if every policy had this "
                                                 "backend (scripted | random: exact)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Predict tokens and cost of one episode from the topology and schedule."""
    from marl.cost.predict import predict_team, prediction_json
    from marl.policies import BACKENDS
    from marl.team import load_team

    team = load_team(scenario)
    if policy is not None and policy not in BACKENDS:
        raise ConfigError(f"unknown --policy {policy!r}; valid: {', '.join(BACKENDS)}.")
    data = prediction_json(team, predict_team(team, backend=policy), backend=policy)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    total = {**data["tokens_per_episode"], "cost_usd": data["cost_usd_per_episode"]}
    kind = {"exact": "exact", "upper bound": "upper bound (messages at max_new_tokens)",
            "estimate": f"estimate: {data.get('estimate_reason')}; messages at "
                        "max_new_tokens"}[data["kind"]]
    out.print(_token_table(f"{team.name}: predicted tokens per episode ({kind})",
                           data["per_agent"], total, "cost_usd"))
    edges = Table(title="per edge (tokens delivered per episode)")
    for col in ("edge", "tokens", "cost (USD)"):
        edges.add_column(col, justify="left" if col == "edge" else "right")
    for name, e in data["per_edge"].items():
        edges.add_row(name, str(e["tokens"]), f"{e['cost_usd']:.8f}")
    out.print(edges)
    if "range" in data:  # free-form messages
        low, high, fixed = (data["range"][k] for k in ("min", "max", "fixed"))
        out.print(f"free-form messages: the fixed part is {fixed['tokens_per_episode']['total']:,} "
                  f"tokens (exact); an episode takes {low['tokens_per_episode']['total']:,} to "
                  f"{high['tokens_per_episode']['total']:,} tokens, "
                  f"{low['cost_usd_per_episode']:.8f} to {high['cost_usd_per_episode']:.8f} USD "
                  "(an estimate: the tables above are the upper end)", highlight=False)


@guarded
def run(
    scenario: Path,
    policy: str | None = typer.Option(None, help="Override every policy's backend: "
                                                 "scripted | random | tiny | hf."),
    episodes: int = typer.Option(100, min=1, help="Episodes to play."),
    seed: int | None = typer.Option(None, min=0, help="Seed (default: the scenario's)."),
    out_dir: Path | None = typer.Option(None, "--out", help="Run directory (default runs/NAME)."),
    checkpoint: Path | None = typer.Option(None, help="Trained weights: a directory with one "
                                                      "folder per policy name."),
    batch_size: int = typer.Option(64, min=1, help="Episodes played together in one batch."),
    cache: Path | None = typer.Option(None, help="API policies: store responses here by "
                                                 "request hash and answer repeated requests "
                                                 "from it (no HTTP, nothing paid)."),
    cache_max_mb: float = typer.Option(2048, min=1, help="Size cap of --cache on disk; past "
                                                         "it the least recently used "
                                                         "responses are removed."),
    split: str | None = typer.Option(None, help="The task's instance split to play "
                                                "(default: the one evaluations play)."),
) -> None:
    """Play episodes; print success, reward, tokens and cost; write summary.json and
    episodes.jsonl. Stops early (exit 0) when costs.budget_usd would be exceeded."""
    from marl.runner import run as run_team
    from marl.runner import summarize, write_run
    from marl.team import load_team

    team = load_team(scenario)
    target = out_dir or Path("runs") / team.name
    if cache is not None:
        from marl.policies.api_cache import ResponseCache

        cache = ResponseCache(cache, max_bytes=int(cache_max_mb * 2**20))
    with progress_bar(team.name, episodes, every=max(1, episodes // 10)) as tick:
        result = run_team(team, episodes, seed=seed, policy=policy, checkpoint=checkpoint,
                          batch_size=batch_size, cache=cache, split=split,
                          on_episode=lambda n: tick(n, f"{team.name}: {n}/{episodes} episodes"))
    summary = summarize(result, policy)
    episodes = summary["episodes"]
    write_run(target, result, summary)
    total = {**summary["tokens_per_episode"], "cost": summary["cost_usd_per_episode"]}
    rows = {a: {**r, "cost": r["cost_usd_per_episode"]} for a, r in summary["per_agent"].items()}
    out.print(_token_table(f"{team.name}: tokens per episode ({episodes} episodes)", rows,
                           total, "cost"))
    out.print(f"success rate {summary['success_rate']:.3f}  reward {summary['reward_mean']:.4f}"
              f"  (score {summary['score_mean']:.4f} − token penalty "
              f"{summary['token_penalty_mean']:.4f})  {summary['episodes_per_s']:.1f} episodes/s"
              f"  {summary['tokens_per_s']:,.0f} generated tokens/s",
              highlight=False)
    for side, figures in summary.get("sides", {}).items():
        out.print(f"team {side}: success rate {figures['success_rate']:.3f}  score "
                  f"{figures['score_mean']:.4f}  reward {figures['reward_mean']:.4f}  "
                  f"{figures['tokens_per_episode']:.0f} tokens/episode", highlight=False)
    agrees = summary.get("oracle_agreement")  # absent: the task has no scripted oracle
    out.print("format valid: " + ", ".join(f"{a} {r:.3f}" for a, r in
                                           summary["format_valid_rate"].items())
              + ("   agrees with the oracle: " + ", ".join(
                  f"{a} {r:.3f}" for a, r in agrees.items()) if agrees else ""),
              highlight=False)
    _print_run_notes(summary, result.episodes)
    out.print(f"wrote {target / 'summary.json'} and {target / 'episodes.jsonl'}", highlight=False)


def _print_run_notes(summary: dict[str, Any], episodes: list[dict[str, Any]]) -> None:
    """What an API run did (requests, retries, cache, money paid), failed episodes, and a
    stop by the budget."""
    if "api" in summary:
        calls = sum(s["calls"] for s in summary["api"].values())
        out.print(f"API: {calls} calls, {summary['api_retries']} retries, "
                  f"{summary['cache_hits']} answered from the cache; paid "
                  f"{summary['api_usd_spent']:.6f} USD in this run", highlight=False)
    if summary.get("unscored_episodes"):
        first = next(e["score_reason"] for e in episodes if "score_reason" in e)
        out.print(f"{summary['unscored_episodes']} episode(s) scored 0 for a reason (kept as "
                  f"score_reason in episodes.jsonl); first: {first}", highlight=False)
    if "verify_s_total" in summary:
        out.print(f"scoring took {summary['verify_s_total']:.2f} s "
                  f"({1000 * summary['verify_s_per_episode']:.1f} ms per episode)",
                  highlight=False)
    if summary["failed_episodes"]:
        first = next(e["error"] for e in episodes if e.get("error"))
        out.print(f"{summary['failed_episodes']} episode(s) failed (recorded with score 0 and "
                  f"their reason in episodes.jsonl); first: {first}", highlight=False)
    if summary.get("stopped") == "budget":
        out.print(f"stopped by the budget: played {summary['episodes']} of "
                  f"{summary['episodes_requested']} episodes, spent "
                  f"{float(summary['cost_usd_total']):.6f} USD of costs.budget_usd "
                  f"{summary['budget_usd']:.6f}; the next episode could cost up to "
                  f"{summary['worst_episode_usd']:.6f} USD", highlight=False)


@guarded
def topology_show(
    kind: str,
    agents: int = typer.Option(4, min=1, max=256, help="Number of agents a0..aN-1."),
    sets: list[str] = typer.Option([], "--set", help="Generator parameter key=value."),
    out_png: Path | None = typer.Option(None, "--out", help="Write a PNG drawing here."),
) -> None:
    """Print (and optionally draw) a built-in topology."""
    from orchestration.compile import compile_topology
    from orchestration.draw import draw_png, render_text
    from orchestration.topologies import TopologyError, build

    ids = [f"a{i}" for i in range(agents)]
    try:
        graph = build(kind, ids, **parse_sets(sets))
        compile_topology(graph)
    except TopologyError as exc:
        raise ConfigError(f"{kind}: {exc}") from None
    out.print(render_text(graph), highlight=False)
    if out_png is not None:
        out.print(f"wrote {draw_png(graph, out_png, title=f'{kind} ({agents} agents)')}")
