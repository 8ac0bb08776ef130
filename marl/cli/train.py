"""``marl train``: train a scenario's model policies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from marl.cli.shared import err, eval_text, guarded, out, progress_bar

#: Below this many bits of an evaluation's ``input_information`` an agent is named as
#: saying the same whatever it read.
SAME_OUTPUT_BITS = 0.01


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
    from marl.cost.predict import predict_team
    from marl.team import load_team
    from marl.training.resume import resumed_config
    from marl.training.trainer import Trainer

    team = load_team(scenario)
    cfg = load_config(config, [*sets, *(["wandb=true"] if use_wandb else [])])
    target = out_dir or Path("runs") / f"{team.name}-{cfg.algorithm}"
    if resume:  # the run's own settings; the command line may only extend it
        cfg, changes = resumed_config(target, cfg)
        for change in changes:
            out.print(f"resuming with {change} (recorded in config.yaml)", highlight=False)
    trainer = Trainer(team, cfg, target, resume=resume,
                      log=lambda msg: err.print(msg, highlight=False))
    episodes = cfg.episodes_per_iter * cfg.group_size
    calls = len(team.ids) * team.rounds
    tokens = predict_team(team).total.total
    warming = [t.name for t in trainer.warming]
    most = "up to " if cfg.warmup_until_learnt else ""
    warmup = (f"{most}{trainer.warmup_steps} warm-up steps on the {cfg.warmup_source} "
              f"policy's messages ({', '.join(warming)}), then " if warming else "")
    pretrained = [t.name for t in trainer.learner.trainables if t.name not in warming]
    if cfg.warmup and pretrained:
        out.print(f"no format warm-up for {', '.join(pretrained)}: pretrained (hf, vllm) "
                  "models already write well-formed text (warmup_pretrained: true warms "
                  "them up too)", highlight=False)
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
    if trainer.answers_told:
        out.print("answer_feedback: full: after each episode the answers are told the score "
                  "of every answer they could have given, and learn from that, not from the "
                  "sampled reward alone (summary.json: answer_feedback full; "
                  "--set answer_feedback=sampled turns it off)", highlight=False)
    total = trainer.warmup_steps + cfg.iterations
    with progress_bar("train", total, trainer.step_count, transient=False) as tick:
        try:
            summary = trainer.train(progress=lambda row: tick(
                row["step"], _row_text(row), trainer.warmup_steps + cfg.iterations))
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
        if same := [a for a, bits in row.get("input_information", {}).items()
                    if bits < SAME_OUTPUT_BITS]:
            text += f", same output whatever read: {', '.join(same)}"
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
