"""``key=value`` overrides from the command line (``--set``), values read as YAML."""

from __future__ import annotations

from typing import Any

import yaml

from marl.errors import ConfigError


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
