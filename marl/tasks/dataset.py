"""dataset_v0: a team solves the problems of a local file, each checked by a verifier.

Data
    A JSONL, CSV or Parquet file of problems, one per row (``path``, split into ``train``,
    ``eval`` and any other named splits by ``fractions`` with ``split_seed``), or one file
    per split (``files``, with at least ``train`` and ``eval``). Relative paths are read from
    the working directory, as a policy's ``path`` is. JSONL and CSV are read with Python's
    ``json`` and ``csv`` modules, Parquet with pyarrow (``pip install -e '.[data]'``).
Agents
    Any team; the answer agents (or a vote) give the team's answer.
Private information
    ``private`` maps an agent id or a role to a template such as ``"Fact: {fact_1}"``: each
    ``{field}`` is replaced by the row's value (``{{`` and ``}}`` are literal braces;
    only plain field names, no attribute or index access). An agent gets its id's template,
    else its role's, else nothing; so a problem's information can be split across the team.
Messages
    Free-form text (``messages = "text"``): whatever an agent writes, up to its policy's
    ``max_new_tokens``, on one line or several.
Answer
    The answer agents' final message, scored against the row by the ``verifier``
    (:mod:`marl.tasks.verifiers`: ``exact``, ``numeric``, ``regex``, ``choice``,
    ``python``, ``unit_tests``); the reference is the row's ``answer`` field.
Reward
    The verifier's score in [0, 1]; success is a score of 1. A malformed row (a line that is
    not a JSON object, a missing or empty field a template or the answer needs), an answer
    the verifier cannot read, a test that fails to run: the episode scores 0 and its record
    says why (``score_reason``); the run goes on, and summaries count such episodes.
Random policy
    Form without meaning: a message is the agent's template filled from a random training
    row, an answer a random training row's reference answer. There is no scripted oracle.
Splits
    Training samples ``train``; evaluation (``eval_success_rate``) plays ``eval``, and each
    further split is reported as ``eval_<split>_success_rate``.

Version history
    v0: initial version.
"""

from __future__ import annotations

import csv
import functools
import json
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator, model_validator

from marl.errors import MarlError, Problem
from marl.tasks.base import Instance, Task, TaskParams, Verdict
from marl.tasks.verifiers import VerifierSpec, build_verifier, last_number, parse_verifier
from orchestration.hints import listing

#: A row: its fields, or why it is malformed.
Row = dict[str, Any] | str
READERS = (".jsonl", ".json", ".csv", ".parquet")


class DatasetParams(TaskParams):
    path: str | None = Field(None, description="One file of problems (.jsonl, .csv, "
                             ".parquet), split by fractions.")
    files: dict[str, str] = Field(default_factory=dict, description="One file per split "
                                  "instead of path, e.g. {train: a.jsonl, eval: b.jsonl}.")
    fractions: dict[str, float] = Field(
        default_factory=lambda: {"train": 0.8, "eval": 0.2},
        description="With path: the share of rows in each split (summing to 1).")
    split_seed: int = Field(0, ge=0, description="Seed of the split by fractions.")
    private: dict[str, str] = Field(description="Agent id or role -> template of what it "
                                    "privately reads, with {field} from the row.")
    answer: str = Field("answer", description="The row field holding the reference answer.")
    verifier: VerifierSpec = Field(default_factory=lambda: VerifierSpec(kind="exact"),
                                   description="How an answer is scored (a kind, or a "
                                   "mapping with kind and settings).")
    id_field: str | None = Field(None, description="A row field naming the problem in "
                                 "episode records (default: its split and row number).")

    @field_validator("verifier", mode="before")
    @classmethod
    def _kind_alone(cls, value: Any) -> Any:
        return parse_verifier(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_source(self) -> DatasetParams:
        if (self.path is None) == (not self.files):
            raise ValueError("give either path (one file, split by fractions) or files "
                             "(one file per split)")
        splits = self.files or self.fractions
        missing = [s for s in ("train", "eval") if s not in splits]
        if missing:
            raise ValueError(f"the splits {listing(list(splits))} lack {' and '.join(missing)}"
                             "; training samples train and evaluation plays eval")
        if self.path is not None and abs(sum(self.fractions.values()) - 1) > 1e-9:
            raise ValueError(f"fractions {self.fractions} must sum to 1")
        if any(f <= 0 for f in self.fractions.values()):
            raise ValueError(f"fractions {self.fractions} must all be positive")
        if not any(t.strip() for t in self.private.values()):
            raise ValueError("private gives no agent a template: give at least one agent or "
                             "role the fields it reads, e.g. {lead: 'Question: {question}'}")
        return self


def template_fields(template: str) -> list[str]:
    """The fields a template reads; only plain names are allowed.

    >>> template_fields("Fact: {fact_1}. {{literal}} {question}")
    ['fact_1', 'question']
    """
    fields = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if not re.fullmatch(r"\w+", name) or spec or conversion:
            raise ValueError(f"template field {{{name}{'!' + conversion if conversion else ''}"
                             f"{':' + spec if spec else ''}}} is not a plain field name; "
                             "write {field}, and {{ }} for literal braces")
        fields.append(name)
    return fields


def render(template: str, row: dict[str, Any]) -> str:
    """``template`` with each ``{field}`` replaced by the row's value (lists and mappings
    as JSON).

    >>> render("{a} and {{b}}: {c}", {"a": 1, "c": [2, 3]})
    '1 and {b}: [2, 3]'
    """
    values = {k: v if isinstance(v, str) else json.dumps(v) if isinstance(v, (list, dict))
              else str(v) for k, v in row.items()}
    return template.format_map(values)


@functools.lru_cache(maxsize=16)
def _read(path: Path, stamp: tuple[int, int]) -> tuple[Row, ...]:
    """Every row of a file (``stamp``: its modification time and size, so an edited file is
    read again)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise MarlError(f"reading {path} needs pyarrow: pip install -e '.[data]'") from None
        return tuple(pq.read_table(path).to_pylist())
    text = path.read_text(encoding="utf-8")
    if suffix == ".csv":
        rows: list[Row] = []
        for n, row in enumerate(csv.DictReader(text.splitlines()), 2):
            bad = None in row or any(v is None for v in row.values())
            rows.append(f"line {n} has {'more' if None in row else 'fewer'} fields than the "
                        "header" if bad else dict(row))
        return tuple(rows)
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            rows.append(f"line {n} is not JSON ({exc.msg})")
            continue
        rows.append(row if isinstance(row, dict) else f"line {n} is not a JSON object")
    return tuple(rows)


def read_rows(name: str) -> tuple[Row, ...]:
    """The rows of the file ``name`` (relative to the working directory); a file that
    cannot be read is a :class:`MarlError` naming it."""
    path = Path(name).expanduser()
    if path.suffix.lower() not in READERS:
        raise MarlError(f"{name}: unknown file type {path.suffix!r}; give a .jsonl, .csv or "
                        ".parquet file")
    try:
        stat = path.resolve().stat()
        return _read(path.resolve(), (stat.st_mtime_ns, stat.st_size))
    except FileNotFoundError:
        raise MarlError(f"{name}: file not found (relative paths are read from the working "
                        f"directory, {Path.cwd()})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MarlError(f"{name}: cannot be read: {exc}") from None
    except Exception as exc:  # pyarrow's errors on a damaged Parquet file
        raise MarlError(f"{name}: cannot be read as {path.suffix}: {exc}") from None


class Dataset(Task):
    id = "dataset_v0"
    Params = DatasetParams
    params: DatasetParams
    messages = "text"
    eval_split = "eval"

    def __init__(self, params: DatasetParams, agents: Sequence[str],
                 answer_agents: Sequence[str], sides: dict[str, Sequence[str]] | None = None,
                 roles: dict[str, str] | None = None):
        super().__init__(params, agents, answer_agents, sides, roles)
        self.problems: list[Problem] = []
        self._bad: dict[str, list[str | None]] = {}  # split -> why each row is malformed
        self.templates = {a: params.private.get(a, params.private.get(self.roles[a], ""))
                          for a in self.agents}
        self.rows: dict[str, list[Row]] = {}
        self.where: dict[str, str] = {}  # split -> the file its rows come from
        try:
            self.fields = sorted({f for t in params.private.values()
                                  for f in template_fields(t)})
            self._load()
            self.verify = build_verifier(params.verifier, params.answer)
        except (MarlError, ValueError) as exc:
            self.problems.append(Problem("task.params", str(exc)))
            return
        # train, eval, then any further split, in the order given
        order = ["train", "eval", *(s for s in self.rows if s not in ("train", "eval"))]
        self.rows = {s: self.rows[s] for s in order}
        self.splits = tuple(self.rows)
        self._bad = {s: [self._malformed(r) for r in rows] for s, rows in self.rows.items()}

    def _load(self) -> None:
        p = self.params
        if p.files:
            for split, name in p.files.items():
                self.rows[split], self.where[split] = list(read_rows(name)), name
            return
        rows = list(read_rows(p.path))
        order = np.random.default_rng(p.split_seed).permutation(len(rows))
        start = 0
        for i, (split, share) in enumerate(p.fractions.items()):
            end = len(rows) if i == len(p.fractions) - 1 else start + round(share * len(rows))
            self.rows[split] = [rows[j] for j in sorted(order[start:end])]
            self.where[split] = p.path
            start = end
        empty = [s for s, r in self.rows.items() if not r]
        if empty:
            raise MarlError(f"{p.path} has {len(rows)} rows, which leaves the splits "
                            f"{listing(empty)} empty; give it more rows or other fractions")

    def _malformed(self, row: Row) -> str | None:
        """Why a row cannot be played (None: it can)."""
        if isinstance(row, str):
            return row
        missing = [f for f in [*self.fields, self.params.answer]
                   if row.get(f) is None or row.get(f) == ""]
        return f"missing field {listing(missing)}" if missing else None

    def check(self) -> list[Problem]:
        unknown = sorted(set(self.params.private) - set(self.agents) - set(self.roles.values()))
        if unknown:
            self.problems.append(Problem("task.params.private", f"{listing(unknown)} is "
                                         "neither an agent id nor a role of this team; agents: "
                                         f"{listing(list(self.agents))}, roles: "
                                         f"{listing(sorted(set(self.roles.values())))}."))
        for split, bad in self._bad.items():
            if all(bad):
                self.problems.append(Problem("task.params", f"every row of split {split!r} "
                                             f"({self.where[split]}) is malformed, e.g. "
                                             f"{bad[0]}; check the file and the fields the "
                                             "templates and the answer name."))
        return self.problems

    def describe(self) -> str:
        sizes = ", ".join(f"{s} {len(r)}" for s, r in self.rows.items())
        bad = sum(x is not None for b in self._bad.values() for x in b)
        return f"{sum(map(len, self.rows.values()))} rows ({sizes})" + (
            f", {bad} malformed (scored 0 when drawn)" if bad else "")

    def required_sources(self) -> set[str]:
        return {a for a, t in self.templates.items() if template_fields(t)}

    def draw(self, rng: np.random.Generator, split: str = "train") -> Instance:
        if split not in self.rows:
            return super().draw(rng, split)  # the base class's error
        index = int(rng.integers(len(self.rows[split])))
        row = self.rows[split][index]
        values = row if isinstance(row, dict) else {}
        private = {a: render(t, {f: values.get(f, "") for f in template_fields(t)})
                   for a, t in self.templates.items()}
        ref = values.get(self.params.answer)
        name = values.get(self.params.id_field) if self.params.id_field else None
        data = {"split": split, "row": index, "id": f"{split}:{index}" if name is None
                else str(name)}
        return Instance(private, "" if ref is None else str(ref), data)

    def sample(self, rng: np.random.Generator) -> Instance:
        return self.draw(rng, "train")

    def verdict(self, instance: Instance, answer: str) -> Verdict:
        split, index = instance.data["split"], instance.data["row"]
        bad = self._bad[split][index]
        if bad is not None:
            return Verdict(0.0, f"malformed row {index} of split {split!r} "
                                f"({self.where[split]}): {bad}", 0.0)
        return self.verify(answer, self.rows[split][index])

    def score(self, instance: Instance, answer: str) -> float:
        return self.verdict(instance, answer).score

    def _good_train(self, rng: np.random.Generator) -> dict[str, Any]:
        good = [i for i, b in enumerate(self._bad["train"]) if b is None]
        return self.rows["train"][good[int(rng.integers(len(good)))]]

    def random_message(self, agent: str, final: bool, rng: np.random.Generator) -> str:
        row = self._good_train(rng)
        if final:
            return str(row[self.params.answer])
        template = self.templates[agent] or next(t for t in self.templates.values() if t)
        return render(template, row)

    def valid_message(self, agent: str, message: str, final: bool) -> bool:
        if final and self.params.verifier.kind == "numeric":
            return last_number(message) is not None
        return bool(message.strip())

    def private_extremes(self) -> dict[str, tuple[str, str]]:
        out = {}
        for agent, template in self.templates.items():
            texts = [render(template, {f: r.get(f, "") for f in template_fields(template)})
                     if isinstance(r, dict) else render(template, {
                         f: "" for f in template_fields(template)})
                     for rows in self.rows.values() for r in rows]
            out[agent] = (min(texts, key=len), max(texts, key=len))
        return out
