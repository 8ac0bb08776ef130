"""Settings of ``marl baseline`` (``--config FILE`` of overrides, ``--set key=value``): one
typed object, validated strictly like a training config."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from marl.overrides import load_settings


class BaselineConfig(BaseModel):
    """RLlib PPO for a scenario's team of symbol agents."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algo: Literal["ppo"] = Field("ppo", description="RLlib algorithm (new API stack).")
    iterations: int = Field(100, ge=1, description="RLlib training iterations.")
    seed: int = Field(0, ge=0, description="Seed of RLlib, the environments and evaluation.")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    batch_steps: int = Field(512, ge=8, description="Environment steps sampled per "
                             "iteration (whole episodes).")
    minibatch_size: int = Field(128, ge=1, description="Agent steps per SGD minibatch.")
    epochs: int = Field(8, ge=1, description="Passes over each batch.")
    entropy_coef: float = Field(0.01, ge=0, description="Entropy bonus.")
    clip: float = Field(0.2, gt=0, description="PPO's ratio clip.")
    vf_coef: float = Field(0.5, ge=0, description="Value loss weight.")
    hidden: tuple[int, ...] = Field((128, 128), min_length=1,
                                    description="Hidden layer widths of every module.")
    eval_every: int = Field(5, ge=1, description="Evaluate every this many iterations.")
    eval_episodes: int = Field(128, ge=1, description="Greedy episodes per evaluation "
                               "(per split).")
    target_success: float | None = Field(None, gt=0, le=1, description="Stop once eval "
                                         "success reaches this.")
    time_budget_s: float | None = Field(None, gt=0, description="Stop after the iteration "
                                        "that passes this many seconds of training.")
    env_runners: int = Field(0, ge=0, description="Remote RLlib env runners (0: sample in "
                             "the driver process).")
    cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray (default: all).")
    gpus_per_learner: float = Field(0.0, ge=0, description="GPUs for the learner (a cluster "
                                    "with GPUs).")

    @model_validator(mode="after")
    def _consistent(self) -> BaselineConfig:
        if self.minibatch_size > self.batch_steps * 8:
            raise ValueError(f"minibatch_size {self.minibatch_size} is far above batch_steps "
                             f"{self.batch_steps}; lower it or raise batch_steps")
        return self


def load_baseline_config(path: str | Path | None = None,
                         sets: list[str] | None = None) -> BaselineConfig:
    return load_settings(BaselineConfig, "baseline config", path, sets)
