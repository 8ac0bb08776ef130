"""Scoring a shared policy's batch as a tree of shared prefixes, group by group, against
a stem only and against one call.

    python benchmarks/scoring.py [--variants relay_4_shared vote_4_complete gather_6_tree]
                                 [--episodes 128] [--warmup 0] [--repeats 5] [--threads 1]

A policy that several agents share reads prompts that part at the agent's name and then
share a long stem per agent, then a task instance's part, then the messages read.
:func:`marl.policies.kv_reuse.stem_groups` splits such a batch into groups where one call
would run padding, and each group runs as a tree of the prefixes its prompts share
(:func:`marl.policies.kv_reuse.prefix_levels`). Per variant (``benchmarks/generality/``),
the prompts and completions of ``--episodes`` episodes played by the tiny policies (fresh,
or after ``--warmup`` steps of the default format warm-up, when they follow their codes as
a trained team does) are scored with log-probs, entropy and KL to a frozen reference, and
backpropagated, as one training minibatch is, three ways, alternating, ``--repeats``
times: the default; group by group with a stem only (at most two levels: the scoring
before trees); in one call with a stem only. Ratios are medians of the repeats' ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from marl.algorithms.config import TrainConfig
from marl.policies import generation
from marl.policies.kv_reuse import LEVEL_COST, prefix_levels, stem_groups
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team
from marl.training.trainer import Trainer

VARIANTS = Path(__file__).resolve().parent / "generality"


def batch(variant: str, episodes: int, warmup: int) -> tuple[object, list, list]:
    """The policy most of ``variant``'s agents share, and the prompts and completions of
    its agents' calls in ``episodes`` episodes (after ``warmup`` warm-up steps)."""
    team = load_team(VARIANTS / f"{variant}.yaml")
    if warmup:
        trainer = Trainer(team, TrainConfig(warmup_steps=warmup),
                          Path(tempfile.mkdtemp(prefix="marl-scoring-")))
        while trainer.phase == "warmup":
            trainer.step()
        policies = trainer.policies
    else:
        policies = build_policies(team)
    played = collect(team, policies, episodes, 1, seed=0)
    policy = max(set(policies.values()), key=lambda p: list(policies.values()).count(p))
    agents = [a for a, p in policies.items() if p is policy]
    slots = played.slots(agents).tolist()
    prompts = [tuple(played.prompt_ids[b][k]) for b in range(episodes) for k in slots]
    completions = [tuple(played.tokens[b, k][played.mask[b, k]].tolist())
                   for b in range(episodes) for k in slots]
    return policy, prompts, completions


def stem_only(prompts, overhead=LEVEL_COST, most=8):
    """:func:`prefix_levels` with at most two levels: a stem, then each distinct prompt."""
    return prefix_levels(prompts, overhead, most=min(most, 2))


def timed(policy, prompts: list, completions: list) -> float:
    """Seconds to score and backpropagate the batch once."""
    reference = policy.model.frozen()
    start = time.perf_counter()
    lp, mask, ent, kl = policy.score(prompts, completions, entropy=True, reference=reference)
    ((lp * mask).sum() + ent.sum() + kl.sum()).backward()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", nargs="+",
                   default=["relay_4_shared", "vote_4_complete", "gather_6_tree"])
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--warmup", type=int, default=0,
                   help="default warm-up steps before the batch is played (0: fresh policies)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print("| variant | rows | groups | positions: default / stem only / one call | seconds: "
          "default / stem only / one call | speed-up over stem only / one call |")
    print("|---|---|---|---|---|---|")
    one_call = mock.patch.object(generation, "stem_groups", lambda ps: [list(range(len(ps)))])
    for variant in args.variants:
        policy, prompts, completions = batch(variant, args.episodes, args.warmup)
        groups = stem_groups(prompts)
        cost = [sum(prefix_levels([prompts[i] for i in g])[1] for g in groups),
                sum(stem_only([prompts[i] for i in g])[1] for g in groups),
                stem_only(prompts)[1]]
        seconds: list[list[float]] = [[], [], []]
        for _ in range(args.repeats):
            seconds[0].append(timed(policy, prompts, completions))
            with mock.patch.object(generation, "prefix_levels", stem_only):
                seconds[1].append(timed(policy, prompts, completions))
                with one_call:
                    seconds[2].append(timed(policy, prompts, completions))
        ratios = [statistics.median(b / a for a, b in zip(seconds[0], way, strict=True))
                  for way in seconds[1:]]
        print(f"| {variant} | {len(prompts)} | {len(groups)} | "
              f"{' / '.join(f'{c:,}' for c in cost)} | "
              f"{' / '.join(f'{statistics.median(x):.3f}' for x in seconds)} | "
              f"{ratios[0]:.2f}× / {ratios[1]:.2f}× |")


if __name__ == "__main__":
    main()
