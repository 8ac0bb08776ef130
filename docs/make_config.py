"""Write ``docs/config.md``, the reference of every setting, from the code that defines them.

    python docs/make_config.py           # rewrite docs/config.md
    python docs/make_config.py --check   # exit 1 if docs/config.md is out of date

The tables come from the pydantic models' fields (type, default, bounds, description) and,
for the tiny model's presets, from the dataclass's attribute docstrings; a test runs the
check, so the page cannot drift from the code.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "config.md"
sys.path.insert(0, str(ROOT))

HEADER = """# Configuration reference

Every setting, generated from the code by `python docs/make_config.py` (CI checks that this
page matches the code; do not edit it by hand). Defaults live in the typed classes; YAML
files hold only overrides, and `--set key=value` on the command line overrides both.
Unknown keys and bad values are errors that name the file, the line, the key and the
closest valid key. Why the training defaults are what they are:
[What the defaults learn from](learning.md).
"""


def sections() -> list[tuple[str, str, list[type]]]:
    """(title, where it is set, the classes) in the page's order."""
    from marl.algorithms.config import Stage, TrainConfig
    from marl.baseline.config import BaselineConfig
    from marl.policies.tiny_config import TinyConfig
    from marl.scenario import (
        AgentEntry,
        AnswerSpec,
        CostSpec,
        PolicySpec,
        ProtocolSpec,
        Scenario,
        TaskSpec,
        TeamSpec,
        TopologySpec,
    )
    from marl.tasks.dataset import DatasetParams
    from marl.tasks.verifiers import VerifierSpec
    from populations.config import LeagueConfig, PBTConfig, Range, Resources

    return [
        ("Scenario files", "`scenarios/*.yaml`; the format is explained in "
         "[scenarios.md](scenarios.md)",
         [Scenario, TaskSpec, AgentEntry, PolicySpec, TopologySpec, ProtocolSpec, AnswerSpec,
          TeamSpec, CostSpec]),
        ("The dataset task", "a scenario's `task: {name: dataset_v0, params: {...}}`; the "
         "task is described in [tasks.md](tasks.md#dataset-tasks)",
         [DatasetParams, VerifierSpec]),
        ("Training", "`marl train --config FILE --set key=value` (`configs/algorithm/*.yaml`, "
         "`configs/relay.yaml`)", [TrainConfig, Stage]),
        ("Populations", "`marl population pbt|league --config FILE --set key=value` "
         "(`configs/population/*.yaml`)", [PBTConfig, Range, Resources, LeagueConfig]),
        ("Classic MARL baseline", "`marl baseline --config FILE --set key=value`",
         [BaselineConfig]),
        ("Tiny model presets", "`configs/model/NAME.yaml`, named by a policy's `preset`",
         [TinyConfig]),
    ]


def type_name(tp: object) -> str:
    """A readable type: ``int | None``, ``"token" | "sequence"``, ``list[Stage]``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def bounds(metadata: Iterable[object]) -> str:
    """The field's constraints: ``≥ 0``, ``> 0, ≤ 1``, ``at least 1 item``."""
    words = []
    for m in metadata:
        for kind, attr, sign in ((at.Ge, "ge", "≥"), (at.Gt, "gt", ">"), (at.Le, "le", "≤"),
                                 (at.Lt, "lt", "<")):
            if isinstance(m, kind):
                words.append(f"{sign} {getattr(m, attr)}")
        if isinstance(m, at.MinLen):
            words.append(f"at least {m.min_length} item{'s' if m.min_length > 1 else ''}")
    return ", ".join(words)


def plain(value: object) -> object:
    """``value`` as YAML writes it: models, tuples and decimals as plain data."""
    if isinstance(value, BaseModel):  # written as its settings that differ from defaults
        return plain(value.model_dump(exclude_defaults=True))
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def shown(value: object) -> str:
    """A default as it would be written in YAML (JSON's flow style, which YAML reads)."""
    return f"`{json.dumps(plain(value), ensure_ascii=False)}`"


def model_rows(model: type[BaseModel]) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, f in model.model_fields.items():
        rows.append((name, f"`{type_name(f.annotation)}`", _default(f),
                     _text(f.description or "", f)))
    return rows


def _default(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    return shown(f.default_factory() if f.default_factory is not None else f.default)


def prose(text: str) -> str:
    """A docstring or description on one line, Sphinx roles as plain code."""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", " ".join(text.split()))


def _text(description: str, f: FieldInfo) -> str:
    limits = bounds(f.metadata)
    text = prose(description)
    return f"{text} ({limits})" if limits else text


def dataclass_rows(cls: type) -> list[tuple[str, str, str, str]]:
    """A dataclass's fields, described by the docstring written under each one."""
    docs = {}
    body = ast.parse(inspect.getsource(cls)).body[0].body
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)):
            docs[node.target.id] = prose(after.value.value)
    hints = typing.get_type_hints(cls)
    return [(f.name, f"`{type_name(hints[f.name])}`", shown(f.default), docs.get(f.name, ""))
            for f in dataclasses.fields(cls)]


def table(cls: type) -> str:
    rows = model_rows(cls) if issubclass(cls, BaseModel) else dataclass_rows(cls)
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t} | {d} | {m.replace('|', chr(92) + '|')} |" for k, t, d, m in rows]
    return "\n".join(lines)


def render() -> str:
    parts = [HEADER]
    for title, where, classes in sections():
        parts.append(f"## {title}\n\nSet in {where}.\n")
        for cls in classes:
            doc = prose(cls.__dict__.get("__doc__") or "")  # its own docstring, not inherited
            parts.append(f"### {cls.__name__}\n\n`{cls.__module__}.{cls.__name__}`"
                         + (f": {doc}" if doc else "") + f"\n\n{table(cls)}\n")
            if removed := getattr(cls, "removed", None):
                parts.append("Removed (a config that sets one is an error that says why):\n\n"
                             + "\n".join(f"- `{k}`: {why}." for k, why in removed.items())
                             + "\n")
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/config.md differs from the code")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python docs/make_config.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
