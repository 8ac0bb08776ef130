"""The grid of a sweep: ``--grid`` flags checked against the scenario's schema, their
Cartesian product as cells, and a cell merged into the scenario mapping."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

from marl.errors import ConfigError
from marl.scenario import Scenario
from marl.sweep.tables import show
from marl.training.curriculum import merge
from orchestration.hints import did_you_mean

EXAMPLE = "--grid topology.kind=star,chain"


@dataclass(frozen=True)
class Grid:
    """One ``--grid``: a key, its path (list indices as ints) and its values."""

    key: str
    path: tuple[str | int, ...]
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Cell:
    """One point of the grid: ``values`` maps each grid key to its value here."""

    index: int
    values: dict[str, Any]

    @property
    def id(self) -> str:
        """Stable directory name: grid position plus a hash of the values.

        >>> Cell(3, {"topology.kind": "chain"}).id
        'c003-523d3f32'
        """
        canonical = json.dumps(self.values, sort_keys=True, separators=(",", ":"))
        return f"c{self.index:03d}-{hashlib.sha1(canonical.encode()).hexdigest()[:8]}"

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={show(v)}" for k, v in self.values.items())


def parse_grids(flags: Sequence[str], scenario: dict[str, Any],
                train_settings: Sequence[str] | None = None) -> list[Grid]:
    """The ``--grid`` flags, checked against the scenario mapping and (with ``--train``)
    the training settings; values are read as YAML.

    >>> parse_grids(["protocol.rounds=1,2", "agents.1.count=2"], {"agents": [{}, {}]})
    ... # doctest: +NORMALIZE_WHITESPACE
    [Grid(key='protocol.rounds', path=('protocol', 'rounds'), values=(1, 2)),
     Grid(key='agents.1.count', path=('agents', 1, 'count'), values=(2,))]
    """
    if not flags:
        raise ConfigError(f"give at least one --grid key=v1,v2,..., e.g. {EXAMPLE}.")
    grids: list[Grid] = []
    for flag in flags:
        key, sep, text = (s.strip() for s in flag.partition("="))
        if not sep or not key or not text:
            raise ConfigError(f"--grid {flag!r}: expected key=v1,v2,..., e.g. {EXAMPLE}.")
        if key in [g.key for g in grids]:
            raise ConfigError(f"--grid {key} is given twice; give all its values in one flag, "
                              f"e.g. --grid {key}=a,b.")
        values = parse_values(flag, text)
        seen = [json.dumps(v) for v in values]
        if len(set(seen)) < len(seen):
            raise ConfigError(f"--grid {flag!r} repeats a value; give each value once.")
        path = key_path(key)
        if path[0] == "train":
            _check_setting(key, path, train_settings)
        else:
            _check_path(key, path, scenario)
        grids.append(Grid(key, path, values))
    return grids


def key_path(key: str) -> tuple[str | int, ...]:
    """A dotted key as a path; a number indexes a list.

    >>> key_path("agents.1.count")
    ('agents', 1, 'count')
    """
    return tuple(int(p) if p.isdigit() else p for p in key.split("."))


def parse_values(flag: str, text: str) -> tuple[Any, ...]:
    """``v1,v2,...`` read as one YAML flow sequence, so a value may itself be a list.

    >>> parse_values("--grid k=...", "star,0,1.5,[w1, lead],'a,b'")
    ('star', 0, 1.5, ['w1', 'lead'], 'a,b')
    """
    how = f"separate values by single commas and quote one holding commas, e.g. {EXAMPLE}."
    if text.startswith(",") or text.endswith(","):
        raise ConfigError(f"--grid {flag!r} has an empty value; {how}")
    try:
        values = yaml.safe_load(f"[{text}]")
        json.dumps(values)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--grid {flag!r}: the values are not valid YAML "
                          f"({getattr(exc, 'problem', exc)}); {how}") from None
    except TypeError:
        raise ConfigError(f"--grid {flag!r}: a value is neither a number, a string, true/false "
                          "nor a list of them (a date?); quote it.") from None
    return tuple(values)


def _check_setting(key: str, path: tuple, settings: Sequence[str] | None) -> None:
    if settings is None:
        raise ConfigError(f"--grid {key}: train.* keys sweep training settings, which needs "
                          "--train CONFIG (e.g. --train configs/algorithm/magrpo.yaml).")
    name = str(path[1]) if len(path) == 2 else ".".join(map(str, path[1:]))
    if name not in settings:
        raise ConfigError(f"--grid {key}: {name!r} is not a training setting."
                          f"{did_you_mean(name, list(settings))} Valid: "
                          f"{', '.join(settings)}.")


def _check_path(key: str, path: tuple, data: Any) -> None:
    """Walk ``path`` down the scenario schema and the file's data: keys must exist in the
    schema and list indices in the file (below free-form mappings anything goes)."""
    kind: Any = Scenario
    for depth, part in enumerate(path):
        where = ".".join(map(str, path[:depth]))
        if isinstance(data, list):
            if not isinstance(part, int) or part >= len(data):
                raise ConfigError(f"--grid {key}: {where} is a list of {len(data)} entries; "
                                  f"index it with 0 to {len(data) - 1}, e.g. "
                                  f"{where}.{len(data) - 1}.")
            data, kind = data[part], get_args(kind)[0] if get_origin(kind) is list else Any
            continue
        if get_origin(kind) is dict:  # any key (a policy name); the value has the dict's type
            data, kind = data.get(part) if isinstance(data, dict) else None, get_args(kind)[1]
            continue
        if not (isinstance(kind, type) and issubclass(kind, BaseModel)) or (
                kind.model_config.get("extra") == "allow"):
            return  # free-form below here (task params, a topology's parameters)
        if part not in kind.model_fields:
            valid = list(kind.model_fields)
            raise ConfigError(
                f"--grid {key}: {part!r} is not a key of {where or 'a scenario'}."
                f"{did_you_mean(part, valid)} Valid{' top-level' if not depth else ''} keys: "
                f"{', '.join(valid)}{'' if depth else ', or train.SETTING with --train'}.")
        kind = _non_none(kind.model_fields[part].annotation)
        data = data.get(part) if isinstance(data, dict) else None


def _non_none(kind: Any) -> Any:
    if get_origin(kind) in (Union, UnionType):
        return next(a for a in get_args(kind) if a is not type(None))
    return kind


def expand(grids: Sequence[Grid]) -> list[Cell]:
    """The Cartesian product of the grids, the first grid varying slowest.

    >>> [c.values for c in expand([Grid("a", ("a",), (1, 2)), Grid("b", ("b",), ("x", "y"))])]
    [{'a': 1, 'b': 'x'}, {'a': 1, 'b': 'y'}, {'a': 2, 'b': 'x'}, {'a': 2, 'b': 'y'}]
    """
    keys = [g.key for g in grids]
    return [Cell(i, dict(zip(keys, combo, strict=True)))
            for i, combo in enumerate(product(*(g.values for g in grids)))]


def apply_cell(scenario: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The scenario mapping with a cell's scenario values merged in, one key after another
    (``train.*`` keys are left to the training config).

    >>> base = {"topology": {"kind": "star", "hub": "lead"}, "agents": [{"id": "a"},
    ...         {"id": "w{i}", "count": 3}]}
    >>> apply_cell(base, {"topology.kind": "chain", "agents.1.count": 2, "train.lr": 0.1})
    {'topology': {'kind': 'chain'}, 'agents': [{'id': 'a'}, {'id': 'w{i}', 'count': 2}]}
    """
    for key, value in values.items():
        path = key_path(key)
        if path[0] != "train":
            scenario = merge(scenario, _override(scenario, path, value))
    return scenario


def _override(node: Any, path: tuple[str | int, ...], value: Any) -> Any:
    """The override mapping that sets ``path`` below ``node``; a list (which ``merge``
    replaces whole) comes back as a copy with the one entry changed."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(node)
        new = _override(items[head], rest, value)
        items[head] = merge(items[head], new) if isinstance(items[head], dict) and isinstance(
            new, dict) else new
        return items
    return {head: _override(node.get(head) if isinstance(node, dict) else None, rest, value)}
