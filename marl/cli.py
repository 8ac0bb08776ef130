"""The ``marl`` command line: validate, cost, run, sweep, train, analyze and topology;
``marl population`` lives in :mod:`marl.cli_population`, ``marl baseline`` in
:mod:`marl.cli_baseline`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from marl.cli_baseline import baseline
from marl.cli_population import population_app
from marl.cli_shared import err, eval_text, guarded, need_ray_extra, out, progress_bar
from marl.errors import ConfigError, MarlError
from marl.overrides import parse_sets

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="llm-marl: simulate, price and train teams of LLM agents.")
topology_app = typer.Typer(no_args_is_help=True, help="Inspect topology generators.")
app.add_typer(topology_app, name="topology")
app.add_typer(population_app, name="population")
app.command("baseline")(baseline)


@app.command()
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
                  f"{t.n_layers} layers per round), {team.rounds} round(s), {team.task.id}",
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


@app.command()
@guarded
def cost(
    scenario: Path,
    policy: str | None = typer.Option(None, help="Predict as if every policy had this "
                                                 "backend (scripted | random: exact)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Predict tokens and cost of one episode from the topology and schedule."""
    from marl.costing import predict_team, prediction_json
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


@app.command()
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
) -> None:
    """Play episodes; print success, reward, tokens and cost; write summary.json and
    episodes.jsonl. Stops early (exit 0) when costs.budget_usd would be exceeded."""
    from marl.runner import run as run_team
    from marl.runner import summarize, write_run
    from marl.team import load_team

    team = load_team(scenario)
    target = out_dir or Path("runs") / team.name
    with progress_bar(team.name, episodes, every=max(1, episodes // 10)) as tick:
        result = run_team(team, episodes, seed=seed, policy=policy, checkpoint=checkpoint,
                          batch_size=batch_size, cache=cache,
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
    out.print("format valid: " + ", ".join(f"{a} {r:.3f}" for a, r in
                                           summary["format_valid_rate"].items())
              + "   agrees with the oracle: " + ", ".join(
                  f"{a} {r:.3f}" for a, r in summary["oracle_agreement"].items()),
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


@app.command()
@guarded
def sweep(
    scenario: Path,
    grids: list[str] = typer.Option(..., "--grid", help="key=v1,v2,...: a scenario field by "
                                    "its dotted path (topology.kind, agents.1.count) or, with "
                                    "--train, train.SETTING; repeat for a product."),
    policy: str | None = typer.Option(None, help="Override every policy's backend: "
                                                 "scripted | random | tiny | hf."),
    train: Path | None = typer.Option(None, help="Train every cell with this training config "
                                                 "(e.g. configs/algorithm/magrpo.yaml)."),
    sets: list[str] = typer.Option([], "--set", help="Training config override key=value "
                                                     "(with --train)."),
    episodes: int | None = typer.Option(None, min=1, help="Episodes per cell (default 32)."),
    seed: int | None = typer.Option(None, min=0, help="Seed (default: the scenario's)."),
    workers: int | None = typer.Option(None, min=1, help="Worker processes (default: "
                                                         "min(cells, CPUs); 1: in-process)."),
    out_dir: Path | None = typer.Option(None, "--out", help="Sweep directory (default "
                                                            "runs/sweep-NAME)."),
    ray: bool = typer.Option(False, "--ray", help="Run the cells as Ray tasks (a local Ray, "
                                                  "or RAY_ADDRESS) instead of processes."),
    address: str | None = typer.Option(None, help="Ray cluster to run the cells on "
                                                   "(implies --ray)."),
    cache: Path | None = typer.Option(None, help="API policies: store responses here by "
                                                 "request hash and answer repeats from it."),
) -> None:
    """Evaluate (or train) every cell of a grid over scenario fields; write cells.jsonl,
    table.md, table.csv and pareto.png. Run it again to resume."""
    from marl.sweep import run_sweep
    from marl.sweep_tables import table_rows

    if ray or address:
        need_ray_extra("marl sweep --ray")
    try:
        report = run_sweep(scenario, grids, policy=policy, train=train, sets=sets,
                           episodes=episodes, seed=seed, workers=workers, out=out_dir,
                           ray=ray, address=address, cache=cache,
                           log=lambda msg: err.print(msg, markup=False, highlight=False))
    except KeyboardInterrupt:
        err.print("interrupted; finished cells are kept in cells.jsonl: run the same command "
                  "again to resume.", highlight=False)
        raise typer.Exit(130) from None
    header, rows = table_rows(report.cells, report.rows)
    table = Table(title=f"{len(report.cells)} cells: {report.ran} run, {report.skipped} "
                        "skipped (done before)")
    for i, col in enumerate(header[:-1]):  # errors are printed above and kept in table.md
        table.add_column(col, justify="right" if i > len(report.cells[0].values) else "left")
    for row in rows:
        table.add_row(*map(escape, row[:-1]))
    out.print(table)
    out.print("wrote " + ", ".join(str(p) for p in [report.out / "cells.jsonl", *report.paths])
              + f" and {report.out / 'cells'}/", highlight=False)


@app.command()
@guarded
def train(
    scenario: Path,
    config: Path | None = typer.Option(None, help="YAML overrides of the training config "
                                                  "(e.g. configs/algorithm/grpo.yaml)."),
    sets: list[str] = typer.Option([], "--set", help="Config override key=value."),
    out_dir: Path | None = typer.Option(None, "--out", help="Run directory "
                                                            "(default runs/NAME-ALGORITHM)."),
    resume: bool = typer.Option(False, help="Continue the run in --out from its last "
                                            "checkpoint."),
    use_wandb: bool = typer.Option(False, "--wandb", help="Also log to Weights & Biases "
                                                          "(offline without an API key)."),
) -> None:
    """Train the scenario's model policies (MAGRPO by default)."""
    from marl.algorithms.config import load_config
    from marl.costing import predict_team
    from marl.team import load_team
    from marl.trainer import Trainer

    team = load_team(scenario)
    cfg = load_config(config, [*sets, *(["wandb=true"] if use_wandb else [])])
    target = out_dir or Path("runs") / f"{team.name}-{cfg.algorithm}"
    trainer = Trainer(team, cfg, target, resume=resume,
                      log=lambda msg: err.print(msg, highlight=False))
    episodes = cfg.episodes_per_iter * cfg.group_size
    calls = len(team.ids) * team.rounds
    tokens = predict_team(team).total.total
    warmup = (f"{cfg.warmup} warm-up steps on the {cfg.warmup_source} policy's messages, then "
              if cfg.warmup else "")
    out.print(f"{team.name}: {warmup}{cfg.algorithm}, {len(trainer.learner.trainables)} "
              f"trainable policies; {episodes} episodes ({cfg.episodes_per_iter} instances × "
              f"{cfg.group_size}) and {episodes * calls} completions per iteration, at most "
              f"{episodes * tokens:,} tokens per iteration"
              + (f"; {len(cfg.curriculum)} curriculum stages" if cfg.curriculum else "")
              + f"; writing {target}", highlight=False)
    if cfg.uses_oracle:
        used = [f"sft_coef {cfg.sft_coef}" + (f" with {cfg.demo_episodes} oracle-played "
                                              "instances per iteration" if cfg.demo_episodes
                                              else "")] if cfg.sft_coef else []
        used += ["the oracle's messages in the warm-up"] if cfg.warmup_source == "oracle" else []
        out.print(f"uses the task oracle ({'; '.join(used)}): what this run learns is "
                  "imitation, not discovery (summary.json: uses_oracle true)", highlight=False)
    total = cfg.warmup + cfg.iterations
    with progress_bar("train", total, trainer.step_count, transient=False) as tick:
        try:
            summary = trainer.train(progress=lambda row: tick(row["step"], _row_text(row)))
        except KeyboardInterrupt:
            err.print(f"interrupted after iteration {trainer.iteration}; continue with "
                      f"marl train {scenario} --out {target} --resume", highlight=False)
            raise typer.Exit(130) from None
    best = summary["best"]
    found = (f"best eval success {best['eval_success_rate']:.3f} at iteration "
             f"{best['iteration']}" if best["iteration"] is not None else
             "no evaluation of the " + ("last curriculum stage" if cfg.curriculum else
                                        "scenario") + " yet")
    out.print(f"done: {summary['warmup_steps']} warm-up steps and {summary['iterations']} "
              f"iterations in {summary['wall_s']:.0f} s; {found}; checkpoints in "
              f"{target / 'checkpoints'}", highlight=False)


def _row_text(row: dict[str, Any]) -> str:
    if row["phase"] == "warmup":
        text = f"warm-up {row['warmup_step']}: sft loss {row['sft_loss']:.3f}"
        if "format_valid_rate" in row:
            text += (f" | format valid {_low(row['format_valid_rate']):.3f}, sampled success "
                     f"{row['success_rate']:.3f}")
        if "habit_agreement" in row:  # the agent furthest from its habits
            text += f", habits learnt {_low(row['habit_agreement']):.3f}"
    else:
        text = (f"iter {row['iteration']}: success {row['success_rate']:.3f} reward "
                f"{row['reward_mean']:.3f} tokens/ep {row['tokens_per_episode']:.0f} loss "
                f"{row['loss']:.3f} {row['samples_per_s']:.0f} samples/s")
        if "side_reward_mean" in row:  # competitive: every team's reward
            text += " | reward " + ", ".join(f"{side} {v:.3f}"
                                             for side, v in row["side_reward_mean"].items())
    if row.get("stage"):
        text = f"[{row['stage']}] {text}"
    return text + eval_text(row)


def _low(rates: dict[str, float]) -> float:
    """The lowest per-agent rate (the agent whose format is worst)."""
    return min(rates.values())


@topology_app.command("show")
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


@app.command()
@guarded
def analyze(
    runs: list[Path] = typer.Argument(..., help="Run, sweep or population directories."),
    report: Path | None = typer.Option(None, "--out", help="HTML report (default: "
                                       "RUN/report.html for one run, else ./report.html)."),
    as_json: bool = typer.Option(False, "--json", help="Print the numbers as JSON."),
    figures_dir: Path | None = typer.Option(None, "--figures", help="Also write every figure "
                                            "as a PNG into this folder."),
    points: int = typer.Option(20, min=1, help="Evaluations per run in the emergence curves."),
    replay: bool = typer.Option(False, help="Replay every kept checkpoint to measure causal "
                                "influence and counterfactual importance (costs tokens; "
                                "cached in RUN/analysis/)."),
    replay_episodes: int = typer.Option(64, min=1, help="Episodes per replay."),
    replay_samples: int = typer.Option(8, min=1, help="Listener samples per intervention."),
    seed: int = typer.Option(0, min=0, help="Seed of the replays."),
) -> None:
    """Report on runs: learning against cost, Pareto fronts, where tokens go, and how the
    agents came to collaborate (emergence metrics)."""
    from marl.analysis.analyze import analyze as numbers
    from marl.analysis.report import export_pngs, figures, html_report, text_summary
    from marl.io import atomic_write_text

    data = numbers(runs, points)
    if not data["runs"]:
        raise MarlError("no run to analyze:\n  " + "\n  ".join(data["problems"]))
    if replay:
        from marl.analysis.replay import replay_run

        for run in data["runs"]:
            if run.get("tokens_are") == "symbols":
                err.print(f"{run['label']}: an RLlib baseline (symbol agents, no language "
                          "model checkpoints); its interventions are not replayed",
                          highlight=False)
            elif run["kind"] == "train" and run["edges"] is not None:
                run["interventions"] = replay_run(Path(run["path"]), replay_episodes,
                                                  replay_samples, seed,
                                                  log=lambda m: err.print(m, highlight=False))
    figs = figures(data)
    target = report or (runs[0] / "report.html" if len(runs) == 1 and data["runs"][0][
        "path"] == str(runs[0]) else Path("report.html"))
    atomic_write_text(target, html_report(data, figs))
    written = export_pngs(figs, figures_dir) if figures_dir is not None else []
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        out.print(escape(text_summary(data)), highlight=False)
    err.print(f"wrote {target}" + (f" and {len(written)} PNG(s) in {figures_dir}"
                                   if written else ""), highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
