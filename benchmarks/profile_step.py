"""Where the time of one default MAGRPO iteration goes, on ``signal`` and ``gather_star``.

    python benchmarks/profile_step.py [--iterations 20] [--threads 2] [--scenario signal.yaml]

Each scenario is trained with the defaults (the format warm-up first, untimed), then
``--iterations`` RL iterations are timed with wall-clock timers wrapped around the parts
of an iteration (no evaluation or checkpoint falls inside them):

- rollout: ``collect``; within it, the model's forward passes while sampling (prefill,
  decode, cache gathering) and the rest of the sampling loop (token picking, stop-string
  checks), and outside the sampling loop the environment, routing and ledger;
- update: ``learner.update``; within it, the scoring forward (log-probs and the KL
  reference), ``backward``, the optimizer step, and the rest (advantages, sample
  assembly, the clipped loss);
- the rest of the step: the metrics row, transcripts, logging.

Timers nest (a part's time includes what it calls); shares are of the timed iterations'
total wall time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch

import marl.policies.lm
import marl.training.trainer
from marl.algorithms.config import TrainConfig
from marl.policies.tiny import TinyCausalLM
from marl.team import load_team
from marl.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


class Timers:
    """Accumulated seconds per named part, and which parts are running."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.running: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn, within: str | None = None):
        """``fn`` timed as ``name``; only calls made inside the part ``within`` count."""
        def timed(*args, **kwargs):
            if within is not None and not self.running[within]:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            self.running[name] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.running[name] -= 1
                self.seconds[name] += time.perf_counter() - start
        return timed


def patches(timers: Timers, trainer: Trainer) -> list:
    """The wrappers: module-level functions where the trainer and policies look them up,
    and the methods of the model, tensor and optimizer classes."""
    learner = trainer.learner
    found = [mock.patch.object(marl.training.trainer, "collect",
                               timers.wrap("rollout", marl.training.trainer.collect)),
             mock.patch.object(marl.policies.lm, "generate",
                               timers.wrap("sampling loop", marl.policies.lm.generate)),
             mock.patch.object(marl.policies.lm, "score",
                               timers.wrap("scoring forward", marl.policies.lm.score)),
             mock.patch.object(learner, "update", timers.wrap("update", learner.update)),
             mock.patch.object(torch.Tensor, "backward",
                               timers.wrap("backward", torch.Tensor.backward)),
             mock.patch.object(torch.optim.Adam, "step",
                               timers.wrap("optimizer step", torch.optim.Adam.step))]
    for method in ("prefill", "decode", "gather", "expand"):
        found.append(mock.patch.object(TinyCausalLM, method, timers.wrap(
            "model forward (sampling)", getattr(TinyCausalLM, method), "sampling loop")))
    return found


def profile(scenario: str, iterations: int, out: Path) -> None:
    """``scenario``: a file name in ``scenarios/``, or a path to any scenario file."""
    team = load_team(ROOT / "scenarios" / scenario if "/" not in scenario else Path(scenario))
    cfg = TrainConfig(iterations=iterations, eval_every=10**6, checkpoint_every=10**6,
                      checkpoint_every_s=10**9)
    trainer = Trainer(team, cfg, out)
    while trainer.phase == "warmup":
        trainer.step()
    trainer.step()  # one untimed iteration: first-call costs
    timers = Timers()
    with ExitStack() as stack:
        for p in patches(timers, trainer):
            stack.enter_context(p)
        start = time.perf_counter()
        for _ in range(iterations):
            trainer.step()
        total = time.perf_counter() - start
    s = timers.seconds
    rows = [
        ("rollout (collect)", s["rollout"]),
        ("  sampling loop", s["sampling loop"]),
        ("    model forward", s["model forward (sampling)"]),
        ("    token picking, stop checks", s["sampling loop"] - s["model forward (sampling)"]),
        ("  env, routing, ledger", s["rollout"] - s["sampling loop"]),
        ("update", s["update"]),
        ("  scoring forward (+ KL reference)", s["scoring forward"]),
        ("  backward", s["backward"]),
        ("  optimizer step", s["optimizer step"]),
        ("  advantages, samples, loss", s["update"] - s["scoring forward"] - s["backward"]
         - s["optimizer step"]),
        ("rest of the step (row, logs)", total - s["rollout"] - s["update"]),
    ]
    last = trainer.rows[-1]
    print(f"{scenario}: {iterations} default MAGRPO iterations after the warm-up, "
          f"{total / iterations * 1000:.0f} ms each, {cfg.episodes_per_iter * cfg.group_size} "
          f"episodes ({last['tokens_per_episode']:.0f} tokens each), "
          f"{torch.get_num_threads()} thread(s)")
    for name, sec in rows:
        print(f"  {name:<36} {sec / iterations * 1000:8.1f} ms {100 * sec / total:6.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scenario", nargs="+", default=["signal.yaml", "gather_star.yaml"],
                        help="names in scenarios/ or paths to scenario files")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(tempfile.mkdtemp(prefix="marl-profile-"))
    for scenario in args.scenario:
        profile(scenario, args.iterations, out / Path(scenario).stem)


if __name__ == "__main__":
    main()
