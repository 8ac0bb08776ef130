"""Scoring a shared policy's batch group by group against in one call.

    python benchmarks/scoring.py [--variants relay_4_shared vote_4_complete gather_6_tree]
                                 [--episodes 128] [--repeats 5] [--threads 1]

A policy that several agents share reads prompts that part at the agent's name and then
share a long stem per agent. :func:`marl.policies.kv_reuse.stem_groups` splits such a batch
into groups, each scored with its own stem. Per variant (``benchmarks/generality/``), the
prompts and completions of ``--episodes`` episodes played by the untrained tiny policies
are scored with log-probs, entropy and KL to a frozen reference, and backpropagated, as one
training minibatch is: once group by group (the default) and once in one call (the
grouping turned off), alternating, ``--repeats`` times. The ratio is the median of the
repeats' one-call time over their grouped time, with the positions each way runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from unittest import mock

import torch

from marl.policies import generation
from marl.policies.kv_reuse import positions, stem_groups
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team

VARIANTS = Path(__file__).resolve().parent / "generality"


def batch(variant: str, episodes: int) -> tuple[object, list, list]:
    """The policy most of ``variant``'s agents share, and the prompts and completions of
    its agents' calls in ``episodes`` episodes."""
    team = load_team(VARIANTS / f"{variant}.yaml")
    policies = build_policies(team)
    played = collect(team, policies, episodes, 1, seed=0)
    policy = max(set(policies.values()), key=lambda p: list(policies.values()).count(p))
    agents = [a for a, p in policies.items() if p is policy]
    slots = played.slots(agents).tolist()
    prompts = [tuple(played.prompt_ids[b][k]) for b in range(episodes) for k in slots]
    completions = [tuple(played.tokens[b, k][played.mask[b, k]].tolist())
                   for b in range(episodes) for k in slots]
    return policy, prompts, completions


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
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print("| variant | rows | groups | positions: grouped / one call | seconds: grouped / "
          "one call | speed-up |")
    print("|---|---|---|---|---|---|")
    for variant in args.variants:
        policy, prompts, completions = batch(variant, args.episodes)
        groups = stem_groups(prompts)
        grouped_positions = sum(positions([prompts[i] for i in g]) for g in groups)
        grouped, whole = [], []
        for _ in range(args.repeats):
            grouped.append(timed(policy, prompts, completions))
            with mock.patch.object(generation, "stem_groups", lambda ps: [list(range(len(ps)))]):
                whole.append(timed(policy, prompts, completions))
        ratio = statistics.median(w / g for w, g in zip(whole, grouped, strict=True))
        print(f"| {variant} | {len(prompts)} | {len(groups)} | {grouped_positions:,} / "
              f"{positions(prompts):,} | {statistics.median(grouped):.3f} / "
              f"{statistics.median(whole):.3f} | {ratio:.2f}× |")


if __name__ == "__main__":
    main()
