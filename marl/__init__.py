"""llm-marl: multi-agent reinforcement learning for teams of LLM agents.

``import marl`` is cheap: the names below load their modules (and torch, gymnasium) on
first use.

>>> env = make_env("scenarios/signal.yaml", seed=0)
>>> obs, infos = env.reset()
>>> env.scheduled
('speaker',)
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from marl import _moved

_moved.install()

__version__ = "0.1.0"
#: Public name -> the module that defines it.
_EXPORTS = {"TeamEnv": "marl.env", "make_env": "marl.env", "MarlError": "marl.errors",
            "ScenarioError": "marl.errors", "Team": "marl.team", "load_team": "marl.team"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'marl' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
