"""The sweep of issue 13's acceptance, timed, with every cell checked against ``marl cost``.

    python benchmarks/sweep.py [--episodes 8] [--workers N]

Runs ``marl sweep scenarios/gather_star.yaml --grid topology.kind=star,chain,complete,debate
--grid costs.penalty_per_1k=0,1 --policy scripted`` end to end in a fresh process (what a
user waits for), then, for every cell that ran, compares its measured tokens per episode
with ``marl cost --policy scripted --json`` on the cell's own ``scenario.yaml`` (scripted
messages have fixed lengths, so the two must be equal). Invalid cells are listed with the
reason the sweep gave.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def marl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marl.cli", *args], capture_output=True,
                          text=True, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sweep"
        extra = ["--workers", str(args.workers)] if args.workers else []
        start = time.perf_counter()
        marl("sweep", str(ROOT / "scenarios" / "gather_star.yaml"),
             "--grid", "topology.kind=star,chain,complete,debate",
             "--grid", "costs.penalty_per_1k=0,1", "--policy", "scripted",
             "--episodes", str(args.episodes), "--out", str(out), *extra)
        wall = time.perf_counter() - start
        cells = [json.loads(x) for x in (out / "cells.jsonl").read_text().splitlines()]
        print(f"marl sweep, 8 cells x {args.episodes} episodes: {wall:.1f} s end to end")
        equal = True
        for c in cells:
            label = ", ".join(f"{k}={v}" for k, v in c["values"].items())
            if c["status"] != "done":
                print(f"  {label}: {c['status']}: {c['error'][:120]}")
                continue
            cost = json.loads(marl("cost", str(out / c["run_dir"] / "scenario.yaml"),
                                   "--policy", "scripted", "--json").stdout)
            predicted = cost["tokens_per_episode"]["total"]
            equal &= predicted == c["tokens_per_episode"]
            print(f"  {label}: measured {c['tokens_per_episode']:g} tokens/episode, "
                  f"marl cost {predicted:g}")
        print("every cell that ran equals marl cost" if equal else "MISMATCH with marl cost")


if __name__ == "__main__":
    main()
