"""Training benchmarks for ``marl train`` (CPU, tiny preset, from scratch).

Learning from reward alone (the defaults: format warm-up on the random policy's messages,
then MAGRPO with no oracle term):

    python benchmarks/train.py signal            # eval success >= 0.95 within 5 min, per seed
                                                 # (--seeds 0,1,2); speaker's oracle agreement
    python benchmarks/train.py lewis8            # lewis with 8 objects: >= 0.9 within 15 min
    python benchmarks/train.py ref               # ref.yaml: seen >= 0.9 within 20 min; held-out
    python benchmarks/train.py relay             # relay_chain with configs/relay.yaml
                                                 # (curriculum over fact_length, turns):
                                                 # best eval within 20 min
    python benchmarks/train.py gather            # gather_star, best eval within 20 min
                                                 # (--demo-episodes 64: with the oracle's
                                                 # demonstrations, labelled as such)
    python benchmarks/train.py arith             # arith_star (a dataset of word problems,
                                                 # free-form messages): best eval in 10 min
    python benchmarks/train.py stability         # does a solved team stay solved? per seed
                                                 # (--seeds), --iterations (1200) on signal
                                                 # (--scenario), with --set key=value and
                                                 # --preset FILE: when it was solved, its
                                                 # evaluations below 0.95 after, the lowest

Other figures:

    python benchmarks/train.py throughput        # batched MAGRPO vs one sequence at a time
    python benchmarks/train.py penalty           # tokens and success with / without penalty
                                                 # (signal_verbose, --per-1k 1; uses the
                                                 # oracle's demonstrations, fading)
    python benchmarks/train.py compare           # MAGRPO vs GRPO vs PPO, same budget
                                                 # (--scenario relay_chain.yaml)

Each prints a table; run directories go under ``--out`` (default a temp dir). Every line of
output that comes from a run using the task oracle says so.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from marl.algorithms.common import samples_for
from marl.algorithms.config import TrainConfig, load_config
from marl.errors import ConfigError
from marl.policies import Completion, Policy
from marl.policies.generation import completion_text
from marl.policies.hf_local import build_tiny_hf
from marl.policies.lm import LMPolicy
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import Team, load_team
from marl.training.curriculum import stage_name
from marl.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def train(scenario: str | dict, out: Path, report: bool = True,
          **overrides) -> tuple[Trainer, dict]:
    """Train a scenario file of ``scenarios/`` (or scenario data) with overrides of the
    default config, printing each evaluation (with ``report``)."""
    team = load_team(ROOT / "scenarios" / scenario if isinstance(scenario, str) else scenario)
    cfg = TrainConfig(**overrides)
    if cfg.uses_oracle:
        print("  (this run uses the task oracle's demonstrations: imitation, not discovery)")
    trainer = Trainer(team, cfg, out, log=None if report else (lambda msg: None))
    summary = trainer.train(progress=progress if report else None)
    return trainer, summary


def progress(r: dict) -> None:
    """Print evaluation rows (the warm-up's last one included)."""
    if "eval_success_rate" not in r:
        return
    where = (f"warm-up {r['warmup_step']:4d}" if r["phase"] == "warmup"
             else f"iter {r['iteration']:4d}" + (f" [{r['stage']}]" if r["stage"] else ""))
    held = r.get("eval_holdout_success_rate")
    habits = r.get("habit_agreement")  # warm-up: the agent furthest from its habits
    print(f"  {where} {r['wall_s']:7.1f}s success {r['success_rate']:.3f} eval "
          f"{r['eval_success_rate']:.3f}" + (f" held-out {held:.3f}" if held is not None
                                             else "")
          + (f" habits learnt {min(habits.values()):.3f}" if habits else ""), flush=True)


def time_to(trainer: Trainer, target: float) -> float | None:
    """Seconds until an evaluation of the last curriculum stage (the scenario as written)
    reached ``target``; None if none did."""
    last = stage_name(trainer.cfg.curriculum, len(trainer.cfg.curriculum) - 1)
    for row in trainer.rows:
        if row["phase"] == "rl" and row["stage"] == last \
                and row.get("eval_success_rate", -1) >= target:
            return row["wall_s"]
    return None


def at_best(rows: list[dict], best: dict) -> float:
    """Held-out success at the iteration of the best (seen) evaluation."""
    return next(r["eval_holdout_success_rate"] for r in rows
                if r["iteration"] == best["iteration"])


def target_run(scenario: str | dict, target: float, budget: float, out: Path,
               **kw) -> Trainer:
    """Train until ``target`` eval success or ``budget`` seconds; print the outcome."""
    trainer, summary = train(scenario, out, target_success=target, time_budget_s=budget,
                             iterations=100_000, **kw)
    reached = time_to(trainer, target)
    best = summary["best"]
    name = scenario if isinstance(scenario, str) else scenario["name"]
    label = " [uses the oracle]" if trainer.cfg.uses_oracle else ""
    rows = [r for r in trainer.rows if "eval_success_rate" in r and r["phase"] == "rl"]
    held = [r["eval_holdout_success_rate"] for r in rows if "eval_holdout_success_rate" in r]
    if best["iteration"] is not None:
        found = (f"best eval success {best['eval_success_rate']:.3f} at iteration "
                 f"{best['iteration']}")
    elif rows:  # a curriculum that never reached its last stage, where "best" is kept
        tops = {}
        for r in rows:
            if r["eval_success_rate"] > tops.get(r["stage"], {"eval_success_rate": -1})[
                    "eval_success_rate"]:
                tops[r["stage"]] = r
        found = ("no evaluation in the last stage; best eval success by stage: " + ", ".join(
            f"{stage} {r['eval_success_rate']:.3f} at iteration {r['iteration']}"
            for stage, r in tops.items()))
    else:
        found = "no evaluation"
    print(f"{name}{label}: {found}; target {target} "
          + (f"reached after {reached:.0f} s" if reached is not None else
             f"not reached within {budget:.0f} s")
          + (f"; held-out success at that iteration {at_best(rows, best):.3f} (highest "
             f"{max(held):.3f})" if held else "")
          + (f"; final eval oracle agreement {rows[-1]['eval_oracle_agreement']}"
             if rows and "eval_oracle_agreement" in rows[-1] else ""))
    return trainer


def signal_seeds(out: Path, seeds: list[int], budget: float, **settings) -> None:
    """The main job on several seeds: time to eval success 0.95, and whether the code the
    speaker settled on is the oracle's (it agrees with it only by chance, 1/26 per object,
    when discovered)."""
    for seed in seeds:
        target_run("signal.yaml", 0.95, budget, out / f"signal_s{seed}",
                   **{**settings, "seed": seed})


def stability(out: Path, scenario: str, seeds: list[int], iterations: int, sets: list[str],
              preset: str | None) -> None:
    """Train each seed for ``iterations`` (no early stop) and print when the team first
    evaluated at 0.95 or better, how many later evaluations fell below 0.95 (dips), the
    lowest of them and the last evaluation."""
    data = yaml.safe_load((ROOT / "scenarios" / scenario).read_text())
    if preset is not None:
        for spec in data["policies"].values():
            if spec.get("backend", "tiny") == "tiny":
                spec["preset"] = preset
    base = load_config(sets=sets).model_dump()
    settings = [*sets, *([f"preset {preset}"] if preset else [])]
    print(", ".join([scenario, f"{iterations} iterations per seed", *settings]))
    print(f"{'seed':>5} {'solved at':>10} {'dips':>5} {'lowest':>7} {'last':>6} {'seconds':>8}")
    for seed in seeds:
        trainer, _ = train(data, out / f"s{seed}", **{**base, "seed": seed,
                                                        "iterations": iterations},
                           report=False)
        evals = [(r["iteration"], r["eval_success_rate"]) for r in trainer.rows
                 if r["phase"] == "rl" and "eval_success_rate" in r]
        solved = next((i for i, rate in evals if rate >= 0.95), None)
        after = [rate for i, rate in evals if solved is not None and i > solved]
        lowest = f"{min(after):7.3f}" if after else f"{'-':>7}"
        print(f"{seed:5d} {solved if solved is not None else '-':>10} "
              f"{sum(rate < 0.95 for rate in after):5d} {lowest} {evals[-1][1]:6.3f} "
              f"{trainer.rows[-1]['wall_s']:8.0f}", flush=True)


def scenario_with(name: str, **task_params) -> dict:
    """A shipped scenario's data with some task parameters changed."""
    data = yaml.safe_load((ROOT / "scenarios" / name).read_text())
    data["task"]["params"] = {**data["task"].get("params", {}), **task_params}
    data["name"] = f"{data['name']}_" + "_".join(f"{k}{v}" for k, v in task_params.items())
    return data


def relay_settings() -> dict:
    """configs/relay.yaml: the settings the relay figure was measured with (its curriculum,
    learning in turns, the cipher warm-up)."""
    return yaml.safe_load((ROOT / "configs" / "relay.yaml").read_text())


#: The target runs after the main job: scenario, target eval success, seconds, settings.
TARGET_RUNS: dict[str, tuple[Callable[[], str | dict], float, float, dict]] = {
    "lewis8": (lambda: scenario_with("signal.yaml", objects=8), 0.9, 900, {}),
    "ref": (lambda: "ref.yaml", 0.9, 1200, {}),
    "relay": (lambda: "relay_chain.yaml", 0.8, 1200, relay_settings()),
    "gather": (lambda: "gather_star.yaml", 0.9, 1200, {}),
    "arith": (lambda: "arith_star.yaml", 0.9, 600, {}),
}


class OneAtATime(Policy):
    """The reference MAGRPO library's way: transformers' ``generate`` on one sequence at a
    time, the same model and sampling settings as the wrapped policy."""

    def __init__(self, policy: LMPolicy):
        self.policy, self.tokenizer = policy, policy.tokenizer

    @torch.inference_mode()
    def generate(self, requests, greedy=False):
        out = []
        tok, s = self.policy.tokenizer, self.policy.sampling
        for r in requests:
            ids = torch.tensor([tok.encode_prompt(r.observation)])
            seq = self.policy.module.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                max_new_tokens=s.max_new_tokens, top_k=0, pad_token_id=tok.pad_id,
                eos_token_id=tok.eos_id, stop_strings=list(s.stop),
                tokenizer=tok.tokenizer)[0, ids.shape[1]:].tolist()
            out.append(Completion(completion_text(seq, tok.decode, s.stop), tuple(seq),
                                  (0.0,) * len(seq), "stop", tuple(ids[0].tolist())))
        return out


def sequential_update(t, rows: list[tuple], cfg: TrainConfig) -> None:
    """The update of :func:`marl.algorithms.common.update` (same epochs, minibatches,
    clipped loss and SFT term), one sequence per forward and backward pass."""
    gen = torch.Generator().manual_seed(len(rows))
    old: dict[int, torch.Tensor] = {}
    for _ in range(cfg.epochs):
        order = torch.randperm(len(rows), generator=gen).tolist()
        size = -(-len(order) // cfg.minibatches)
        for start in range(0, len(order), size):
            idx = order[start : start + size]
            tokens = sum(len(rows[i][1]) for i in idx) or 1
            demo_tokens = sum(len(rows[i][3]) for i in idx) or 1
            t.optimizer.zero_grad(set_to_none=True)
            for i in idx:
                prompt, completion, adv, demo = rows[i]
                loss = torch.zeros(())
                if completion:
                    lp, m = t.policy.score([prompt], [completion])
                    ratio = (lp - old.setdefault(i, lp.detach())).exp()
                    clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
                    pg = -torch.minimum(ratio * adv, clipped * adv)
                    loss = loss + (pg * m).sum() / tokens
                if demo and cfg.sft_coef:
                    dlp, dm = t.policy.score([prompt], [demo])
                    loss = loss - cfg.sft_coef * (dlp * dm).sum() / demo_tokens
                loss.backward()
            torch.nn.utils.clip_grad_norm_(t.policy.parameters(), cfg.max_grad_norm)
            t.optimizer.step()


def hf_team(scenario: str, model: Path, **policy) -> Team:
    """A shipped scenario with every policy on the ``hf`` backend at ``model`` (plus
    ``policy`` settings)."""
    data = yaml.safe_load((ROOT / "scenarios" / scenario).read_text())
    data["policies"] = {n: {**p, "backend": "hf", "path": str(model), **policy}
                        for n, p in data["policies"].items()}
    return load_team(data)


def throughput(out: Path, episodes: int, group: int, epochs: int, minibatches: int) -> None:
    """Samples (completions) per second of one MAGRPO iteration on a locally built tiny
    HF Llama: the batched engine and update vs generation and the same update one
    sequence at a time."""
    team = hf_team("gather_star.yaml", build_tiny_hf(out / "hf"))
    cfg = TrainConfig(episodes_per_iter=episodes, group_size=group, epochs=epochs,
                      minibatches=minibatches, warmup_source="none")
    trainer = Trainer(team, cfg, out / "batched")
    trainer.step()  # warm-up
    start = time.perf_counter()
    trainer.step()
    batched_s = time.perf_counter() - start
    samples = episodes * group * len(team.ids)

    learner = Trainer(team, cfg, out / "sequential").learner
    slow = {a: OneAtATime(p) for a, p in build_policies(team, seed=0).items()}
    start = time.perf_counter()
    batches = [collect(team, slow, 1, 1, seed=i) for i in range(episodes * group)]
    for t in learner.trainables:
        rows = []
        for b in batches:
            s = samples_for(t, team, b, b.reward[:, None].expand(-1, len(team.ids)),
                            with_demos=cfg.sft_coef > 0)
            rows += [(s.prompts[i], s.completions[i], float(s.advantages[i]),
                      s.demos[i] if s.demos else []) for i in range(len(s.prompts))]
        sequential_update(t, rows, cfg)
    sequential_s = time.perf_counter() - start
    print(f"gather_star, tiny HF Llama, {samples} samples (completions) per iteration, "
          f"update: {epochs} epoch(s) x {minibatches} minibatch(es)")
    print(f"batched MAGRPO iteration (engine + batched update): {samples / batched_s:8.1f} "
          "samples/s")
    print(f"one sequence at a time (HF generate + per-sequence update): "
          f"{samples / sequential_s:8.1f} samples/s")
    print(f"speed-up: {sequential_s / batched_s:.1f}x")


def penalty(out: Path, iterations: int, per_1k: float) -> None:
    """signal_verbose (the oracle's code repeats its letter 32 times) trained with a fading
    oracle, with and without a token penalty: the same seed, config and iterations. One
    on-policy step per batch (epochs 1, minibatches 1): with the default 2 x 8 off-policy
    steps a solved team collapses once the oracle has faded."""
    rows = []
    for p in (0.0, per_1k):
        data = yaml.safe_load((ROOT / "scenarios" / "signal_verbose.yaml").read_text())
        data["costs"]["penalty_per_1k"] = p
        cfg = TrainConfig(iterations=iterations, sft_coef=1.0, sft_decay=0.95, epochs=1,
                          minibatches=1, warmup_source="none")
        trainer = Trainer(load_team(data), cfg, out / f"p{p}")
        trainer.train(progress=lambda r, p=p: print(
            f"  penalty {p}: iter {r['iteration']:4d} success {r['success_rate']:.3f} "
            f"tokens/ep {r['tokens_per_episode']:.0f}", flush=True)
            if r["iteration"] % 50 == 0 else None)
        last = trainer.rows[-20:]
        evals = [r["eval_success_rate"] for r in last if "eval_success_rate" in r]
        rows.append((p, sum(r["tokens_per_episode"] for r in last) / len(last),
                     sum(r["success_rate"] for r in last) / len(last),
                     sum(evals) / len(evals)))
    print(f"signal_verbose [uses the oracle], {iterations} iterations, sft_coef 1.0 fading by "
          "sft_decay 0.95, epochs 1, minibatches 1; means over the last 20 iterations")
    print(f"{'penalty_per_1k':>15} {'tokens/episode':>15} {'success':>8} {'eval success':>13}")
    for p, tokens, success, ev in rows:
        print(f"{p:15.1f} {tokens:15.1f} {success:8.3f} {ev:13.3f}")
    base, pen = rows
    print(f"tokens saved: {100 * (1 - pen[1] / base[1]):.1f}%, success change "
          f"{100 * (pen[2] - base[2]):+.1f} points (eval {100 * (pen[3] - base[3]):+.1f})")


def compare(out: Path, budget: float, scenario: str) -> None:
    print(f"{'algorithm':>10} {'iterations':>10} {'eval success':>13} {'tokens/iter':>12}")
    for name in ("magrpo", "grpo", "ppo"):
        cfg = load_config(ROOT / "configs" / "algorithm" / f"{name}.yaml").model_dump()
        cfg.update(time_budget_s=budget, iterations=100_000)
        trainer, summary = train(scenario, out / name, **cfg)
        per_iter = sum(r["tokens_per_episode"] * r["episodes"] / r["iteration"]
                       for r in trainer.rows[-1:])
        print(f"{name:>10} {summary['iterations']:10d} "
              f"{summary['best']['eval_success_rate']:13.3f} {per_iter:12.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["signal", "lewis8", "ref", "relay", "gather",
                                          "arith", "stability", "throughput", "penalty",
                                          "compare"])
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds, one run each (signal and stability: "
                             "0,1,2; the others: 0)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget", type=float, default=None, help="seconds per run")
    parser.add_argument("--scenario", default=None,
                        help="compare (default relay_chain.yaml), stability (default "
                             "signal.yaml): scenario file in scenarios/")
    parser.add_argument("--iterations", type=int, default=None,
                        help="penalty: iterations per run (default 400); stability: per "
                             "seed (default 1200)")
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        metavar="KEY=VALUE", help="signal, the target runs and stability: a "
                        "training setting, repeatable")
    parser.add_argument("--preset", default=None,
                        help="stability: the model preset of every tiny policy (a name or "
                             "a YAML file)")
    parser.add_argument("--per-1k", type=float, default=1.0,
                        help="penalty: penalty_per_1k of the penalised run")
    parser.add_argument("--demo-episodes", type=int, default=0,
                        help="gather: oracle-played instances per iteration for an SFT term "
                             "(imitation; 0, the default: reward alone)")
    parser.add_argument("--epochs", type=int, default=1,
                        help="throughput: passes over the batch (1: MAGRPO's on-policy step)")
    parser.add_argument("--minibatches", type=int, default=1,
                        help="throughput: optimizer steps per pass")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads (2: the whole of a 2-core machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or Path(tempfile.mkdtemp(prefix="marl-bench-"))
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
    # a target run's own settings (relay: its curriculum) are checked with --set's
    own = TARGET_RUNS[args.which][3] if args.which in TARGET_RUNS else {}
    try:
        cfg = load_config(sets=[f"{k}={json.dumps(v)}" for k, v in own.items()] + args.sets)
    except ConfigError as exc:
        parser.error(str(exc))
    sets = {k: getattr(cfg, k) for k in cfg.model_fields_set}  # only what --set named
    if sets and args.which not in ("signal", "stability", *TARGET_RUNS):
        parser.error(f"--set applies to signal, stability and {', '.join(TARGET_RUNS)}; "
                     f"{args.which} has settings of its own.")
    if args.which == "throughput":
        throughput(out, 16, 8, args.epochs, args.minibatches)
    elif args.which == "signal":
        signal_seeds(out, seeds or [0, 1, 2], args.budget or 300, **sets)
    elif args.which in TARGET_RUNS:
        scenario, target, budget, extra = TARGET_RUNS[args.which]
        if args.which == "gather" and args.demo_episodes:
            extra = dict(sft_coef=1.0, demo_episodes=args.demo_episodes)
        for seed in seeds or [0]:
            target_run(scenario(), target, args.budget or budget,
                       out / f"{args.which}_s{seed}", **{**extra, **sets, "seed": seed})
    elif args.which == "stability":
        stability(out, args.scenario or "signal.yaml", seeds or [0, 1, 2],
                  args.iterations or 1200, args.sets, args.preset)
    elif args.which == "penalty":
        penalty(out, args.iterations or 400, args.per_1k)
    else:
        compare(out, args.budget or 180, args.scenario or "relay_chain.yaml")


if __name__ == "__main__":
    main()
