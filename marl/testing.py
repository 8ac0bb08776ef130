"""The environment contract, shipped as library code so every scenario can be checked.

``check_scenario(path)`` runs PettingZoo's ``parallel_api_test`` plus our own checks:
observations inside their spaces, whole-episode determinism (PettingZoo's seed test
compares only the first step), garbage actions never raising, and measured ledger totals
equal to the cost model's prediction for scripted and random teams. A failed check raises
:class:`ContractError` (explicitly: the checks hold under ``python -O`` too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pettingzoo.test import parallel_api_test

from marl.cost.predict import predict_range, predict_team
from marl.env import TeamEnv, make_env
from marl.runner import run
from marl.team import Team, load_team


class ContractError(AssertionError):
    """A scenario or task breaks the environment contract; the message says where."""


def require(ok: bool, message: str) -> None:
    """Raise :class:`ContractError` with ``message`` unless ``ok``."""
    if not ok:
        raise ContractError(message)


GARBAGE: tuple[Any, ...] = ("", "x" * 10_000, "héllo ünïcode ✓", "line\nbreak\r\x00", None, 42,
                            b"bytes", ["a", "list"], "\t\t", " " * 3)


def check_api(team: Team, seed: int = 0) -> None:
    """PettingZoo's parallel API test, and every observation inside its space."""
    parallel_api_test(TeamEnv(team, seed=seed), num_cycles=1000)
    env = TeamEnv(team, seed=seed)
    obs, _ = env.reset(seed=seed)
    for i in range(3):
        for a in env.possible_agents:
            env.action_space(a).seed(seed + i)
        while env.agents:
            for a, o in obs.items():
                require(env.observation_space(a).contains(o), f"{a}: observation outside its space")
            actions = {a: env.action_space(a).sample() for a in env.agents}
            obs, *_ = env.step(actions)
        obs, _ = env.reset()


def trace(env: TeamEnv, episodes: int, seed: int) -> list[Any]:
    """Everything an env emits over ``episodes`` episodes of seeded random actions."""
    out: list[Any] = []
    obs, infos = env.reset(seed=seed)
    for a in env.possible_agents:
        env.action_space(a).seed(seed)
    for _ in range(episodes):
        out.append((obs, infos))
        while env.agents:
            actions = {a: env.action_space(a).sample() for a in env.scheduled}
            step = env.step(actions)
            out.append(step)
            obs = step[0]
        out.append((env.render(), env.result))
        obs, infos = env.reset()
    return out


def check_determinism(team: Team, seed: int = 0, episodes: int = 3) -> None:
    """Same seed -> identical observations, rewards, infos and ledgers for whole episodes."""
    first = trace(TeamEnv(team, seed=seed), episodes, seed)
    second = trace(TeamEnv(team, seed=seed), episodes, seed)
    require(first == second, "the same seed gave different episodes")


def check_garbage(team: Team, seed: int = 0) -> None:
    """Any action, of any type or length, is accepted and flagged; nothing raises."""
    env = TeamEnv(team, seed=seed)
    env.reset(seed=seed)
    i = 0
    while env.agents:
        actions = {}
        for a in env.scheduled:
            actions[a] = GARBAGE[i % len(GARBAGE)]
            i += 1
        _, rewards, _, _, infos = env.step(actions)
        for a, action in actions.items():
            row, flags = infos[a]["ledger"][0], infos[a]["flags"]
            require(row.completion_tokens <= team.max_new_tokens(a), f"{a}: {action!r} was "
                    f"counted as {row.completion_tokens} tokens, over its limit")
            if not isinstance(action, str):
                require(flags.get("invalid_type") == type(action).__name__, f"{a}: a "
                        f"{type(action).__name__} action was not flagged invalid_type")
            elif len(action) > team.max_new_tokens(a):
                require(flags.get("truncated_from") == len(action), f"{a}: an over-long "
                        "action was not flagged truncated_from")
    require(env.result is not None and env.result["score"] in (0.0, 1.0),
            f"garbage actions ended with result {env.result!r}, not a score of 0 or 1")


def check_prediction(team: Team, policy: str, episodes: int = 4, seed: int = 0) -> None:
    """Measured ledger totals equal the cost model's prediction, per call, edge and cost;
    for a free-form task, every episode lies in the predicted range."""
    result = run(team, episodes, seed=seed, policy=policy)
    if team.task.messages == "text":
        bounds = predict_range(team, backend=policy)
        for e, counts in result.ledger.per_episode().items():
            require(bounds["min"].total.total <= counts.total <= bounds["max"].total.total,
                    f"episode {e}: {counts.total} tokens outside the predicted range")
        return
    pred = predict_team(team, backend=policy)
    for e, counts in result.ledger.per_episode().items():
        require(counts == pred.total, f"episode {e}: measured {counts} != predicted {pred.total}")
    calls = result.ledger.group(lambda row: (row.episode, row.agent, row.round))
    for (e, a, r), counts in calls.items():
        require(counts == pred.per_call[(a, r)], f"episode {e}, {a}, round {r + 1}: measured "
                f"{counts} != predicted {pred.per_call[(a, r)]}")
    per_edge = {k: v // episodes for k, v in result.ledger.per_edge().items()}
    expected = {k: v for k, v in pred.per_edge.items() if v}
    require(per_edge == expected, f"tokens per edge {per_edge} != predicted {expected}")
    require(result.ledger.cost() == pred.cost * episodes, f"cost {result.ledger.cost()} != "
            f"predicted {pred.cost * episodes}")


def check_scenario(scenario: str | Path | Team, seed: int = 0) -> None:
    """Run every contract check on one scenario."""
    team = scenario if isinstance(scenario, Team) else load_team(scenario)
    check_api(team, seed)
    check_determinism(team, seed)
    check_garbage(team, seed)
    for policy, hook in (("scripted", "oracle"), ("random", "random_message")):
        if team.task.provides(hook):
            check_prediction(team, policy, seed=seed)
    make_env(team).close()
