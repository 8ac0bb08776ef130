"""PBT against the same members trained without it: the best PBT member's final objective
vs the median of the fixed members', same scenario, seeds, initial settings and budget.

    python benchmarks/population.py [SCENARIO] [--config configs/population/pbt.yaml]
                                    [--set key=value ...] [--out DIR]

Runs ``scheduler: fixed`` first, then ``scheduler: pbt``, each on a fresh local Ray sized
to the machine, and prints one line per member and the comparison.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from populations.config import load_pbt_config
from populations.pbt import run_pbt

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", nargs="?", default=str(ROOT / "scenarios" / "signal.yaml"))
    p.add_argument("--config", default=str(ROOT / "configs" / "population" / "pbt.yaml"))
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--out", default="runs/bench-population")
    a = p.parse_args()
    finals = {}
    for scheduler in ("fixed", "pbt"):
        cfg = load_pbt_config(a.config, [*a.sets, f"scheduler={scheduler}"])
        start = time.perf_counter()
        population = run_pbt(a.scenario, cfg, Path(a.out) / scheduler, log=lambda m: None)
        seconds = time.perf_counter() - start
        finals[scheduler] = [m["final"]["objective"] for m in population["members"]]
        for m in population["members"]:
            print(f"{scheduler:5s} {m['id']}: objective {m['final']['objective']:.3f} "
                  f"settings {m['history'][-1]['settings']} cost {m['cost_usd']:.4f} USD")
        print(f"{scheduler:5s}: {cfg.members} members x {cfg.budget_steps} steps in "
              f"{seconds:.0f} s, {population['exploits']} exploits", flush=True)
    best, median = max(finals["pbt"]), statistics.median(finals["fixed"])
    print(f"best PBT member {best:.3f} vs median fixed member {median:.3f} "
          f"({'beats' if best > median else 'does not beat'} it)")


if __name__ == "__main__":
    main()
