"""Fuzz the scenario loader: mutated shipped scenarios either load or fail with ScenarioError.

Mutations act on the parsed data (delete a key, misspell a key, replace a value with one of
another type, duplicate a list entry) or on the file's bytes (truncate, delete, insert).
Whatever the input, ``load_team`` must raise nothing but :class:`ScenarioError`, every
problem must say something, and a team that loads must give an environment that resets.
Examples are derandomized and no database is kept, so CI runs the same cases every time.
"""

from __future__ import annotations

import copy
import math
import random
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marl import make_env
from marl.errors import ScenarioError
from marl.team import Team, load_team

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
#: Step a loaded episode to its end when it is this short (longer ones only reset).
MAX_STEPS = 12


@cache
def _source(path: Path) -> tuple[bytes, Any]:
    text = path.read_bytes()
    return text, yaml.safe_load(text)


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) pair of nested dicts and lists, the root included."""
    out = [(path, value)]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _nodes(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _nodes(item, (*path, i))
    return out


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


IDS = st.sampled_from(["lead", "w1", "a0", "r3", "d0", "s31", "speaker", "x{i}", "{i}"])
VALUES = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([10**20, -(10**20), 2**63, 0, 1, 256, 1000, 1001, 4097]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(math.nan),
    st.text(max_size=12),
    IDS,
    st.none(),
    st.booleans(),
    st.lists(st.one_of(st.integers(-2, 5), IDS), max_size=4),
    st.dictionaries(st.one_of(st.text(max_size=6), IDS), st.one_of(st.integers(), IDS),
                    max_size=3),
)


def _typo(rnd: random.Random, draw: st.DrawFn, key: str) -> str:
    i = rnd.randrange(max(len(key), 1))
    kind = rnd.choice(["drop", "double", "swap", "upper", "plural", "char"])
    if kind == "drop" and key:
        return key[:i] + key[i + 1 :]
    if kind == "double" and key:
        return key[:i] + key[i] + key[i:]
    if kind == "swap" and len(key) > 1:
        i = min(i, len(key) - 2)
        return key[:i] + key[i + 1] + key[i] + key[i + 2 :]
    if kind == "upper":
        return key.upper()
    if kind == "char":
        return key[:i] + draw(st.characters(codec="utf-8")) + key[i:]
    return key + "s"


@st.composite
def mutated_data(draw: st.DrawFn) -> Any:
    """A shipped scenario's data with one to three random mutations.

    Structural choices come from a Hypothesis-seeded ``Random``, so they spread evenly over
    the whole file instead of clustering on the first keys as small draws do.
    """
    rnd = draw(st.randoms(use_true_random=True))
    data = copy.deepcopy(_source(rnd.choice(SCENARIOS))[1])
    for _ in range(rnd.choice([1, 1, 2, 3])):
        nodes = _nodes(data)
        op = rnd.choice(["delete", "rename", "replace", "replace", "perturb", "duplicate"])
        if op == "perturb":  # a plausible value: another int, or another string of the file
            leaves = [(p, v) for p, v in nodes if p and isinstance(v, (int, str))]
            strings = [v for _, v in leaves if isinstance(v, str)]
            if leaves:
                path, old = rnd.choice(leaves)
                new = rnd.choice(strings) if isinstance(old, str) else rnd.randint(0, 2 * abs(old))
                _at(data, path[:-1])[path[-1]] = new
            continue
        if op == "replace":
            path, _ = rnd.choice(nodes)
            if not path:
                data = draw(VALUES)
                continue
            _at(data, path[:-1])[path[-1]] = draw(VALUES)
            continue
        if op == "duplicate":
            lists = [v for _, v in nodes if isinstance(v, list) and v]
            if lists:
                items = rnd.choice(lists)
                items.insert(rnd.randrange(len(items) + 1), copy.deepcopy(rnd.choice(items)))
            continue
        keyed = [p for p, _ in nodes if p and isinstance(_at(data, p[:-1]), dict)]
        if not keyed:
            continue
        path = rnd.choice(keyed)
        parent = _at(data, path[:-1])
        value = parent.pop(path[-1])
        if op == "rename":
            parent[_typo(rnd, draw, str(path[-1]))] = value
    return data


@st.composite
def corrupted_text(draw: st.DrawFn) -> bytes:
    """A shipped scenario's bytes, truncated or with bytes deleted or inserted."""
    rnd = draw(st.randoms(use_true_random=True))
    text = bytearray(_source(rnd.choice(SCENARIOS))[0])
    for _ in range(rnd.choice([1, 1, 2, 4])):
        op = rnd.choice(["truncate", "delete", "insert", "insert"])
        i = rnd.randrange(len(text) + 1)
        if op == "truncate":
            del text[i:]
        elif op == "delete":
            del text[i : i + rnd.randint(1, 8)]
        else:
            junk = draw(st.one_of(st.binary(min_size=1, max_size=4),
                                  st.text(":-[]{}#&*!|>'\"%@`, \n\t{i}", min_size=1,
                                          max_size=4).map(str.encode)))
            text[i:i] = junk
    return bytes(text)


def _check(load: Any) -> Team | None:
    """Run ``load``; only ScenarioError may escape it, and it must explain itself."""
    try:
        team = load()
    except ScenarioError as exc:
        assert exc.problems, "a ScenarioError without problems"
        for problem in exc.problems:
            assert isinstance(problem.message, str) and problem.message.strip(), problem
            assert isinstance(problem.path, str)
        assert str(exc)
        return None
    env = make_env(team)
    env.reset(seed=0)
    if team.rounds * team.topo.n_layers <= MAX_STEPS:
        while env.agents:
            env.step({a: "" for a in env.agents})
    return team


def _load_file(content: bytes) -> Team | None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_bytes(content)
        return _check(lambda: load_team(path))


@FUZZ
@given(mutated_data())
def test_mutated_data_loads_or_raises_scenario_error(data):
    from_file = _load_file(yaml.safe_dump(data, allow_unicode=True).encode())
    if isinstance(data, dict):
        from_data = _check(lambda: load_team(data))
        assert (from_file is None) == (from_data is None)


@FUZZ
@given(corrupted_text())
def test_corrupted_text_loads_or_raises_scenario_error(content):
    _load_file(content)
