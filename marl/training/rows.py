"""What the trainer's metrics rows report: the figures of an iteration's batch, and an
evaluation of the team (greedy, on held-out instances of every split of its task)."""

from __future__ import annotations

from typing import Any

from marl import seeds
from marl.algorithms.config import TrainConfig
from marl.algorithms.warmup import Habits, habit_agreement
from marl.analysis.emergence import mutual_information
from marl.cost.ledger import Ledger
from marl.rollout import EpisodeBatch, collect
from marl.team import Team


def evaluation(team: Team, policies: dict, cfg: TrainConfig, sampled: bool = False,
               habits: Habits | None = None) -> tuple[dict[str, Any], list[dict]]:
    """Greedy play of ``eval_episodes`` held-out instances of every split of the task
    (``eval_<split>_success_rate`` for splits other than ``train``); with ``sampled``
    also the same instances sampled, as the training rows report them; with ``habits``
    (the warm-up's) each agent's ``habit_agreement`` in greedy play. The greedy play's
    ``input_information`` says how much each agent's output depends on what it read.
    Returns the row's figures and every episode's record."""
    row: dict[str, Any] = {}
    records: list[dict] = []
    seed = seeds.derive_seed(cfg.seed, seeds.EVAL)
    task = team.task
    for split in [task.eval_split, *(s for s in task.splits if s not in ("train",
                                                                         task.eval_split))]:
        batch = collect(team, policies, cfg.eval_episodes, 1, seed=seed, greedy=True,
                        split=split)
        records += batch.records
        key = "eval" if split == task.eval_split else f"eval_{split}"
        row[f"{key}_success_rate"] = float(batch.success.float().mean())
        if split == task.eval_split:
            row.update(batch.side_figures("eval_"))
            row.update(eval_reward_mean=float(batch.reward.mean()),
                       eval_format_valid_rate=batch.per_agent_rate(batch.valid),
                       **batch.oracle_figures("eval_oracle_agreement"))
            row["input_information"] = input_information(batch)
            if habits is not None:
                row["habit_agreement"] = habit_agreement(team, batch, habits)
    if sampled:
        batch = collect(team, policies, cfg.eval_episodes, 1, seed=seed, split=task.eval_split)
        row.update(success_rate=float(batch.success.float().mean()),
                   format_valid_rate=batch.per_agent_rate(batch.valid),
                   **batch.oracle_figures("oracle_agreement"))
    return row, records


def input_information(batch: EpisodeBatch) -> dict[str, float]:
    """Per agent whose observations vary in ``batch``, the mutual information (bits, plug-in)
    between what it read and what it said, over its calls. In greedy play it is the entropy
    of the agent's outputs: 0 for an agent that says the same whatever it read, through
    which reward cannot reach the team (docs/learning.md, "The format warm-up")."""
    calls: dict[str, tuple[list[str], list[str]]] = {a: ([], []) for a in batch.agents}
    for b, record in enumerate(batch.records):
        for k, call in enumerate(record["transcript"]):
            seen, said = calls[call["agent"]]
            seen.append(batch.observations[b][k])
            said.append(call["message"])
    return {agent: mutual_information(said, seen, correction="none")
            for agent, (seen, said) in calls.items() if len(set(seen)) > 1}


def iteration_figures(batch: EpisodeBatch, stats: dict, seconds: float) -> dict[str, Any]:
    """Reward, success, format, tokens and cost per episode of a training batch, the
    update's ``stats`` (losses, gradient norm, the tokens of rollouts made inside it) and
    the samples per second of an iteration that took ``seconds``."""
    n = len(batch.records)
    tokens = batch.ledger["prompt"] + batch.ledger["completion"]  # (B, R, N)
    return {"reward_mean": float(batch.reward.mean()),
            "success_rate": float(batch.success.float().mean()),
            "score_mean": float(batch.score.mean()),
            "format_valid_rate": batch.per_agent_rate(batch.valid),
            **batch.oracle_figures("oracle_agreement"),
            **batch.scoring_figures(),
            "tokens_per_episode": float(tokens.sum()) / n,
            "completion_tokens_per_episode": float(batch.ledger["completion"].sum()) / n,
            "cost_per_episode": float(Ledger(batch.rows).cost()) / n,
            "tokens_per_agent": {a: float(tokens[..., i].sum()) / n
                                 for i, a in enumerate(batch.agents)},
            **{k: stats.get(k, 0.0) for k in ("loss", "pg_loss", "sft_loss", "entropy", "kl",
                                              "grad_norm", "clip_frac")},
            **{k: stats[k] for k in ("value_loss", "value_grad_norm", "rare_answers",
                                      "signal_entropy", "influence", "full_feedback")
               if k in stats},
            **{k: stats.get(k, 0.0) for k in ("demo_tokens", "demo_cost_usd",
                                              "counterfactual_tokens",
                                              "counterfactual_cost_usd")},
            "skipped_updates": stats.get("skipped", 0.0), "sft_coef": stats.get("sft_coef"),
            "samples_per_s": int(batch.mask.any(-1).sum()) / seconds,
            **batch.side_figures("")}
