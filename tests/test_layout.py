"""The package layout's promises: layers import downwards only, ``import marl`` is cheap,
and modules that moved stay importable from their old paths for one release."""

import ast
import importlib
import subprocess
import sys
import warnings

import pytest

from marl._moved import MOVED
from tests.marl.conftest import ROOT

HEAVY = ("torch", "gymnasium", "pettingzoo", "ray", "transformers")


def imported_by(module: str) -> list[str]:
    """The heavy libraries loaded by importing ``module`` in a fresh interpreter."""
    code = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, check=True)
    return result.stdout.split()


@pytest.mark.parametrize("module", ["marl", "marl.algorithms.config", "marl.scenario"])
def test_importing_marl_loads_no_heavy_library(module):
    assert imported_by(module) == []


def imports(package: str) -> dict[str, set[str]]:
    """Every module of ``package`` and the project modules it imports anywhere in its body
    (inside functions too: a lazy import is still a dependency)."""
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
        found[name] = {n for n in names if n.split(".")[0] in ("marl", "orchestration",
                                                               "populations")}
    return found


def test_layers_import_downwards_only():
    """orchestration < marl < populations < marl.cli (the application on top)."""
    upward = []
    for module, deps in {**imports("orchestration"), **imports("marl"),
                         **imports("populations")}.items():
        for dep in deps:
            top = dep.split(".")[0]
            if module.startswith("orchestration") and top != "orchestration":
                upward.append((module, dep))
            elif (module.startswith("marl") and not module.startswith("marl.cli")
                  and top == "populations"):
                upward.append((module, dep))
            elif module.startswith("populations") and dep.startswith("marl.cli"):
                upward.append((module, dep))
    assert upward == []


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_imports_from_its_old_path_with_a_warning(old):
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} has moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is new and module.__spec__.name == MOVED[old]


def test_the_new_paths_import_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for new in MOVED.values():
            importlib.import_module(new)
