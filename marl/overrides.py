"""Settings files and ``key=value`` overrides from the command line (``--set``), values
read as YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from marl.errors import ConfigError
from marl.scenario import problems_from, read_yaml

Model = TypeVar("Model", bound=BaseModel)


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    """``k=3`` gives an int, ``layers=[3, 1]`` a list, ``hub=a0`` a string.

    >>> parse_sets(["k=3", "layers=[3, 1]", "hub=a0"])
    {'k': 3, 'layers': [3, 1], 'hub': 'a0'}
    """
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: expected key=value, e.g. --set lr=0.001.")
        try:
            params[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {pair!r}: the value is not valid YAML "
                              f"({getattr(exc, 'problem', exc)}); quote it.") from None
    return params


def load_settings(model: type[Model], what: str, path: str | Path | None = None,
                  sets: list[str] | None = None) -> Model:
    """``model``'s defaults, then the YAML file's overrides, then ``key=value`` overrides;
    problems name the file, line and key (``what``: "training config", ...)."""
    data: dict[str, Any] = {}
    lines: dict = {}
    source = str(path) if path is not None else "--set"
    if path is not None:
        raw, lines = read_yaml(path)
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"{path}: a {what} file holds key: value overrides of "
                              f"{model.__name__}, got a {type(raw).__name__}.")
        data.update(raw or {})
    overrides = parse_sets(sets or [])
    data.update(overrides)
    for key in overrides:  # a value from --set has no line in the file
        lines.pop((key,), None)
    return validated(model, data, what, source, lines)


def validated(model: type[Model], data: dict[str, Any], what: str, source: str,
              lines: dict | None = None) -> Model:
    """``model`` from ``data``, or a :class:`ConfigError` that names each problem's key (and
    line of ``source``, with ``lines``)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = problems_from(exc, model, lines=lines or {})
        raise ConfigError(f"invalid {what}:\n" + "\n".join(
            "  " + p.render(source) for p in problems)) from None
