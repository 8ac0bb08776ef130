"""Classic MARL baselines on a scenario: RLlib PPO (new API stack) over the symbol game of
:mod:`marl.baseline.symbols`.

Small neural agents that exchange discrete symbols, trained on the same task, team and
topology as an LLM team, so that ``marl analyze`` can put the two side by side. One RLlib
module per scenario policy (agents that share a policy share its weights); only the agents
scheduled in a step observe and act in it (:class:`TurnTakingEnv`), and every agent's last
action earns the team's reward at the episode's end.

Run directory (the keys of ``marl train``'s, so analyses read both)::

    config.yaml          the baseline's settings (plus the scenario path)
    scenario.yaml        the scenario as played
    metrics.jsonl        one row per RLlib iteration (appended)
    episodes/eval_NNNNNN.jsonl   every evaluation episode (greedy), symbol ledger included
    checkpoints/final/   RLlib's checkpoint of the algorithm (Algorithm.from_checkpoint)
    summary.json         the final row, best eval, wall time

Where this departs from the LLM trainer: tokens are symbols (see :mod:`marl.baseline.symbols`),
there is no warm-up (a symbol agent cannot send an ill-formed message), and evaluation is
greedy (the most likely symbol at every position), on the instances ``marl train``
evaluates with the same seed.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.tune.registry import register_env

from marl import seeds
from marl.baseline.config import BaselineConfig
from marl.baseline.symbols import SymbolEnv
from marl.cluster import ray_session, task_modules
from marl.errors import MarlError
from marl.io import (
    append_jsonl,
    atomic_dir,
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_text,
)
from marl.team import Team, load_team

ENV_NAME = "llm_marl_symbols"
#: Figures each finished episode reports to RLlib's metrics (means over an iteration).
EPISODE_FIGURES = ("success", "score", "reward", "tokens", "completion_tokens", "cost_usd")


class TurnTakingEnv(MultiAgentEnv):
    """A :class:`SymbolEnv` for RLlib: only the agents scheduled in a step observe it and
    act; rewards reach the agents that have acted (RLlib credits them to their last
    action), every agent's at the end."""

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__()
        config = config or {}
        team = load_team(yaml.safe_load(config["scenario"]), source=config.get("source"))
        self.sym = SymbolEnv(team)
        # Each env runner (and each of its envs) plays its own stream of instances.
        where = [getattr(config, "worker_index", 0), getattr(config, "vector_index", 0)]
        self._stream = seeds.derive_seed(config.get("seed", 0), seeds.TRAIN, *where)
        self._given: int | None = None
        self._played = 0
        #: The figures of the last finished episode (what :class:`EpisodeFigures` logs).
        self.finished: dict[str, float] | None = None
        self.possible_agents = list(self.sym.possible_agents)
        self.agents = list(self.possible_agents)
        self.observation_spaces = {a: self.sym.observation_space(a) for a in self.agents}
        self.action_spaces = {a: self.sym.action_space(a) for a in self.agents}
        self._acted: set[str] = set()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        # RLlib 2.60's multi-agent env runner passes its seed to every reset, not only the
        # first: a new seed starts a new stream of instances, a repeated one continues it.
        if seed is not None and seed != self._given:
            self._given, self._played = seed, 0
            self._stream = seeds.derive_seed(seed, seeds.TRAIN)
        instance = seeds.instance_seed(self._stream, self._played)
        self._played += 1
        obs, infos = self.sym.reset(seed=instance, options=options)
        self._acted = set()
        self.agents = list(self.possible_agents)
        return self._turn(obs), {a: infos[a] for a in self.sym.scheduled}

    def _turn(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {a: obs[a] for a in self.sym.scheduled}

    def step(self, action_dict: dict[str, Any]):
        self._acted |= set(action_dict)
        obs, rewards, terms, truncs, infos = self.sym.step(action_dict)
        done = not self.sym.agents
        if done:
            self.finished = _figures(self.sym)
            return ({}, rewards, {**terms, "__all__": True}, {**truncs, "__all__": False},
                    infos)
        shown = self._turn(obs)
        rewards = {a: r for a, r in rewards.items() if a in self._acted or a in shown}
        return (shown, rewards, {"__all__": False}, {"__all__": False},
                {a: infos[a] for a in shown})


def _figures(sym: SymbolEnv) -> dict[str, float]:
    result = sym.result or {}
    return {"success": float(result["success"]), "score": float(result["score"]),
            "reward": float(result["reward"]), "tokens": float(result["tokens"]),
            "completion_tokens": float(sum(r.completion_tokens for r in sym.rows)),
            "cost_usd": float(result["cost_usd"])}


class EpisodeFigures(RLlibCallback):
    """Logs each finished episode's success, reward, tokens and cost. RLlib keeps no infos
    of a step in which no agent observes (the last one), so they are read from the env."""

    def on_episode_end(self, *, env=None, env_index: int = 0, metrics_logger=None,
                       **kwargs) -> None:
        sub = env.unwrapped.envs[env_index].unwrapped
        if metrics_logger is None or sub.finished is None:
            return
        # Sums, cleared at each iteration's reduce: the row divides them by the count.
        for key in EPISODE_FIGURES:
            metrics_logger.log_value(("figures", key), sub.finished[key], reduce="sum")
        metrics_logger.log_value(("figures", "episodes"), 1, reduce="sum")


def algorithm_config(team: Team, cfg: BaselineConfig) -> PPOConfig:
    """The RLlib PPO config: one module per scenario policy, env runners and learners as
    ``cfg`` sets them (0 env runners: sampling in this process)."""
    register_env(ENV_NAME, lambda config: TurnTakingEnv(config))
    mapping = {a.id: a.policy for a in team.agents}
    policies = sorted(set(mapping.values()))
    model = {"fcnet_hiddens": list(cfg.hidden), "fcnet_activation": "tanh",
             "vf_share_layers": False}
    return (
        PPOConfig()
        .environment(ENV_NAME, env_config={"scenario": team.to_yaml(), "source": team.source,
                                           "seed": cfg.seed})
        .framework("torch")
        .env_runners(num_env_runners=cfg.env_runners, num_envs_per_env_runner=1,
                     batch_mode="complete_episodes", rollout_fragment_length="auto")
        .learners(num_learners=0, num_gpus_per_learner=cfg.gpus_per_learner)
        .training(lr=cfg.lr, train_batch_size_per_learner=cfg.batch_steps,
                  minibatch_size=cfg.minibatch_size, num_epochs=cfg.epochs, gamma=1.0,
                  lambda_=1.0, entropy_coeff=cfg.entropy_coef, clip_param=cfg.clip,
                  vf_loss_coeff=cfg.vf_coef)
        .multi_agent(policies=set(policies),
                     policy_mapping_fn=lambda agent_id, episode, **kw: mapping[agent_id])
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={
            p: RLModuleSpec(model_config=model) for p in policies}))
        .callbacks(EpisodeFigures)
        .reporting(metrics_num_episodes_for_smoothing=1)
        .debugging(seed=cfg.seed, log_level="ERROR")
    )


def describe(team: Team, cfg: BaselineConfig) -> str:
    """One line for the start of a run: the modules, their spaces and the budget."""
    env = SymbolEnv(team)
    modules: dict[str, list[str]] = {}
    for a in team.agents:
        modules.setdefault(a.policy, []).append(a.id)
    parts = []
    for policy, members in modules.items():
        space = env.action_space(members[0])
        parts.append(f"{policy} ({', '.join(members)}; {env.observation_space(members[0]).shape[0]}"
                     f" inputs, {len(space.nvec)} symbol(s) of {'/'.join(map(str, space.nvec))})")
    return (f"{team.name}: RLlib {cfg.algo.upper()} baseline, symbol agents, modules "
            f"{'; '.join(parts)}; {cfg.iterations} iterations of {cfg.batch_steps} env steps, "
            f"greedy eval on {cfg.eval_episodes} instances every {cfg.eval_every}")


def greedy_episodes(team: Team, modules: dict[str, Any], episodes: int, seed: int,
                    split: str = "train") -> list[dict[str, Any]]:
    """Play ``episodes`` instances (``marl train``'s evaluation instances for ``seed``) with
    every module's most likely symbol at each position; the episodes' records."""
    envs = [SymbolEnv(team) for _ in range(episodes)]
    obs = [env.reset(seed=seeds.instance_seed(seed, i), options={"episode": i, "split": split})[0]
           for i, env in enumerate(envs)]
    policy_of = {a.id: a.policy for a in team.agents}
    while envs[0].agents:
        acting = envs[0].scheduled
        actions: list[dict[str, np.ndarray]] = [{} for _ in envs]
        for a in acting:
            nvec = envs[0].action_space(a).nvec
            batch = torch.from_numpy(np.stack([o[a] for o in obs]))
            with torch.no_grad():
                logits = modules[policy_of[a]].forward_inference({Columns.OBS: batch})[
                    Columns.ACTION_DIST_INPUTS]
            choice = [part.argmax(-1) for part in torch.split(logits, list(nvec), dim=-1)]
            picked = torch.stack(choice, -1).numpy()
            for b in range(len(envs)):
                actions[b][a] = picked[b]
        obs = [env.step(act)[0] for env, act in zip(envs, actions, strict=True)]
    return [env.record() for env in envs]


def evaluate(team: Team, modules: dict[str, Any], cfg: BaselineConfig
             ) -> tuple[dict[str, Any], list[dict]]:
    """``marl train``'s evaluation keys: ``eval_success_rate``, ``eval_reward_mean`` and
    ``eval_<split>_success_rate`` for held-out splits."""
    row: dict[str, Any] = {}
    records: list[dict] = []
    seed = seeds.derive_seed(cfg.seed, seeds.EVAL)
    for split in team.task.splits:
        played = greedy_episodes(team, modules, cfg.eval_episodes, seed, split)
        records += played
        key = "eval" if split == "train" else f"eval_{split}"
        row[f"{key}_success_rate"] = float(np.mean([bool(e["success"]) for e in played]))
        if split == "train":
            row["eval_reward_mean"] = float(np.mean([e["reward"] for e in played]))
            row["eval_format_valid_rate"] = _rate(played, "valid")
            row["eval_oracle_agreement"] = _rate(played, "oracle_agrees")
    return row, records


def _rate(records: list[dict], key: str) -> dict[str, float]:
    by_agent: dict[str, list[bool]] = {}
    for e in records:
        for m in e["transcript"]:
            by_agent.setdefault(m["agent"], []).append(bool(m[key]))
    return {a: float(np.mean(v)) for a, v in by_agent.items()}


def run_baseline(scenario: str | Path, cfg: BaselineConfig, out: Path,
                 address: str | None = None,
                 log: Callable[[str], None] = print,
                 progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train the baseline for ``cfg.iterations`` RLlib iterations (or until
    ``cfg.target_success``), writing the run directory ``out``."""
    team = load_team(scenario)
    SymbolEnv(team)  # a task without a finite alphabet fails here, before Ray starts
    if (out / "metrics.jsonl").exists():
        raise MarlError(f"{out} already holds a run (metrics.jsonl); choose another --out or "
                        "remove it.")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", yaml.safe_dump(
        {"scenario": str(scenario), **cfg.model_dump()}, sort_keys=False))
    atomic_write_text(out / "scenario.yaml", team.to_yaml())
    logging.getLogger("ray.rllib").setLevel(logging.ERROR)
    with ray_session(address, num_cpus=cfg.cpus, modules=task_modules(team)):
        algo = algorithm_config(team, cfg).build_algo()
        try:
            summary = _train(algo, team, cfg, out, log, progress)
        finally:
            algo.stop()
    return summary


def _train(algo: Any, team: Team, cfg: BaselineConfig, out: Path,
           log: Callable[[str], None],
           progress: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    policies = sorted({a.policy for a in team.agents})
    best: dict[str, Any] = {"eval_success_rate": -1.0, "iteration": None}
    rows: list[dict[str, Any]] = []
    wall, stopped = 0.0, None
    for it in range(1, cfg.iterations + 1):
        start = time.perf_counter()
        try:
            result = algo.train()
        except KeyboardInterrupt:
            stopped = "interrupted"
            break
        seconds = time.perf_counter() - start
        wall += seconds
        row = _row(result, policies, it, rows[-1]["episodes"] if rows else 0, seconds)
        if not math.isfinite(row["loss"]):
            stopped = "diverged"
            break
        if it % cfg.eval_every == 0 or it == cfg.iterations:
            modules = {p: algo.get_module(p) for p in policies}
            evaluated, records = evaluate(team, modules, cfg)
            row.update(evaluated)
            atomic_write_jsonl(out / "episodes" / f"eval_{it:06d}.jsonl", records)
            if evaluated["eval_success_rate"] > best["eval_success_rate"]:
                best = {"eval_success_rate": evaluated["eval_success_rate"],
                        "eval_reward_mean": evaluated["eval_reward_mean"], "iteration": it}
        row["wall_s"] = wall
        rows.append(row)
        append_jsonl(out / "metrics.jsonl", row)
        if progress:
            progress(row)
        if (cfg.target_success is not None
                and row.get("eval_success_rate", -1.0) >= cfg.target_success):
            log(f"target eval success {cfg.target_success} reached at iteration {it}")
            break
        if cfg.time_budget_s is not None and wall >= cfg.time_budget_s:
            log(f"time budget of {cfg.time_budget_s:.0f} s reached at iteration {it}")
            break
    if stopped != "diverged":  # diverged weights are not worth a checkpoint
        atomic_dir(out / "checkpoints" / "final", lambda tmp: algo.save_to_path(str(tmp)))
    summary = {"scenario": team.name, "algorithm": f"rllib-{cfg.algo}", "baseline": "rllib",
               "uses_oracle": False, "tokens_are": "symbols", "warmup_steps": 0,
               "iterations": len(rows), "wall_s": wall, "stage": None, "best": best,
               "final": rows[-1] if rows else None, **({"stopped": stopped} if stopped else {})}
    atomic_write_json(out / "summary.json", summary)
    if stopped == "diverged":
        raise MarlError(f"training diverged at iteration {len(rows) + 1}: the PPO loss is not "
                        f"finite; the {len(rows)} iterations before it are kept in {out} "
                        f"(no checkpoint). Lower lr (now {cfg.lr:g}) and start a new run.")
    return summary


def _row(result: dict[str, Any], policies: list[str], it: int, episodes_before: int,
         seconds: float) -> dict[str, Any]:
    """An iteration's metrics row (``marl train``'s keys) from RLlib's result."""
    runners = result.get("env_runners", {})
    sums = runners.get("figures", {})
    n = int(sums.get("episodes", 0))
    figures = {k: float(sums[k]) / n for k in EPISODE_FIGURES if n and k in sums}
    return {"phase": "rl", "step": it, "iteration": it, "stage": None,
            "episodes": episodes_before + n, "episodes_this_iteration": n,
            "reward_mean": figures.get("reward"), "success_rate": figures.get("success"),
            "score_mean": figures.get("score"), "tokens_per_episode": figures.get("tokens"),
            "completion_tokens_per_episode": figures.get("completion_tokens"),
            "cost_per_episode": figures.get("cost_usd"),
            "samples_per_s": int(runners.get("num_env_steps_sampled", 0)) / seconds,
            **_learner_figures(result, policies)}


def _learner_figures(result: dict[str, Any], policies: list[str]) -> dict[str, Any]:
    learners = result.get("learners", {})
    per = {p: learners.get(p, {}) for p in policies}

    def mean(key: str) -> float:
        vals = [float(v[key]) for v in per.values() if key in v]
        return float(np.mean(vals)) if vals else 0.0

    return {"loss": mean("total_loss"), "pg_loss": mean("policy_loss"),
            "value_loss": mean("vf_loss"), "entropy": mean("entropy"),
            "kl": mean("mean_kl_loss")}


__all__ = ["BaselineConfig", "TurnTakingEnv", "algorithm_config", "evaluate",
           "greedy_episodes", "run_baseline"]
