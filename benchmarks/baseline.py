"""The classic MARL baseline (``marl baseline``: RLlib PPO, symbol agents) beside the LLM
team (``marl train``, the defaults: learning from reward alone) on the same scenario.

    python benchmarks/baseline.py signal     # lewis, 4 objects: to eval success 0.95
    python benchmarks/baseline.py ref        # ref.yaml: to 0.9 on seen objects; held-out
    python benchmarks/baseline.py signal --no-llm     # the baseline only

Each side runs until its target or its time budget (``--budget-s``, default 300 s for
signal and 1200 s for ref, as the LLM team's targets in issue 10), one after the other
with ``--threads`` torch threads, and prints iterations, wall time, seen and held-out
success. Run directories go under ``--out`` (default a temp dir); ``marl analyze`` on that
folder draws both. Neither side uses the task oracle.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from marl.baseline.config import BaselineConfig
from marl.baseline.rllib import run_baseline
from marl.io import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from train import target_run  # noqa: E402  (the LLM team's side, as benchmarks/train.py runs it)

TARGETS = {"signal": ("signal.yaml", 0.95, 300.0), "ref": ("ref.yaml", 0.9, 1200.0)}


def baseline_side(scenario: str, target: float, budget: float, out: Path, seed: int,
                  threads: int) -> dict:
    """Train the RLlib baseline until ``target`` eval success (or ``budget`` seconds)."""
    cfg = BaselineConfig(seed=seed, iterations=100_000, target_success=target,
                         time_budget_s=budget, cpus=threads)

    def progress(row: dict) -> None:
        if "eval_success_rate" in row:
            held = row.get("eval_holdout_success_rate")
            print(f"  iter {row['iteration']:4d} {row['wall_s']:7.1f}s success "
                  f"{row['success_rate']:.3f} eval {row['eval_success_rate']:.3f}"
                  + (f" held-out {held:.3f}" if held is not None else ""), flush=True)

    summary = run_baseline(ROOT / "scenarios" / scenario, cfg, out, log=print,
                           progress=progress)
    rows = read_jsonl(out / "metrics.jsonl")
    evals = [r for r in rows if "eval_success_rate" in r]
    reached = next((r for r in evals if r["eval_success_rate"] >= target), None)
    best = summary["best"]
    held = [r["eval_holdout_success_rate"] for r in evals if "eval_holdout_success_rate" in r]
    at_best = next((r.get("eval_holdout_success_rate") for r in evals
                    if r["iteration"] == best["iteration"]), None)
    print(f"{scenario} [RLlib baseline]: best eval success {best['eval_success_rate']:.3f} at "
          f"iteration {best['iteration']}; target {target} "
          + (f"reached at iteration {reached['iteration']} after {reached['wall_s']:.0f} s"
             if reached else f"not reached within {budget:.0f} s")
          + (f"; held-out success at that iteration {at_best:.3f} (highest {max(held):.3f})"
             if held else "")
          + f"; {rows[-1]['episodes']} episodes, {rows[-1]['tokens_per_episode']:.1f} "
            "symbols per episode")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=sorted(TARGETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=None)
    parser.add_argument("--no-llm", action="store_true", help="Run the baseline only.")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    scenario, target, budget = TARGETS[args.name]
    budget = args.budget_s or budget
    out = args.out or Path(tempfile.mkdtemp(prefix=f"baseline_{args.name}_"))
    print(f"== RLlib PPO baseline on {scenario}, seed {args.seed}")
    summary = baseline_side(scenario, target, budget, out / "rllib", args.seed, args.threads)
    if not args.no_llm:
        print(f"== LLM team (marl train defaults) on {scenario}, seed {args.seed}")
        target_run(scenario, target, budget, out / "llm", seed=args.seed)
    print(f"runs in {out} (marl analyze {out})")
    print(json.dumps({"baseline_best": summary["best"], "baseline_wall_s": summary["wall_s"]}))


if __name__ == "__main__":
    main()
