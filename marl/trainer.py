"""The training loop of ``marl train``: collect, update, evaluate, log, checkpoint, resume.

Run directory::

    config.yaml          the fully resolved TrainConfig (plus the scenario path)
    metrics.jsonl        one row per iteration (rewritten atomically every iteration)
    episodes/iter_NNNNNN.jsonl   a few sampled episodes (transcripts, ledger rows)
    checkpoints/iter_NNNNNN/<policy>/   weights; state.pt: optimizers, counters
    checkpoints/best/    the checkpoint with the best eval success so far
    summary.json         the final row, best eval, wall time

Every file is written atomically, so a killed run loses at most the iteration in flight.
``resume`` restarts from the last checkpoint and truncates the logs to it; each
iteration's randomness derives from (seed, iteration), so on CPU the resumed metrics equal
an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from marl.algorithms import learner_class
from marl.algorithms.config import TrainConfig
from marl.errors import MarlError
from marl.io import atomic_write_json, atomic_write_jsonl, atomic_write_text
from marl.ledger import Ledger
from marl.rollout import EpisodeBatch, collect, derive_seed
from marl.runner import build_policies
from marl.team import Team

EVAL_STREAM, TRAIN_STREAM, INIT_STREAM = 3, 2, 4


class Trainer:
    def __init__(self, team: Team, cfg: TrainConfig, out: Path, resume: bool = False,
                 log: Callable[[str], None] | None = None):
        self.team, self.cfg, self.out = team, cfg, Path(out)
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.policies = build_policies(team, seed=derive_seed(cfg.seed, INIT_STREAM))
        self.learner = learner_class(cfg.algorithm)(team, self.policies, cfg)
        if not self.learner.trainables:
            raise MarlError(f"{team.name} has no trainable policy: give at least one policy "
                            "a model backend (tiny or hf) in the scenario.")
        self.iteration = 0
        self.bad_iterations = 0
        self.best: dict[str, Any] = {"eval_success_rate": -1.0, "iteration": None}
        self.wall = 0.0
        self.rows: list[dict[str, Any]] = []
        self._wandb = None
        if resume:
            self._resume()
        elif (self.out / "metrics.jsonl").exists():
            raise MarlError(f"{self.out} already holds a run; pass --resume to continue it "
                            "or choose another --out.")

    # -- checkpoints -------------------------------------------------------------------
    def _save(self, tag: str) -> Path:
        root = self.out / "checkpoints"
        final = root / tag
        tmp = root / f".{tag}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for t in self.learner.trainables:
            t.policy.save(tmp / t.name)
        torch.save({"iteration": self.iteration, "learner": self.learner.state_dict(),
                    "best": self.best, "wall": self.wall}, tmp / "state.pt")
        old = root / f".{tag}.old"
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        return final

    def _checkpoint(self, is_best: bool) -> None:
        self._save(f"iter_{self.iteration:06d}")
        if is_best:
            self._save("best")
        kept = sorted((self.out / "checkpoints").glob("iter_*"))
        for stale in kept[: -self.cfg.keep_checkpoints]:
            shutil.rmtree(stale)

    def _resume(self) -> None:
        kept = sorted((self.out / "checkpoints").glob("iter_*"))
        if not kept:
            raise MarlError(f"--resume: {self.out} has no checkpoint yet; start the run "
                            "without --resume.")
        last = kept[-1]
        missing = [t.name for t in self.learner.trainables if not (last / t.name).is_dir()]
        if missing or not (last / "state.pt").is_file():
            raise MarlError(f"--resume: {last} is incomplete (missing {missing or 'state.pt'})"
                            "; delete that folder to resume from the one before.")
        state = torch.load(last / "state.pt", weights_only=False)
        saved = build_policies(self.team, seed=0, checkpoint=last)
        for t in self.learner.trainables:
            with torch.no_grad():
                for p, q in zip(t.policy.parameters(), saved[t.agents[0]].parameters(),
                                strict=True):
                    p.copy_(q)
        self.learner.load_state_dict(state["learner"])
        self.iteration, self.best, self.wall = state["iteration"], state["best"], state["wall"]
        self.rows = [r for r in _read_jsonl(self.out / "metrics.jsonl")
                     if r["iteration"] <= self.iteration]
        atomic_write_jsonl(self.out / "metrics.jsonl", self.rows)
        for later in (self.out / "episodes").glob("iter_*.jsonl"):
            if int(later.stem.removeprefix("iter_")) > self.iteration:
                later.unlink()
        self.log(f"resuming {self.out} after iteration {self.iteration}")

    # -- the loop ------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        batch = collect(self.team, self.policies, self.cfg.eval_episodes, 1,
                        seed=derive_seed(self.cfg.seed, EVAL_STREAM), greedy=True)
        return {"eval_success_rate": float(batch.success.float().mean()),
                "eval_reward_mean": float(batch.reward.mean())}

    def step(self) -> dict[str, Any]:
        cfg = self.cfg
        start = time.perf_counter()
        seed = derive_seed(cfg.seed, TRAIN_STREAM, self.iteration)
        batch = collect(self.team, self.policies, cfg.episodes_per_iter, cfg.group_size,
                        seed=seed)
        stats = self.learner.update(batch, seed)
        self.iteration += 1
        row = self._row(batch, stats, time.perf_counter() - start)
        self.bad_iterations = self.bad_iterations + 1 if stats.get("skipped") else 0
        if self.bad_iterations >= cfg.max_bad_iterations:
            raise MarlError(f"training diverged: {self.bad_iterations} iterations in a row had "
                            f"updates with a non-finite loss or gradient (up to iteration "
                            f"{self.iteration}). The last good checkpoint is in "
                            f"{self.out / 'checkpoints'}; lower lr or max_grad_norm and "
                            "--resume.")
        if self.iteration % cfg.eval_every == 0 or self.iteration == cfg.iterations:
            row.update(self.evaluate())
        self.wall += time.perf_counter() - start
        row["wall_s"] = self.wall
        self.rows.append(row)
        atomic_write_jsonl(self.out / "metrics.jsonl", self.rows)
        if cfg.transcripts_per_iter:
            atomic_write_jsonl(self.out / "episodes" / f"iter_{self.iteration:06d}.jsonl",
                               batch.records[: cfg.transcripts_per_iter])
        is_best = row.get("eval_success_rate", -1.0) > self.best["eval_success_rate"]
        if is_best:
            self.best = {"eval_success_rate": row["eval_success_rate"],
                         "eval_reward_mean": row["eval_reward_mean"],
                         "iteration": self.iteration}
        if is_best or self.iteration % cfg.checkpoint_every == 0:
            self._checkpoint(is_best)
        return row

    def _row(self, batch: EpisodeBatch, stats: dict, seconds: float) -> dict[str, Any]:
        n = len(batch.records)
        tokens = batch.ledger["prompt"] + batch.ledger["completion"]  # (B, R, N)
        cost = float(Ledger(batch.rows).cost()) / n
        return {"iteration": self.iteration, "episodes": self.iteration * n,
                "reward_mean": float(batch.reward.mean()),
                "success_rate": float(batch.success.float().mean()),
                "score_mean": float(batch.score.mean()),
                "tokens_per_episode": float(tokens.sum()) / n,
                "completion_tokens_per_episode": float(batch.ledger["completion"].sum()) / n,
                "cost_per_episode": cost,
                "tokens_per_agent": {a: float(tokens[..., i].sum()) / n
                                     for i, a in enumerate(batch.agents)},
                **{k: stats.get(k, 0.0) for k in ("loss", "pg_loss", "sft_loss", "entropy",
                                                  "kl", "grad_norm", "clip_frac")},
                **{k: stats[k] for k in ("value_loss", "value_grad_norm") if k in stats},
                "skipped_updates": stats.get("skipped", 0.0), "sft_coef": stats.get("sft_coef"),
                "samples_per_s": int(batch.mask.any(-1).sum()) / seconds}

    def train(self, progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / "config.yaml", yaml.safe_dump(
            {"scenario": self.team.source, **cfg.model_dump()}, sort_keys=False))
        if cfg.wandb:
            self._wandb = _wandb_run(cfg, self.out, self.team)
        while self.iteration < cfg.iterations:
            row = self.step()
            if self._wandb is not None:
                self._wandb.log({k: v for k, v in row.items() if not isinstance(v, dict)},
                                step=row["iteration"])
            if progress:
                progress(row)
            if cfg.time_budget_s is not None and self.wall >= cfg.time_budget_s:
                self.log(f"time budget of {cfg.time_budget_s:.0f} s reached")
                break
            if (cfg.target_success is not None
                    and row.get("eval_success_rate", -1) >= cfg.target_success):
                self.log(f"target eval success {cfg.target_success} reached")
                break
        if not (self.out / "checkpoints" / f"iter_{self.iteration:06d}").exists():
            self._checkpoint(is_best=False)
        summary = {"scenario": self.team.name, "algorithm": cfg.algorithm,
                   "iterations": self.iteration, "wall_s": self.wall, "best": self.best,
                   "final": self.rows[-1] if self.rows else None}
        atomic_write_json(self.out / "summary.json", summary)
        if self._wandb is not None:
            self._wandb.finish()
        return summary


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wandb_run(cfg: TrainConfig, out: Path, team: Team):
    try:
        import wandb
    except ImportError:
        raise MarlError("--wandb needs the wandb package: pip install 'llm-marl[wandb]'.") from None
    has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").exists()
    mode = os.environ.get("WANDB_MODE") or ("online" if has_key else "offline")
    return wandb.init(project=cfg.wandb_project, dir=str(out), mode=mode,
                      name=f"{team.name}-{cfg.algorithm}-s{cfg.seed}", config=cfg.model_dump())
