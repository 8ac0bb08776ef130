"""The numbers of ``marl analyze``: learning curves, cost-vs-reward points and fronts,
where the tokens go, and the emergence and free-form message metrics of each run's
evaluations over training.

Everything comes from the run directories (see :mod:`marl.analysis.runs`); nothing here
imports torch. Replayed interventions (:mod:`marl.analysis.replay`) are merged in by the
caller when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from marl.analysis import emergence, freeform
from marl.analysis.runs import Run, discover, read_jsonl
from marl.analysis.spend import cumulative, pareto_front, token_breakdown


def learning_curve(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Per RL iteration: sampled success, reward and tokens per episode, the spend so far
    (tokens and USD, with the demonstration and counterfactual rollouts made inside the
    updates), and the greedy evaluations where there was one.

    >>> rows = [{"phase": "warmup", "step": 1},
    ...         {"phase": "rl", "iteration": 1, "episodes": 4, "success_rate": 0.5,
    ...          "reward_mean": 0.5, "tokens_per_episode": 10.0, "cost_per_episode": 0.1},
    ...         {"phase": "rl", "iteration": 2, "episodes": 8, "success_rate": 1.0,
    ...          "reward_mean": 1.0, "tokens_per_episode": 10.0, "cost_per_episode": 0.1,
    ...          "counterfactual_tokens": 5.0, "eval_success_rate": 1.0}]
    >>> c = learning_curve(rows)
    >>> c["cum_tokens"], c["eval_iteration"], c["eval_success"]
    ([40.0, 85.0], [2], [1.0])
    """
    rl = [r for r in rows if r.get("phase", "rl") == "rl" and "success_rate" in r]
    tokens, usd = [], []
    before = 0
    for r in rl:
        n = r.get("episodes", before) - before
        before = r.get("episodes", before)
        tokens.append(n * r.get("tokens_per_episode", 0.0) + r.get("demo_tokens", 0.0)
                      + r.get("counterfactual_tokens", 0.0))
        usd.append(n * r.get("cost_per_episode", 0.0) + r.get("demo_cost_usd", 0.0)
                   + r.get("counterfactual_cost_usd", 0.0))
    cum_tokens, cum_usd = cumulative(tokens), cumulative(usd)
    evals = [i for i, r in enumerate(rl) if "eval_success_rate" in r]
    return {"iteration": [r["iteration"] for r in rl],
            "success": [r["success_rate"] for r in rl],
            "reward": [r.get("reward_mean") for r in rl],
            "tokens_per_episode": [r.get("tokens_per_episode") for r in rl],
            "cum_tokens": cum_tokens, "cum_usd": cum_usd,
            "eval_iteration": [rl[i]["iteration"] for i in evals],
            "eval_success": [rl[i]["eval_success_rate"] for i in evals],
            "eval_cum_tokens": [cum_tokens[i] for i in evals],
            "eval_cum_usd": [cum_usd[i] for i in evals]}


def senders_language(records: Sequence[dict[str, Any]],
                     answer_agents: Sequence[str] = ()) -> dict[str, dict[str, list[Any]]]:
    """Per agent that sends messages: its messages (its calls of an episode joined by a
    space, its final answer left out), its private inputs, and the meanings (the task's
    attribute vector where it has one, else the agent's private text)."""
    out: dict[str, dict[str, list[Any]]] = {}
    for rec in records:
        transcript = rec.get("transcript", [])
        last = max((m["round"] for m in transcript), default=0)
        said: dict[str, list[str]] = {}
        for m in transcript:
            if m["agent"] in answer_agents and m["round"] == last:
                continue
            said.setdefault(m["agent"], []).append(str(m["message"]))
        private = rec.get("private", {})
        meaning = rec.get("instance", {}).get("meaning")
        for agent, messages in said.items():
            lang = out.setdefault(agent, {"messages": [], "inputs": [], "meanings": []})
            lang["messages"].append(" ".join(messages))
            lang["inputs"].append(private.get(agent))
            lang["meanings"].append(tuple(meaning) if meaning is not None
                                    else (private.get(agent),))
    return out


def language_metrics(lang: dict[str, list[Any]]) -> dict[str, float | None]:
    """Entropy, mutual information with the private input (Miller-Madow corrected),
    speaker consistency, topographic similarity and, for attribute-vector meanings,
    positional and bag-of-symbols disentanglement (None where undefined)."""
    messages, inputs, meanings = lang["messages"], lang["inputs"], lang["meanings"]
    stats: dict[str, float | None] = dict(emergence.message_statistics(messages))
    known = [i for i, x in enumerate(inputs) if x is not None]
    stats["mutual_information"] = stats["speaker_consistency"] = None
    if len(known) >= 2:
        msgs, ins = [messages[i] for i in known], [inputs[i] for i in known]
        stats["mutual_information"] = emergence.mutual_information(msgs, ins)
        stats["speaker_consistency"] = emergence.speaker_consistency(msgs, ins)
    stats["topographic_similarity"] = stats["posdis"] = stats["bosdis"] = None
    if len(set(meanings)) >= 2 and all(m[0] is not None for m in meanings):
        topsim = emergence.topographic_similarity(meanings, messages)
        stats["topographic_similarity"] = None if topsim != topsim else topsim
        if len(meanings[0]) > 1:
            stats["posdis"] = emergence.posdis(meanings, messages)
            stats["bosdis"] = emergence.bosdis(meanings, messages)
    return stats


def _team(run: Run) -> Any | None:
    """The team of the run's ``scenario.yaml`` (None when the run did not keep it)."""
    if run.scenario_file is None:
        run.notes.append("no scenario.yaml (a run from before it was kept): the graph is not "
                         "drawn and every message counts as a message, answers included.")
        return None
    from marl.errors import MarlError
    from marl.team import load_team

    try:
        return load_team(run.scenario_file)
    except MarlError as exc:
        run.notes.append(f"scenario.yaml does not load ({str(exc).splitlines()[0]}).")
        return None


Evaluations = list[tuple[int, list[dict[str, Any]]]]  # (iteration, its episode records)


def sampled_evaluations(run: Run, points: int, split: str = "train") -> Evaluations:
    """The episodes of ``split`` (the task's evaluation split) of up to ``points``
    evaluations spread over the run (the last one always included; an evaluation run's
    episodes are iteration 0), leaving out evaluations without any."""
    chosen = [(0, run.episodes_file)] if run.kind == "eval" else _spread(run.evals, points)
    out = []
    for iteration, path in chosen:
        if path is None:
            continue
        records = [r for r in read_jsonl(path, run.notes) if r.get("split", "train") == split]
        if records:
            out.append((iteration, records))
    return out


def emergence_over_training(evaluations: Evaluations,
                            answer_agents: Sequence[str]) -> dict[str, Any]:
    """The language metrics of each sampled evaluation (:func:`sampled_evaluations`)."""
    series: dict[str, dict[str, list[Any]]] = {}
    iterations = []
    for iteration, records in evaluations:
        iterations.append(iteration)
        for agent, lang in senders_language(records, answer_agents).items():
            for key, value in language_metrics(lang).items():
                series.setdefault(agent, {}).setdefault(key, []).append(value)
    return {"iteration": iterations, "agents": series}


def message_metrics(records: Sequence[dict[str, Any]], answer_agents: Sequence[str] = ()
                    ) -> dict[str, dict[str, float | None]]:
    """Per agent that sends messages, over every message it sent in ``records`` (answers
    left out, as in :func:`senders_language`, and so are the turns of failed calls, which
    made no call): characters and words (:func:`freeform.message_lengths`), completion
    tokens per message (from its ledger rows of those calls; None when none matches),
    vocabulary entropy and the shares empty and cut (:mod:`marl.analysis.freeform`).

    >>> rec = {"transcript": [
    ...     {"round": 0, "layer": 0, "agent": "s", "message": "Red cube", "flags": {}},
    ...     {"round": 0, "layer": 1, "agent": "l", "message": "0", "flags": {}}],
    ...     "ledger": [{"round": 0, "layer": 0, "agent": "s", "completion_tokens": 3},
    ...                {"round": 0, "layer": 1, "agent": "l", "completion_tokens": 1}]}
    >>> m = message_metrics([rec], answer_agents=["l"])
    >>> list(m), m["s"]["mean_chars"], m["s"]["tokens_per_message"]
    (['s'], 8.0, 3.0)
    """
    sent: dict[str, list[dict[str, Any]]] = {}
    tokens: dict[str, list[int]] = {}
    for rec in records:
        transcript = rec.get("transcript", [])
        last = max((m["round"] for m in transcript), default=0)
        calls = set()
        for m in transcript:
            void = {"error", "skipped"} & set(m.get("flags", {}))
            if void or (m["agent"] in answer_agents and m["round"] == last):
                continue
            sent.setdefault(m["agent"], []).append(m)
            calls.add((m["round"], m.get("layer"), m["agent"]))
        for row in rec.get("ledger", []):
            if (row.get("round"), row.get("layer"), row["agent"]) in calls:
                tokens.setdefault(row["agent"], []).append(row["completion_tokens"])
    out = {}
    for agent, entries in sent.items():
        texts = [m["message"] for m in entries]
        spent = tokens.get(agent, [])
        out[agent] = {**freeform.message_lengths(texts),
                      "tokens_per_message": sum(spent) / len(spent) if spent else None,
                      "vocabulary_entropy": freeform.vocabulary_entropy(texts),
                      **freeform.empty_or_cut_share(entries)}
    return out


def messages_over_training(evaluations: Evaluations,
                           answer_agents: Sequence[str]) -> dict[str, dict[str, list[Any]]]:
    """Per sending agent, :func:`message_metrics` of each sampled evaluation it sent in,
    each key a list aligned with the agent's own ``iteration`` list."""
    series: dict[str, dict[str, list[Any]]] = {}
    for iteration, records in evaluations:
        for agent, metrics in message_metrics(records, answer_agents).items():
            mine = series.setdefault(agent, {"iteration": []})
            mine["iteration"].append(iteration)
            for key, value in metrics.items():
                mine.setdefault(key, []).append(value)
    return series


def _spread(items: Sequence[Any], k: int) -> list[Any]:
    """At most ``k`` items evenly spread, first and last included.

    >>> _spread(list(range(10)), 4)
    [0, 3, 6, 9]
    """
    if len(items) <= k:
        return list(items)
    if k <= 1:
        return [items[-1]]
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def run_numbers(run: Run, points: int = 20) -> dict[str, Any]:
    """Everything the report shows about one run. ``messages``: the task's message
    ``format`` ("codes", "text", or None without a loadable scenario) and the free-form
    message curves of each sender (:func:`messages_over_training`)."""
    team = _team(run)
    answer_agents = team.answer_agents if team is not None else ()
    split = team.task.eval_split if team is not None else "train"  # what evaluations play
    summary = run.summary or {}
    out: dict[str, Any] = {
        "label": run.label, "path": str(run.path), "kind": run.kind, "group": run.group,
        "scenario": summary.get("scenario") or (team.name if team is not None else "?"),
        "values": run.values, "finished": run.finished, "notes": run.notes,
        "edges": [list(e) for e in team.topo.edges()] if team is not None else None}
    if run.kind == "train":
        out["curve"] = learning_curve(run.rows)
        out["uses_oracle"] = summary.get("uses_oracle", (run.config or {}).get(
            "sft_coef", 0) not in (0, 0.0, None))
        out["answer_feedback"] = summary.get("answer_feedback", "full" if any(
            r.get("full_feedback") for r in run.rows) else "sampled")
        out["algorithm"] = summary.get("algorithm", (run.config or {}).get("algorithm"))
        out["tokens_are"] = summary.get("tokens_are", "tokens")
        curve = out["curve"]
        out["success"] = curve["eval_success"][-1] if curve["eval_success"] else (
            curve["success"][-1] if curve["success"] else None)
        out["best_eval_success"] = max(curve["eval_success"], default=None)
    else:
        out["success"] = summary.get("success_rate")
        out["uses_oracle"] = "scripted" in str(summary.get("policy"))
    episodes = run.episodes_file
    records = read_jsonl(episodes, run.notes) if episodes is not None else []
    records = [r for r in records if r.get("split", "train") == split]
    tokens = token_breakdown(r.get("ledger", []) for r in records)
    out["tokens"] = tokens
    out["tokens_per_episode"] = tokens["total"]["tokens"] or None
    out["usd_per_episode"] = tokens["total"]["cost_usd"] or None
    evaluations = sampled_evaluations(run, points, split)
    out["emergence"] = emergence_over_training(evaluations, answer_agents)
    out["messages"] = {"format": team.task.messages if team is not None else None,
                       "agents": messages_over_training(evaluations, answer_agents)}
    return out


def fronts(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The Pareto fronts of success against USD and against tokens per episode, over the
    runs of a scenario, and per agent against each agent's own USD per episode."""
    ok = [r for r in runs if r["success"] is not None and r["usd_per_episode"] is not None]
    usd = pareto_front([r["usd_per_episode"] for r in ok], [r["success"] for r in ok])
    tok = pareto_front([r["tokens_per_episode"] for r in ok], [r["success"] for r in ok])
    agents = sorted({a for r in ok for a in r["tokens"]["per_agent"]})
    per_agent = {}
    for a in agents:
        mine = [r for r in ok if a in r["tokens"]["per_agent"]]
        front = pareto_front([r["tokens"]["per_agent"][a]["cost_usd"] for r in mine],
                             [r["success"] for r in mine])
        per_agent[a] = [mine[i]["label"] for i in front]
    return {"usd": [ok[i]["label"] for i in usd], "tokens": [ok[i]["label"] for i in tok],
            "per_agent_usd": per_agent}


def analyze(paths: Sequence[Any], points: int = 20) -> dict[str, Any]:
    """The numbers of the report for every run found under ``paths``."""
    found, problems = discover(list(paths))
    runs = [run_numbers(run, points) for run in found]
    scenarios = sorted({r["scenario"] for r in runs})
    return {"runs": runs, "problems": problems,
            "pareto": {s: fronts([r for r in runs if r["scenario"] == s]) for s in scenarios}}
