"""Training configuration: one typed object, from defaults, a YAML file of overrides
(``configs/algorithm/*.yaml``) and ``--set key=value``, validated strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from marl.errors import ConfigError
from marl.overrides import parse_sets
from marl.scenario import problems_from, read_yaml


class TrainConfig(BaseModel):
    """Every training setting. Defaults train ``scenarios/signal.yaml`` to its target."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Literal["magrpo", "grpo", "ppo"] = Field(
        "magrpo", description="magrpo: joint groups, shared team return; grpo: independent "
                              "per-agent groups and returns; ppo: value head and GAE.")
    iterations: int = Field(100, ge=1, description="Training iterations.")
    time_budget_s: float | None = Field(None, gt=0, description="Stop after this many "
                                                                  "seconds of training.")
    target_success: float | None = Field(
        None, ge=0, le=1, description="Stop once the eval success rate reaches this.")
    seed: int = Field(0, ge=0, description="Seed of instances, sampling and initialisation.")
    episodes_per_iter: int = Field(16, ge=1, description="Task instances per iteration.")
    group_size: int = Field(8, ge=1, description="Joint rollouts of each instance (G).")
    baseline: Literal["mean", "mean_std", "loo", "max"] = Field(
        "mean", description="Group baseline (mean: MAGRPO / Dr. GRPO; mean_std: GRPO; loo: "
                            "RLOO; max: ReMax).")
    credit: Literal["team", "difference", "shapley"] = Field(
        "team", description="team: every agent gets the team advantage; difference / shapley: "
                            "per-agent credit from counterfactual replays with agents muted.")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    epochs: int = Field(2, ge=1, description="Passes over each batch (models trained from "
                                             "scratch need many steps per batch).")
    minibatches: int = Field(8, ge=1, description="Minibatches per pass.")
    clip_low: float = Field(0.2, ge=0, description="Ratio clip below 1 (1 - clip_low).")
    clip_high: float = Field(0.28, ge=0, description="Ratio clip above 1 (clip-higher).")
    kl_coef: float = Field(0.0, ge=0, description="KL to the frozen initial policy.")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus.")
    aggregation: Literal["token", "sequence"] = Field(
        "token", description="token: mean over all tokens; sequence: mean of per-sequence means.")
    sft_coef: float = Field(1.0, ge=0, description="L = L_RL + sft_coef * L_SFT on the task "
                                                   "oracle's demonstrations (0: pure RL).")
    sft_decay: float = Field(1.0, gt=0, le=1, description="sft_coef is multiplied by this "
                                                          "after each iteration.")
    demo_episodes: int = Field(0, ge=0, description="Extra task instances per iteration "
                               "played by the task oracle alone; every call in them is a "
                               "demonstration for the SFT term (behaviour cloning on clean "
                               "inputs). 0: demonstrations only on what the team itself saw.")
    value_coef: float = Field(0.5, ge=0, description="ppo: value loss weight.")
    gamma: float = Field(1.0, ge=0, le=1, description="ppo: discount per token.")
    lam: float = Field(0.95, ge=0, le=1, description="ppo: GAE lambda.")
    critic: Literal["independent", "central"] = Field(
        "independent", description="ppo: a value head per policy (IPPO) or one critic over "
                                   "the joint transcript (MAPPO).")
    eval_every: int = Field(10, ge=1, description="Evaluate every K iterations (greedy).")
    eval_episodes: int = Field(64, ge=1, description="Held-out instances per evaluation.")
    checkpoint_every: int = Field(10, ge=1, description="Checkpoint every K iterations.")
    keep_checkpoints: int = Field(3, ge=1, description="Checkpoints kept (plus best).")
    max_bad_iterations: int = Field(5, ge=1, description="Stop after this many consecutive "
                                    "iterations with a skipped (non-finite) update.")
    transcripts_per_iter: int = Field(2, ge=0, description="Episodes written to "
                                      "episodes/iter_N.jsonl per iteration.")
    wandb: bool = Field(False, description="Log to Weights & Biases (offline without a key).")
    wandb_project: str = Field("llm-marl", description="wandb project.")

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.group_size < 2 and self.algorithm != "ppo":
            raise ValueError(f"group_size={self.group_size}: {self.algorithm} compares "
                             "rollouts within a group, so group_size must be at least 2.")
        return self


def load_config(path: str | Path | None = None, sets: list[str] | None = None) -> TrainConfig:
    """Defaults, then the YAML file's overrides, then ``key=value`` overrides."""
    data: dict[str, Any] = {}
    lines: dict = {}
    source = str(path) if path is not None else "--set"
    if path is not None:
        raw, lines = read_yaml(path)
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"{path}: a config file holds key: value overrides of "
                              f"TrainConfig, got a {type(raw).__name__}.")
        data.update(raw or {})
    overrides = parse_sets(sets or [])
    data.update(overrides)
    for key in overrides:  # a value from --set has no line in the file
        lines.pop((key,), None)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        problems = problems_from(exc, TrainConfig, lines=lines)
        raise ConfigError("invalid training config:\n" + "\n".join(
            "  " + p.render(source) for p in problems)) from None
