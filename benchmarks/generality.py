"""The generality suite: scenario variants unlike the shipped ones (``benchmarks/generality/``),
each trained with the defaults and nothing else for a fixed budget, and scored against
what its task makes possible.

    python benchmarks/generality.py [--budget 600] [--jobs 1] [--only NAME ...]
                                    [--seeds 1] [--out runs/generality] [--set key=value ...]

Per variant:

- **scripted**: the eval success of the task's scripted team (greedy, ``--episodes``);
- **floor**: the no-communication floor, the scripted team with every message blanked
  except the answers (each answer agent's last call): what the answerers do alone;
- **best** and **final**: the success of the run's ``best`` checkpoint and of its last one,
  each re-evaluated on ``--episodes`` greedy eval instances after ``marl train VARIANT``
  with ``time_budget_s`` = ``--budget`` on one thread (``OMP_NUM_THREADS=1``; iterations
  are not the limit). The trainer picks ``best`` by its 64-episode evaluations; the best of
  many such noisy figures overstates a team, which on a task with a small gap (vote) can
  be the whole gap, so the figures here come from the larger re-evaluation;
- **normalised** = (best - floor) / (scripted - floor), and the seconds of training until
  the team first evaluated (64 episodes) at 0.8 of that gap;
- **habits learnt**: at the warm-up's last evaluation, the lowest share of an agent's
  greedy messages that were its habit for what it read (``habit_agreement``). An agent
  with a low share writes much the same whatever it read, and reward cannot reach it
  through its input (docs/learning.md, section 1.4).

``--set`` passes settings to every run (the suite's own figures use none). Runs go to
``OUT/NAME/`` (an existing run there is resumed); the table is printed and written to
``OUT/generality.json``. ``--jobs 2`` trains two variants at a time, each on one thread;
``--report`` trains nothing and scores the runs already in ``OUT``. ``--seeds N`` trains
each variant with seeds 0 to N-1 (seed k > 0 in ``OUT/NAME-seedk/``, so a one-seed run is
reused as seed 0), for decisions one draw cannot settle: a variant's figures are then the
medians over its seeds, with its normalised score per seed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # marl loads lazily: --help and the argument checks need no torch
    from marl.team import Team

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = Path(__file__).resolve().parent / "generality"


def references(path: Path, episodes: int, seed: int = 0) -> tuple[float, float]:
    """The scripted team's eval success, and its success with every message but the
    answers blanked (the no-communication floor)."""
    from marl.policies import Completion, Policy, Request
    from marl.runner import build_policies
    from marl.team import load_team

    class Speechless(Policy):
        """Answers (an answer agent's last call) as ``policy`` does; says nothing else."""

        def __init__(self, policy: Policy):
            self.policy, self.tokenizer = policy, policy.tokenizer

        def generate(self, requests: Sequence[Request],
                     greedy: bool = False) -> list[Completion]:
            said = self.policy.generate(requests, greedy=greedy)
            return [c if r.final else Completion("") for r, c in zip(requests, said,
                                                                      strict=True)]

    team = load_team(path)
    scripted = build_policies(team, "scripted")
    alone = {a: Speechless(p) for a, p in scripted.items()}
    return success(team, scripted, episodes, seed), success(team, alone, episodes, seed)


def success(team, policies: dict, episodes: int, seed: int = 0) -> float:
    """Greedy success rate of ``policies`` on ``episodes`` instances of the eval split."""
    from marl.rollout import collect

    batch = collect(team, policies, episodes, seed=seed, greedy=True,
                    split=team.task.eval_split)
    return float(batch.success.float().mean())


def checkpoints(out: Path) -> tuple[Path | None, Path | None]:
    """A run's ``best`` checkpoint and its last one (RL's newest, else the warm-up's)."""
    folder = out / "checkpoints"
    if not folder.is_dir():
        return None, None
    last = sorted(folder.glob("iter_*")) or sorted(folder.glob("warmup*"))
    best = folder / "best"
    return (best if best.is_dir() else None), (last[-1] if last else None)


def reevaluate(team: Team, checkpoint: Path | None, episodes: int) -> float | None:
    """The success of ``team`` with a checkpoint's weights, on ``episodes`` eval instances."""
    if checkpoint is None:
        return None
    from marl.runner import build_policies

    return success(team, build_policies(team, checkpoint=checkpoint), episodes)


def train(path: Path, out: Path, budget: float, sets: Sequence[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "marl.cli", "train", str(path), "--out", str(out),
            "--set", f"time_budget_s={budget}", "--set", "iterations=1000000",
            *[x for s in sets for x in ("--set", s)]]
    if (out / "config.yaml").exists():
        args.append("--resume")
    out.mkdir(parents=True, exist_ok=True)
    log = open(out.parent / f"{out.name}.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def figures(path: Path, out: Path, scripted: float, floor: float, episodes: int) -> dict:
    """Best and final checkpoint of a run, re-evaluated, its normalised score and the time
    its evaluations took to reach 0.8 of it."""
    from marl.team import load_team

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()
            if x.strip()] if (out / "metrics.jsonl").exists() else []
    evals = [(r["wall_s"], r["eval_success_rate"]) for r in rows if "eval_success_rate" in r]
    kept = checkpoints(out)
    habits = habits_learnt(rows)
    if not evals or kept[0] is None:
        return {"best": None, "final": None, "normalised": None, "to_0.8_s": None,
                "iterations": 0, "habits": habits}
    team = load_team(path)
    best, final = (reevaluate(team, c, episodes) for c in kept)
    gap = scripted - floor
    norm = (best - floor) / gap if gap > 0 else None
    reach = next((t for t, e in evals if gap > 0 and e >= floor + 0.8 * gap), None)
    return {"best": best, "final": final, "normalised": norm, "to_0.8_s": reach,
            "iterations": max((r.get("iteration", 0) for r in rows), default=0),
            "habits": habits}


def habits_learnt(rows: list[dict]) -> float | None:
    """The lowest agent's ``habit_agreement`` at the warm-up's last evaluation (None
    without a warm-up)."""
    return next((min(r["habit_agreement"].values()) for r in reversed(rows)
                 if r.get("phase") == "warmup" and r.get("habit_agreement")), None)


def run_dir(out: Path, name: str, seed: int) -> Path:
    """Where a variant's run with ``seed`` goes (seed 0 where a one-seed suite puts it)."""
    return out / (name if seed == 0 else f"{name}-seed{seed}")


def over_seeds(runs: list[dict]) -> dict:
    """A variant's figures from its runs with each seed: the median of each (a figure no
    run reached, such as the time to 0.8 of the gap, counts as never), and the normalised
    score of every seed."""
    def median(key: str) -> float | None:
        values = [r[key] for r in runs]
        if key == "to_0.8_s":  # a run that never reached it is slower than any that did
            values = [float("inf") if v is None else v for v in values]
        values = [v for v in values if v is not None]
        m = statistics.median(values) if values else None
        return None if m is None or m == float("inf") else m

    out = {k: median(k) for k in ("best", "final", "normalised", "to_0.8_s", "habits")}
    out["iterations"] = int(statistics.median(r["iterations"] for r in runs))
    out["seeds"] = [r["normalised"] for r in runs]
    return out


def table(results: dict[str, dict]) -> str:
    fmt = lambda x, f="{:.2f}": "-" if x is None else f.format(x)  # noqa: E731
    seeded = any(len(r.get("seeds", ())) > 1 for r in results.values())
    head = ("| variant | scripted | floor | best | final | normalised | to 0.8 (s) | "
            "iterations | habits learnt |" + (" normalised per seed |" if seeded else "")
            + "\n|---|---|---|---|---|---|---|---|---|" + ("---|" if seeded else ""))
    lines = [head]
    for name, r in results.items():
        per_seed = f" {', '.join(fmt(x) for x in r.get('seeds', ()))} |" if seeded else ""
        lines.append(f"| {name} | {fmt(r['scripted'])} | {fmt(r['floor'])} | {fmt(r['best'])} "
                     f"| {fmt(r['final'])} | {fmt(r['normalised'])} | "
                     f"{fmt(r['to_0.8_s'], '{:.0f}')} | {r['iterations']} | "
                     f"{fmt(r['habits'])} |{per_seed}")
    scores = [r["normalised"] for r in results.values() if r["normalised"] is not None]
    if scores:
        solved = sum(s >= 0.8 for s in scores)
        of = " (each variant's median over its seeds)" if seeded else ""
        lines.append(f"\n{solved} of {len(scores)} variants at a normalised score of 0.8 or "
                     f"more{of}; median {statistics.median(scores):.2f}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=600.0, help="seconds per variant")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="variant names")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "generality")
    parser.add_argument("--episodes", type=int, default=1024,
                        help="eval instances of each reference and re-evaluation")
    parser.add_argument("--seeds", type=int, default=1,
                        help="train each variant with seeds 0 to N-1; report the medians")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--report", action="store_true",
                        help="train nothing; score the runs already in --out")
    args = parser.parse_args()
    paths = sorted(VARIANTS.glob("*.yaml"))
    if args.only:
        unknown = set(args.only) - {p.stem for p in paths}
        if unknown:
            raise SystemExit(f"unknown variants {sorted(unknown)}; they are "
                             f"{[p.stem for p in paths]}")
        paths = [p for p in paths if p.stem in args.only]
    if args.seeds < 1:
        raise SystemExit(f"--seeds {args.seeds}: train at least one seed per variant")
    if args.seeds > 1 and any(s.split("=", 1)[0].strip() == "seed" for s in args.sets):
        raise SystemExit("--seeds sets each run's seed; drop --set seed=... or use --seeds 1")
    jobs = [(p, k) for p in paths for k in range(args.seeds)]
    results: dict[str, dict] = {}
    for p in paths:
        scripted, floor = references(p, args.episodes)
        results[p.stem] = {"scripted": scripted, "floor": floor}
        print(f"{p.stem}: scripted {scripted:.2f}, floor {floor:.2f}", flush=True)
    pending, running, exits = ([] if args.report else list(jobs)), {}, {}
    start = time.perf_counter()
    while pending or running:
        while pending and len(running) < args.jobs:
            p, k = pending.pop(0)
            out = run_dir(args.out, p.stem, k)
            running[out.name] = train(p, out, args.budget,
                                      args.sets + ([f"seed={k}"] if k else []))
        for name, proc in list(running.items()):
            if proc.poll() is None:
                continue
            del running[name]
            print(f"{name}: trained (exit {proc.returncode}; "
                  f"{time.perf_counter() - start:.0f} s in)", flush=True)
            exits[name] = proc.returncode
        time.sleep(1)
    for p in paths:
        r = results[p.stem]
        runs = [figures(p, run_dir(args.out, p.stem, k), r["scripted"], r["floor"],
                        args.episodes) for k in range(args.seeds)]
        r.update(runs[0] if args.seeds == 1 else over_seeds(runs))
        codes = [exits.get(run_dir(args.out, p.stem, k).name) for k in range(args.seeds)]
        if any(c is not None for c in codes):
            r["exit"] = codes[0] if args.seeds == 1 else codes
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "generality.json").write_text(json.dumps(
        {"budget_s": args.budget, "seeds": args.seeds, "sets": args.sets, "results": results},
        indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
