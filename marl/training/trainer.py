"""The training loop of ``marl train``: warm-up, collect, update, evaluate, log, checkpoint,
resume, and the curriculum.

A run has two phases. The *warm-up* (``warmup_steps`` supervised steps on the messages of
the task's random policy, see :mod:`marl.algorithms.warmup`) teaches the form of every
message; then *RL* runs ``iterations`` iterations of the chosen algorithm. A curriculum
moves the team through stages of task / scenario overrides during RL. A team that
evaluates at ``settle_at`` or better is *settled*: its optimizers take smaller steps on
small gradients from then on (``settled_eps``), until the next stage. Evaluations without
a new best lower the learning rate (``lr_patience``, :mod:`marl.training.plateau`); a new
stage restores it.

Run directory::

    config.yaml          the fully resolved TrainConfig (plus the scenario path)
    scenario.yaml        the scenario as trained (what ``marl analyze`` replays)
    metrics.jsonl        one row per warm-up step and per iteration (appended)
    episodes/iter_NNNNNN.jsonl   a few sampled training episodes (transcripts, ledger rows)
    episodes/eval_NNNNNN.jsonl   every evaluation episode (eval_warmup_NNNNNN in warm-up)
    checkpoints/iter_NNNNNN/<policy>/   weights; state.pt: optimizers, counters
    checkpoints/warmup_NNNNNN/, warmup/   during, and at the end of, the warm-up
    checkpoints/best/    the checkpoint with the best eval success so far (last stage)
    summary.json         the final row, best eval, wall time, whether the oracle was used

Every row carries ``phase`` (``warmup`` or ``rl``), ``step`` (warm-up steps and
iterations so far), ``iteration`` (RL iterations so far) and ``stage``; RL rows also
``settled`` and ``lr`` (the learning rate of the iteration's update). Files are written
atomically and rows appended whole, so a killed run loses at most the work since its last
checkpoint (taken every ``checkpoint_every`` steps or ``checkpoint_every_s`` seconds).
``resume`` continues from the last checkpoint (or from the start when there is none) and
truncates the logs to it; each step's randomness derives from (seed, step), so on CPU the
resumed metrics equal an uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from marl import seeds
from marl.algorithms import learner_class, warmup
from marl.algorithms.alphabets import check_alphabets
from marl.algorithms.common import begin_rl, turn_order
from marl.algorithms.config import TrainConfig
from marl.errors import MarlError
from marl.io import (
    append_jsonl,
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_text,
)
from marl.overrides import validated
from marl.policies.api_settings import refuse_training
from marl.rollout import EpisodeBatch, collect
from marl.runner import build_policies
from marl.team import Team
from marl.training.checkpoints import RECENT, Checkpoints
from marl.training.curriculum import promoted, stage_name, stage_teams, variant
from marl.training.plateau import Plateau
from marl.training.rows import evaluation, iteration_figures
from marl.training.wandb_run import wandb_run

#: Settings that may change between steps (:meth:`Trainer.set`), as populations mutate them.
MUTABLE = ("lr", "entropy_coef", "clip_low", "clip_high", "temperature", "penalty_per_1k",
           "topology")


class Trainer(Checkpoints):
    """Trains a team: ``step()`` runs one warm-up step or RL iteration, logs and
    checkpoints it; ``train()`` runs steps until the config's budget is spent.

    ``policies`` (agent id -> policy): start from these instead of building the scenario's
    policies afresh. ``append``: log into ``out`` even if it already holds rows (a
    population member that restores a checkpoint of its own, see :meth:`restore`).
    """

    def __init__(self, team: Team, cfg: TrainConfig, out: Path, resume: bool = False,
                 log: Callable[[str], None] | None = None, policies: dict | None = None,
                 append: bool = False):
        refuse_training(team)
        self.cfg, self.out = cfg, Path(out)
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.base = team  # the scenario as given; set() derives topology / cost variants
        self.teams = stage_teams(team, cfg.curriculum)
        warmup.check_prior(self.teams, cfg)  # before any model loads
        self.policies = policies or build_policies(
            team, seed=seeds.derive_seed(cfg.seed, seeds.INIT))
        self.learner = learner_class(cfg.algorithm)(self.teams[0], self.policies, cfg)
        if not self.learner.trainables:
            raise MarlError(f"{team.name} has no trainable policy: give at least one policy "
                            "a model backend (tiny, hf or vllm) in the scenario.")
        reached = check_alphabets(self.learner.trainables, self.teams, cfg, self.log)
        #: answers are told the score of every alternative (answer_feedback: full, where
        #: an answer agent has an alphabet)
        self.answers_told = cfg.answer_feedback == "full" and bool(reached)
        # the policies in the order they learn, with turns (refused here, before any write)
        self.turns = turn_order(self.learner.trainables, cfg) if cfg.turns else []
        if all(t.policy.model.device.type == "cpu" for t in self.learner.trainables):
            # Same seed and thread count, same run: torch's default kernels let two-thread
            # runs drift apart in the last bits (docs/results.md, "Reproducibility").
            torch.use_deterministic_algorithms(True, warn_only=True)
        # the policies the format warm-up trains, and its steps (none: no warm-up at all)
        names = warmup.warming(team, cfg)
        self.warming = [t for t in self.learner.trainables if t.name in names]
        self.warmup_steps = cfg.warmup if self.warming else 0
        self.warmed = 0  # warm-up steps done
        self.learnt_steps = 0  # warm-up steps in a row with every policy following its source
        self.habits = warmup.Habits(cfg.seed, ciphers=cfg.warmup_prior == "ciphers")
        self.iteration = 0  # RL iterations done
        self.reference_at = 0  # iteration at which the KL's reference was last set
        self.settled = False  # evaluated at settle_at in this stage (see _maybe_settle)
        self.plateau = Plateau(cfg.lr_patience, cfg.lr_decay, cfg.lr_floor)
        self.stage, self.stage_start = 0, 0
        self.bad_iterations = 0
        self.best: dict[str, Any] = {"eval_success_rate": -1.0, "iteration": None}
        self.wall = 0.0
        self._last_checkpoint = 0.0
        self._saved_step = -1
        self._step_start: float | None = None
        self.rows: list[dict[str, Any]] = []  # the last RECENT rows; metrics.jsonl has all
        self.changed: dict[str, Any] = {}  # settings changed by set(), kept in checkpoints
        self._wandb = None
        if resume:
            self._resume()
        elif (self.out / "metrics.jsonl").exists() and not append:
            raise MarlError(f"{self.out} already holds a run; pass --resume to continue it "
                            "or choose another --out.")

    @property
    def team(self) -> Team:
        """The team of the current curriculum stage (the scenario itself without one)."""
        return self.teams[self.stage]

    @property
    def step_count(self) -> int:
        return self.warmed + self.iteration

    @property
    def lr(self) -> float:
        """The learning rate now: ``lr`` times the plateau schedule's scale."""
        return self.cfg.lr * self.plateau.scale

    @property
    def phase(self) -> str:
        return "warmup" if self.warmed < self.warmup_steps else "rl"

    def set(self, **settings: Any) -> None:
        """Change settings between steps (names in :data:`MUTABLE`): ``lr`` (every
        optimizer's learning rate, times the plateau schedule's scale), ``entropy_coef``,
        ``clip_low``, ``clip_high``, ``temperature`` (sampling of every trainable policy),
        ``penalty_per_1k`` (the scenario's token penalty) and ``topology`` (a scenario
        ``topology`` mapping; the agents and their policies, hence the weights, stay)."""
        unknown = sorted(set(settings) - set(MUTABLE))
        if unknown:
            raise MarlError(f"cannot change {', '.join(unknown)} during training; the "
                            f"settings that can change between steps are {', '.join(MUTABLE)}.")
        # Everything is checked before anything changes.
        trained = {k: settings[k] for k in ("lr", "entropy_coef", "clip_low", "clip_high")
                   if k in settings}
        cfg = (validated(TrainConfig, {**self.cfg.model_dump(), **trained}, "setting",
                         "set()") if trained else self.cfg)
        temperature = settings.get("temperature")
        if temperature is not None and not (isinstance(temperature, int | float)
                                            and temperature > 0):
            raise MarlError(f"temperature must be a number > 0 (got {temperature!r}); greedy "
                            "play is for evaluation only.")
        scenario = {**({"costs": {"penalty_per_1k": settings["penalty_per_1k"]}}
                       if "penalty_per_1k" in settings else {}),
                    **({"topology": settings["topology"]} if "topology" in settings else {})}
        teams = (stage_teams(variant(self.base, scenario, "set()"), cfg.curriculum)
                 if scenario else self.teams)
        self.cfg, self.teams = cfg, teams
        self.learner.cfg, self.learner.team = cfg, self.team
        if "lr" in trained:  # the schedule's scale still applies
            self._set_optimizers(lr=self.lr)
        if temperature is not None:
            for t in self.learner.trainables:
                t.policy.sampling = dataclasses.replace(t.policy.sampling,
                                                        temperature=float(temperature))
        self.changed.update(settings)

    # -- the loop ------------------------------------------------------------------------
    def evaluate(self, sampled: bool = False, habits: warmup.Habits | None = None
                 ) -> tuple[dict[str, Any], list[dict]]:
        """:func:`marl.training.rows.evaluation` of the team as it is now."""
        return evaluation(self.team, self.policies, self.cfg, sampled, habits)

    def step(self) -> dict[str, Any]:
        """One warm-up step or one RL iteration, logged and checkpointed."""
        self._step_start = time.perf_counter()
        row = self._warmup_step() if self.phase == "warmup" else self._rl_step()
        self.wall += time.perf_counter() - self._step_start
        self._step_start = None
        row["wall_s"] = self.wall
        append_jsonl(self.out / "metrics.jsonl", row)
        self.rows.append(row)
        del self.rows[:-RECENT]  # a long run's memory stays bounded
        return row

    def _warmup_step(self) -> dict[str, Any]:
        cfg = self.cfg
        stats, _ = warmup.warmup_step(self.warming, self.teams, cfg, self.warmed, self.habits)
        self.warmed += 1
        played = warmup.warmup_stage(self.warmed - 1, len(self.teams), cfg.warmup)
        row = {"phase": "warmup", "step": self.step_count, "iteration": 0,
               "warmup_step": self.warmed, "stage": stage_name(cfg.curriculum, played),
               "sft_loss": stats["sft_loss"], "grad_norm": stats["grad_norm"],
               "skipped_updates": stats["skipped"]}
        self._guard(stats)
        if cfg.warmup_until_learnt:
            self.learnt_steps = warmup.learnt(self.warmed - 1, len(self.teams), cfg.warmup,
                                              stats["sft_loss_max"], self.learnt_steps)
        done = self.warmed == self.warmup_steps
        if not done and self.learnt_steps >= warmup.SETTLED_STEPS:
            self.log(f"warm-up: every policy has followed what its source plays (SFT loss "
                     f"below {warmup.CARRIED} nats a token) for {warmup.SETTLED_STEPS} steps "
                     f"in a row; RL starts after step {self.warmed} of at most "
                     f"{self.warmup_steps}")
            self.warmup_steps, done = self.warmed, True
        if self.warmed % cfg.eval_every == 0 or done:
            with_habits = cfg.warmup_source == "random" and cfg.warmup_prior != "uniform"
            evaluated, records = self.evaluate(sampled=True,
                                               habits=self.habits if with_habits else None)
            row.update(evaluated)
            atomic_write_jsonl(self.out / "episodes" / f"eval_warmup_{self.warmed:06d}.jsonl",
                               records)
        if done:
            self._finish_warmup()
        elif self._checkpoint_due(self.warmed):
            self._checkpoint()
        return row

    def _maybe_reset_reference(self, success: float) -> None:
        """A team evaluating at ``kl_reset_at`` or better, ``kl_reset_every`` iterations or
        more after the reference was last set, is held where it is (a reset as in ProRL)."""
        cfg = self.cfg
        if (cfg.kl_reset_at is not None and success >= cfg.kl_reset_at
                and self.iteration - self.reference_at >= cfg.kl_reset_every):
            self._renew_reference()

    def _renew_reference(self) -> None:
        """The KL term's reference becomes the current policy."""
        begin_rl(self.learner.trainables, self.cfg, reset_optimizer=False)
        self.reference_at = self.iteration

    def _maybe_settle(self, success: float) -> None:
        """A team evaluating at ``settle_at`` or better is settled: every optimizer takes
        ``settled_eps``, so a solved team's small gradients no longer move it by ``lr``."""
        if self.cfg.settle_at is not None and not self.settled \
                and success >= self.cfg.settle_at:
            self._set_optimizers(eps=self.cfg.settled_eps)
            self.settled = True

    def _maybe_slow(self, success: float) -> None:
        """Evaluations without a new best lower the learning rate (``lr_patience``)."""
        if self.plateau.update(success):
            self._set_optimizers(lr=self.lr)
            self.log(f"no new best eval success in {self.cfg.lr_patience} evaluations: "
                     f"learning rate {self.lr:.3g} from iteration {self.iteration}")

    def _set_optimizers(self, **hyper: float) -> None:
        """Set hyperparameters (``lr``, ``eps``) of every optimizer's parameter groups."""
        for opt in self.learner.optimizers():
            for group in opt.param_groups:
                group.update(hyper)

    def _rl_step(self) -> dict[str, Any]:
        cfg = self.cfg
        start = time.perf_counter()
        seed = seeds.derive_seed(cfg.seed, seeds.TRAIN, self.iteration)
        batch = collect(self.team, self.policies, cfg.episodes_per_iter, cfg.group_size,
                        seed=seed)
        learning = None
        if self.turns:  # the one policy whose turn it is
            learning = self.turns[self.iteration // cfg.turns % len(self.turns)]
            if self.iteration % cfg.turns == 0:
                self.log(f"turn: {learning} learns in iterations {self.iteration + 1}-"
                         f"{self.iteration + cfg.turns}, the others play unchanged")
        stats = self.learner.update(batch, seed, learning and {learning})
        self.iteration += 1
        row = self._row(batch, stats, time.perf_counter() - start)
        if learning is not None:
            row["learning"] = [learning]
        self._guard(stats)
        last_stage = self.stage == len(self.teams) - 1
        if self.iteration % cfg.eval_every == 0 or self.iteration == cfg.iterations:
            evaluated, records = self.evaluate()
            row.update(evaluated)
            atomic_write_jsonl(self.out / "episodes" / f"eval_{self.iteration:06d}.jsonl",
                               records)
            self._maybe_reset_reference(row["eval_success_rate"])
            self._maybe_settle(row["eval_success_rate"])
            self._maybe_slow(row["eval_success_rate"])
        if cfg.transcripts_per_iter:
            atomic_write_jsonl(self.out / "episodes" / f"iter_{self.iteration:06d}.jsonl",
                               batch.records[: cfg.transcripts_per_iter])
        is_best = last_stage and row.get("eval_success_rate", -1.0) > self.best[
            "eval_success_rate"]
        if is_best:
            self.best = {"eval_success_rate": row["eval_success_rate"],
                         "eval_reward_mean": row["eval_reward_mean"],
                         "iteration": self.iteration}
        self._promote(row)
        if is_best or self._checkpoint_due(self.iteration):
            self._checkpoint(is_best)
        return row

    def _now(self) -> float:
        """Seconds of training so far, the step in flight included."""
        if self._step_start is None:
            return self.wall
        return self.wall + time.perf_counter() - self._step_start

    def _checkpoint_due(self, count: int) -> bool:
        return (count % self.cfg.checkpoint_every == 0
                or self._now() - self._last_checkpoint >= self.cfg.checkpoint_every_s)

    def _guard(self, stats: dict) -> None:
        self.bad_iterations = self.bad_iterations + 1 if stats.get("skipped") else 0
        if self.bad_iterations >= self.cfg.max_bad_iterations:
            raise MarlError(f"training diverged: {self.bad_iterations} steps in a row had "
                            f"updates with a non-finite loss or gradient (up to "
                            f"{self._where()}). The last good checkpoint is in "
                            f"{self.out / 'checkpoints'}; lower lr or max_grad_norm and "
                            "--resume.")

    def _promote(self, row: dict[str, Any]) -> None:
        """Move to the next curriculum stage when the current one's rule is met."""
        if self.stage == len(self.teams) - 1:
            return
        if not promoted(self.cfg.curriculum[self.stage], row.get("eval_success_rate"),
                        self.iteration - self.stage_start):
            return
        self.stage, self.stage_start = self.stage + 1, self.iteration
        self.learner.team = self.team
        if self.settled:  # a new task to learn: full steps again
            self._set_optimizers(eps=self.cfg.adam_eps)
            self.settled = False
        self.plateau.reset()
        self._set_optimizers(lr=self.lr)
        carried = ""
        if self.cfg.promotion_warmup:  # the team's code, carried to the longer messages
            row["promotion_warmup"] = out = warmup.promotion_warmup(
                self.learner.trainables, self.teams[self.stage - 1], self.team,
                self.policies, self.cfg, self.stage)
            carried = f"; {warmup.carried_text(out)}"
        if self.cfg.kl_reset_on_promotion:  # hold what the stages so far taught
            self._renew_reference()
        self.log(f"curriculum: {stage_name(self.cfg.curriculum, self.stage)} from "
                 f"iteration {self.iteration}{carried}")

    def _row(self, batch: EpisodeBatch, stats: dict, seconds: float) -> dict[str, Any]:
        engines = {a.policy: self.policies[a.id] for a in self.team.agents}
        engine_stats = {name: st for name, p in engines.items() if (st := p.stats())}
        return {"phase": "rl", "step": self.step_count, "iteration": self.iteration,
                "stage": stage_name(self.cfg.curriculum, self.stage),
                "settled": self.settled, "lr": self.lr,
                **({"engine": engine_stats} if engine_stats else {}),
                "episodes": self.iteration * len(batch.records),
                **iteration_figures(batch, stats, seconds)}

    def train(self, progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / "config.yaml", yaml.safe_dump(
            {"scenario": self.teams[0].source, **cfg.model_dump()}, sort_keys=False))
        atomic_write_text(self.out / "scenario.yaml", self.team.to_yaml())
        if cfg.wandb:
            self._wandb = wandb_run(cfg, self.out, self.teams[0])
        while self.iteration < cfg.iterations:
            row = self.step()
            if self._wandb is not None:
                self._wandb.log({k: v for k, v in row.items() if not isinstance(v, dict | str)},
                                step=row["step"])
            if progress:
                progress(row)
            if cfg.time_budget_s is not None and self.wall >= cfg.time_budget_s:
                self.log(f"time budget of {cfg.time_budget_s:.0f} s reached")
                break
            # an evaluation of the last stage: not the one that promoted the team into it
            if (cfg.target_success is not None and row["phase"] == "rl"
                    and row["stage"] == stage_name(cfg.curriculum, len(self.teams) - 1)
                    and row.get("eval_success_rate", -1) >= cfg.target_success):
                self.log(f"target eval success {cfg.target_success} reached")
                break
        if self.rows and self.rows[-1]["step"] != self._saved_step:
            self._checkpoint()
        summary = {"scenario": self.teams[0].name, "algorithm": cfg.algorithm,
                   "uses_oracle": cfg.uses_oracle,
                   "answer_feedback": "full" if self.answers_told else "sampled",
                   "warmup_steps": self.warmed,
                   "iterations": self.iteration, "wall_s": self.wall,
                   "stage": stage_name(cfg.curriculum, self.stage), "best": self.best,
                   "final": self.rows[-1] if self.rows else None}
        atomic_write_json(self.out / "summary.json", summary)
        if self._wandb is not None:
            self._wandb.finish()
        return summary
