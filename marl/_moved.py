"""Modules that moved in 0.2, importable from their old paths until the next release.

Importing an old path warns (``DeprecationWarning``, naming the new path) and gives the
module at its new path, the very same object, so ``from marl.trainer import Trainer`` and
``monkeypatch.setattr("marl.trainer.X", ...)`` keep working.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: Old module path -> new module path.
MOVED: dict[str, str] = {
    "marl.trainer": "marl.training.trainer",
    "marl.train_rows": "marl.training.rows",
    "marl.curriculum": "marl.training.curriculum",
    "marl.wandb_run": "marl.training.wandb_run",
    "marl.credit": "marl.algorithms.credit",
    "marl.costing": "marl.cost.predict",
    "marl.prices": "marl.cost.prices",
    "marl.ledger": "marl.cost.ledger",
    "marl.analysis.cost": "marl.analysis.spend",
    "marl.sweep_grid": "marl.sweep.grid",
    "marl.sweep_tables": "marl.sweep.tables",
    "marl.symbolic": "marl.baseline.symbols",
    "marl.cli_shared": "marl.cli.shared",
    "marl.cli_population": "marl.cli.population",
    "marl.cli_baseline": "marl.cli.baseline",
    "populations.baseline": "marl.baseline.rllib",
    "populations.baseline_config": "marl.baseline.config",
    "populations.session": "marl.cluster",
}


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new one."""

    def __init__(self, new: str):
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system stamped the old path's spec on it


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(name)
        if new is None:
            return None
        warnings.warn(f"{name} has moved to {new}; import it from there (the old path goes "
                      "in the next release).", DeprecationWarning, stacklevel=2)
        return importlib.machinery.ModuleSpec(name, _Alias(new))


def install() -> None:
    """Answer imports of the old paths (once per process)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
