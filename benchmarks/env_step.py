"""Environment throughput with scripted agents: env steps and agent calls per second.

    python benchmarks/env_step.py [--episodes 300]

For a 3-agent and a 32-agent scenario it times whole episodes twice in the same process:
the env alone (replaying messages recorded from scripted agents, so policy time is
excluded) and env plus scripted policies through the batched rollout engine. One env step is one
layer of the schedule.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from marl.env import TeamEnv
from marl.rollout import collect
from marl.runner import build_policies
from marl.team import load_team

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {
    "3 agents (gather_chain)": "gather_chain.yaml",
    "32 agents (vote_swarm)": "vote_swarm.yaml",
}


def time_env_only(env: TeamEnv, episodes: int, messages: dict) -> tuple[float, int, int]:
    steps = calls = 0
    start = time.perf_counter()
    for _ in range(episodes):
        env.reset()
        rnd = 0
        while env.agents:
            acting = env.scheduled
            env.step({a: messages[(a, rnd)] for a in acting})
            steps += 1
            calls += len(acting)
            rnd = env.round
    return time.perf_counter() - start, steps, calls


def bench(path: Path, episodes: int) -> dict[str, float]:
    team = load_team(path)
    policies = build_policies(team, "scripted")
    record = collect(team, policies, episodes=1).records[0]
    messages = {(m["agent"], m["round"]): m["message"] for m in record["transcript"]}
    wall, steps, calls = time_env_only(TeamEnv(team, seed=0), episodes, messages)
    start = time.perf_counter()
    collect(team, policies, episodes=episodes)  # all episodes in one lockstep batch
    full = time.perf_counter() - start
    return {
        "steps_per_episode": steps / episodes,
        "env_steps_per_s": steps / wall,
        "env_calls_per_s": calls / wall,
        "with_policy_steps_per_s": steps / full,
        "with_policy_episodes_per_s": episodes / full,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    args = parser.parse_args()
    print(
        f"{'scenario':26} {'steps/ep':>8} {'env steps/s':>12} {'agent calls/s':>14} "
        f"{'+policy steps/s':>16} {'+policy eps/s':>14}"
    )
    results = {}
    for label, name in SCENARIOS.items():
        r = bench(ROOT / "scenarios" / name, args.episodes)
        results[label] = r
        print(
            f"{label:26} {r['steps_per_episode']:8.0f} {r['env_steps_per_s']:12,.0f} "
            f"{r['env_calls_per_s']:14,.0f} {r['with_policy_steps_per_s']:16,.0f} "
            f"{r['with_policy_episodes_per_s']:14,.1f}"
        )
    small, big = results.values()
    ratio = big["env_calls_per_s"] / small["env_calls_per_s"]
    print(f"agent calls/s, 32 agents vs 3 agents: {ratio:.2f}x")


if __name__ == "__main__":
    main()
