"""How long ``marl analyze`` takes on many long runs.

Builds ``--runs`` training-run directories of ``--iterations`` iterations each, shaped as
the trainer writes them for ``scenarios/ref.yaml`` (a metrics row per iteration, an
evaluation of 64 episodes every 10 iterations, with a speaker whose language changes over
training), then times ``marl analyze`` on all of them, end to end in a fresh process (what
a user waits for: imports, reading, metrics, figures, the HTML), and reports where the
time goes. The runs' contents are synthetic: only the sizes matter here.

    python benchmarks/analyze.py [--runs 10] [--iterations 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def episode(rng: np.random.Generator, progress: float) -> dict:
    meaning = [int(rng.integers(4)), int(rng.integers(4))]
    noisy = rng.random() > progress
    message = "".join("abcdefgh"[int(rng.integers(8))] if noisy else "abcdefgh"[v + 4 * k]
                      for k, v in enumerate(meaning))
    ledger = [{"episode": 0, "round": 0, "layer": 0, "agent": "speaker", "model": "gpt-4o-mini",
               "prompt_tokens": 80, "cached_tokens": 0, "completion_tokens": 3,
               "total_tokens": 83, "received": {}, "cost_usd": "0.000012900"},
              {"episode": 0, "round": 0, "layer": 1, "agent": "listener",
               "model": "gpt-4o-mini", "prompt_tokens": 92, "cached_tokens": 0,
               "completion_tokens": 3, "total_tokens": 95, "received": {"speaker": 12},
               "cost_usd": "0.000015600"}]
    return {"answer": "00", "answers": ["00"], "score": 0.5, "success": not noisy,
            "token_penalty": 0.0, "reward": 0.5, "target": "00", "tokens": 178,
            "split": "train", "instance": {"meaning": meaning, "split": "train"},
            "cost_usd": "0.000028500", "group": 0,
            "private": {"speaker": f"object {meaning}", "listener": ""},
            "transcript": [{"round": 0, "layer": 0, "agent": "speaker", "message": message,
                            "flags": {}, "valid": True, "oracle_agrees": False},
                           {"round": 0, "layer": 1, "agent": "listener", "message": "00",
                            "flags": {}, "valid": True, "oracle_agrees": False}],
            "ledger": ledger}


def make_run(path: Path, iterations: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    (path / "episodes").mkdir(parents=True)
    (path / "scenario.yaml").write_text((ROOT / "scenarios" / "ref.yaml").read_text())
    rows = []
    for i in range(1, iterations + 1):
        row = {"phase": "rl", "step": i, "iteration": i, "stage": None, "episodes": 128 * i,
               "reward_mean": 0.5, "success_rate": i / iterations, "tokens_per_episode": 178.0,
               "cost_per_episode": 2.85e-05, "loss": 0.01, "samples_per_s": 700.0}
        if i % 10 == 0:
            row["eval_success_rate"] = i / iterations
            with (path / "episodes" / f"eval_{i:06d}.jsonl").open("w") as f:
                for _ in range(64):
                    f.write(json.dumps(episode(rng, i / iterations)) + "\n")
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"scenario": "ref", "algorithm": "magrpo",
                                                   "uses_oracle": False,
                                                   "iterations": iterations}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [Path(tmp) / f"run{i:02d}" for i in range(args.runs)]
        for i, run in enumerate(runs):
            make_run(run, args.iterations, i)
        size = sum(f.stat().st_size for r in runs for f in r.rglob("*") if f.is_file())
        print(f"{args.runs} runs x {args.iterations} iterations, "
              f"{args.iterations // 10} evaluations of 64 episodes each: {size / 2**20:.0f} MiB")
        walls = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "marl.cli", "analyze", *map(str, runs),
                            "--out", str(Path(tmp) / "report.html")], check=True,
                           capture_output=True)
            walls.append(time.perf_counter() - start)
        print(f"marl analyze, end to end: {min(walls):.2f} s best of {args.repeats} "
              f"({', '.join(f'{w:.2f}' for w in walls)})")
        from marl.analysis.analyze import analyze
        from marl.analysis.report import figures, html_report

        start = time.perf_counter()
        data = analyze(runs)
        numbers = time.perf_counter() - start
        figs = figures(data)
        page = html_report(data, figs)
        total = time.perf_counter() - start
        print(f"in process: numbers {numbers:.2f} s, figures and HTML {total - numbers:.2f} s "
              f"({len(figs)} figures, {len(page) / 2**20:.1f} MiB of HTML)")


if __name__ == "__main__":
    main()
