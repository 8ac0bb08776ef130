"""Population settings (``configs/population/*.yaml``): one typed object, validated
strictly like a training config; ``train`` holds the members' ``TrainConfig`` overrides."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from marl.algorithms.config import TrainConfig
from marl.overrides import load_settings
from marl.scenario import problems_from
from marl.training.trainer import MUTABLE


def _check_train(train: dict[str, Any], set_where: str) -> TrainConfig:
    """``train`` must be valid TrainConfig overrides without the two keys a population sets
    itself; returns the config they give."""
    fixed = sorted({"seed", "iterations"} & set(train))
    if fixed:
        raise ValueError(f"train: {', '.join(fixed)} are set {set_where}; remove them")
    try:
        return TrainConfig.model_validate(train)
    except ValidationError as exc:
        found = "; ".join(f"train.{p.path}: {p.message}" for p in problems_from(exc, TrainConfig))
        raise ValueError(found) from None


class Range(BaseModel):
    """A continuous setting: sampled in [min, max] (log-uniformly with ``log``), then
    perturbed by the population's ``perturbation_factors``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: float = Field(description="Lowest initial value.")
    max: float = Field(description="Highest initial value.")
    log: bool = Field(False, description="Sample log-uniformly (for learning rates).")

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if not self.min < self.max:
            raise ValueError(f"min ({self.min}) must be below max ({self.max})")
        if self.log and self.min <= 0:
            raise ValueError(f"log: true needs min > 0 (got {self.min})")
        return self


class Resources(BaseModel):
    """What each member (one Tune trial: the trainer and its rollouts) asks Ray for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(1, gt=0, description="CPUs per member.")
    gpus: float = Field(0, ge=0, description="GPUs per member; its policies then run on "
                        "the GPU Ray assigns.")
    bundles: list[dict[str, float]] | None = Field(
        None, description="Instead of cpus and gpus: a placement group per member, e.g. "
        "[{CPU: 1, GPU: 1}, {CPU: 1, GPU: 1}] for a trainer and a rollout engine; the member "
        "runs in the first bundle, and actors it starts land in the group.")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="How a member's bundles are placed over the nodes.")

    @model_validator(mode="after")
    def _one_way(self) -> Resources:
        if self.bundles is not None and not self.bundles:
            raise ValueError("bundles: give at least one bundle, or leave bundles out")
        return self

    def request(self) -> Any:
        """What ``tune.with_resources`` takes: a dict, or a placement group factory."""
        if self.bundles is None:
            return {"cpu": self.cpus, "gpu": self.gpus}
        from ray import tune

        return tune.PlacementGroupFactory(self.bundles, strategy=self.strategy)


class PBTConfig(BaseModel):
    """Population-based training (Ray Tune's PopulationBasedTraining) of one scenario."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    members: int = Field(4, ge=2, description="Members (Tune trials) in the population.")
    scheduler: Literal["pbt", "fixed"] = Field(
        "pbt", description="pbt: exploit and explore; fixed: the same members (same seeds and "
        "initial settings) trained side by side without either, the baseline PBT must beat.")
    budget_steps: int = Field(1000, ge=1, description="Trainer steps per member (warm-up "
                              "steps and RL iterations), counted by the trainer, so a clone "
                              "continues its donor's count.")
    perturbation_interval: int = Field(
        50, ge=1, description="Steps between reports; each report carries a checkpoint and "
        "may exploit (clone a better member) and explore (perturb its settings).")
    objective: Literal["eval_success", "net_reward", "success_at_cost"] = Field(
        "eval_success", description="What members compete on: greedy eval success; eval "
        "reward net of the token penalty; or eval success, counted only while the training "
        "cost per episode stays within cost_cap_usd.")
    cost_cap_usd: float | None = Field(None, gt=0, description="success_at_cost: USD per "
                                       "episode a member may spend.")
    mutations: dict[str, Range | list[Any]] = Field(
        default_factory=lambda: {"lr": Range(min=3e-4, max=3e-3, log=True),
                                 "entropy_coef": [0.01, 0.03, 0.05, 0.1]},
        description="Settings the population searches: a range ({min, max, log}) or a list "
        f"of values (categorical). Names: {', '.join(MUTABLE)}; topology takes a list of "
        "scenario topology mappings.")
    quantile_fraction: float = Field(0.25, gt=0, le=0.5, description="Share of members "
                                     "that clone one of the same share at the top.")
    resample_probability: float = Field(0.25, ge=0, le=1, description="Chance that an "
                                        "explored setting is drawn afresh, not perturbed.")
    perturbation_factors: tuple[float, float] = Field(
        (1.2, 0.8), description="Factors a continuous setting is multiplied by on explore.")
    seed: int = Field(0, ge=0, description="Member k trains with seed + k; the initial "
                      "settings are drawn with this seed too.")
    resources: Resources = Field(default_factory=Resources, description="What each member "
                                 "asks Ray for.")
    max_failures: int = Field(2, ge=0, description="Restarts of a member whose process "
                              "died, each from its last checkpoint.")
    train: dict[str, Any] = Field(default_factory=dict, description="TrainConfig overrides "
                                  "for every member (seed and iterations are set per member).")

    @model_validator(mode="after")
    def _consistent(self) -> PBTConfig:
        unknown = sorted(set(self.mutations) - set(MUTABLE))
        if unknown:
            raise ValueError(f"mutations: {', '.join(unknown)} cannot change during "
                             f"training; mutable settings: {', '.join(MUTABLE)}")
        for name, space in self.mutations.items():
            if isinstance(space, list) and len(space) < 2:
                raise ValueError(f"mutations.{name}: give at least two values to search")
            if name == "topology" and not (isinstance(space, list) and all(
                    isinstance(v, dict) and "kind" in v for v in space)):
                raise ValueError("mutations.topology: a list of topology mappings, e.g. "
                                 "[{kind: star, hub: lead}, {kind: chain}]")
        if self.objective == "success_at_cost" and self.cost_cap_usd is None:
            raise ValueError("objective success_at_cost needs cost_cap_usd (USD per episode)")
        warm = _check_train(self.train, "per member (seed + k, budget_steps)").warmup
        if self.budget_steps <= warm:
            raise ValueError(f"budget_steps={self.budget_steps} leaves no RL iterations after "
                             f"the members' {warm} warm-up steps; raise budget_steps above "
                             f"{warm} or set a shorter train.warmup_steps.")
        return self

    def member_config(self, index: int) -> TrainConfig:
        """Member ``index``'s training config: ``train``, its own seed, and RL iterations
        that fill the budget after the warm-up."""
        iterations = self.budget_steps - TrainConfig.model_validate(self.train).warmup
        return TrainConfig.model_validate({**self.train, "seed": self.seed + index,
                                           "iterations": iterations})

    def topology_labels(self) -> dict[str, dict[str, Any]]:
        """Readable names for the topology choices (the kind, numbered when repeated)."""
        specs = self.mutations.get("topology") or []
        kinds = [s["kind"] for s in specs]
        return {(k if kinds.count(k) == 1 else f"{k}_{kinds[:i].count(k) + 1}"): s
                for i, (k, s) in enumerate(zip(kinds, specs, strict=True))}


class LeagueConfig(BaseModel):
    """A self-play league on a competitive scenario with two teams."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generations: int = Field(6, ge=1, description="Training phases of the learner; after "
                             "each it plays every snapshot, and may become one.")
    iterations_per_generation: int = Field(
        150, ge=2, description="Learner iterations per generation, against one opponent drawn "
        "by PFSP; they alternate the team the learner plays, so both teams learn.")
    match_episodes: int = Field(32, ge=1, description="Episodes per team in a match (a "
                                "match plays both ways round: 2 × this many games).")
    snapshot_win_rate: float = Field(0.55, gt=0, le=1, description="The learner becomes a "
                                     "snapshot when its mean win rate against the league "
                                     "reaches this.")
    exploiters: bool = Field(True, description="A main exploiter trains against the "
                             "learner's latest weights only; when it beats the learner "
                             "(snapshot_win_rate) it joins the league as a snapshot (xNNN) and "
                             "starts over from the warmed-up weights.")
    pfsp: Literal["squared", "variance", "linear_capped", "uniform"] = Field(
        "squared", description="Opponent weights from the learner's win rate x against each "
        "snapshot: squared (1-x)^2, variance x(1-x), linear_capped min(0.5, 1-x), uniform.")
    seed: int = Field(0, ge=0, description="Seed of the learner, its opponents and matches.")
    resources: Resources = Field(default_factory=Resources,
                                 description="What each match (a Ray task) asks Ray for.")
    match_timeout_s: float = Field(3600.0, gt=0, description="Seconds a round of matches "
                                   "(run in parallel) may take before the league stops with "
                                   "an error.")
    train: dict[str, Any] = Field(default_factory=dict, description="TrainConfig overrides "
                                  "for the learner (its warm-up, lr, group size, ...).")

    @model_validator(mode="after")
    def _consistent(self) -> LeagueConfig:
        _check_train(self.train, "by the league (seed, generations x "
                     "iterations_per_generation)")
        return self

    def train_config(self) -> TrainConfig:
        return TrainConfig.model_validate({
            **self.train, "seed": self.seed,
            "iterations": self.generations * self.iterations_per_generation})


def objective(row: dict[str, Any], cfg: PBTConfig) -> float:
    """A member's score from its latest evaluation (``eval_success_rate``,
    ``eval_reward_mean``) and training cost per episode (``cost_per_episode``).

    >>> cfg = PBTConfig(objective="success_at_cost", cost_cap_usd=1e-4)
    >>> objective({"eval_success_rate": 0.9, "cost_per_episode": 5e-5}, cfg)
    0.9
    >>> objective({"eval_success_rate": 0.9, "cost_per_episode": 2e-4}, cfg)
    0.0
    """
    if cfg.objective == "net_reward":
        return float(row["eval_reward_mean"])
    success = float(row["eval_success_rate"])
    if cfg.objective == "success_at_cost":
        cost = row.get("cost_per_episode", math.inf)
        return success if cost <= cfg.cost_cap_usd else 0.0
    return success


def load_pbt_config(path: str | Path | None = None,
                    sets: list[str] | None = None) -> PBTConfig:
    return load_settings(PBTConfig, "population config", path, sets)


def load_league_config(path: str | Path | None = None,
                       sets: list[str] | None = None) -> LeagueConfig:
    return load_settings(LeagueConfig, "population config", path, sets)
