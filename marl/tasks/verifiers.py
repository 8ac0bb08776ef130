"""Verifiers: score a team's answer against one dataset row.

A dataset task names a verifier in its scenario (``verifier: exact``, or a mapping with
``kind:`` and the settings below). :func:`build_verifier` checks the settings once, when the
scenario is validated, and returns ``verify(answer, row) -> Verdict``. ``verify`` never
raises: a row without the reference field, an answer it cannot read, a ``python`` function
that raises, a test that fails or crashes, each gives a score of 0 and a ``reason``.

Kinds
    ``exact``
        The answer equals the reference ``row[answer_field]`` (a non-string reference is
        compared as ``str(value)``). ``normalize`` (default true) first casefolds both,
        strips them, collapses runs of whitespace and drops one trailing period.
    ``numeric``
        The last number in the answer (``-1,234.5``, ``.5``, ``1e-6``; commas between
        digit groups are dropped) is within ``tolerance`` (absolute, default 1e-6) or
        ``relative`` (times the larger magnitude, default 0) of the reference: a number,
        or a string whose last number is taken (so GSM8K's ``... #### 72`` works).
        Fractions and percentages are not interpreted: ``3/4`` reads as 4, ``50%`` as 50.
    ``regex``
        ``pattern`` must match the whole answer (``re.fullmatch``). ``{answer}`` in it is
        replaced by the reference, escaped, so it matches literally: ``(?i)\\s*{answer}\\.?``.
        Flags go inline (``(?i)``); quantify the reference as a group: ``(?:{answer})+``.
    ``choice``
        ``row[choices_field]`` (default ``choices``) lists the options. The answer is the
        option's letter (``B``, ``(B)``, ``B)``, ``B.``, in either case) or its text
        (normalised as for ``exact`` when ``normalize``). The reference is a letter, an
        option's text, or an integer: the 0-based index (MMLU's convention). An answer
        that names no option scores 0 with a reason; a different option, 0 without one.
    ``python``
        ``function`` is ``"package.module:function"``, called as ``function(answer, row)``
        and returning a bool or a number in [0, 1] (partial credit). It is imported when
        the verifier is built, so a missing module or attribute fails at validation. It
        runs in the calling thread with no time limit: it is the scenario author's code,
        so bound its work (math checkers with their own ``signal``-based timeouts keep
        working there).
    ``unit_tests``
        The answer is Python source (a surrounding ```` ```python ```` fence is dropped);
        ``row[tests_field]`` (default ``tests``; a string, or a list of strings joined by
        newlines, as in MBPP) is Python run after it, usually asserts. Exit without error
        scores 1. The solution runs as module ``solution`` (its ``if __name__ ==
        "__main__"`` block does not run); the tests run as ``__main__`` with the solution's
        names in scope, so ``unittest.main()`` works and ``sys.exit(0)`` from the tests
        passes. A HumanEval row, whose tests only define ``check``, needs ``check(name)``
        appended by the data loader.

The ``unit_tests`` sandbox
    See :mod:`marl.tasks.sandbox`: a separate ``python -s -S`` process in a fresh folder,
    with resource and wall-clock limits and an audit-hook guard against network access,
    starting programs and writes outside the folder. It guards against accidents and
    careless model output; it is not a security boundary against hostile code.

Version history
    v0: initial version.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from inspect import signature
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from marl.errors import MarlError
from marl.tasks.base import Verdict
from marl.tasks.sandbox import run_tests
from orchestration.hints import did_you_mean, listing

Kind = Literal["exact", "numeric", "regex", "choice", "python", "unit_tests"]

# kind -> the settings it reads; setting any other is an error
SETTINGS: dict[str, frozenset[str]] = {
    "exact": frozenset({"normalize"}),
    "numeric": frozenset({"tolerance", "relative"}),
    "regex": frozenset({"pattern"}),
    "choice": frozenset({"normalize", "choices_field"}),
    "python": frozenset({"function"}),
    "unit_tests": frozenset({"tests_field", "time_limit_s", "memory_mb"}),
}
_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class VerifierSpec(BaseModel):
    """Which verifier scores the answers, and its settings; ``"exact"`` alone also parses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind = Field(description="How to score: exact, numeric, regex, choice, python, "
                                   "unit_tests.")
    normalize: bool = Field(True, description="exact, choice: casefold, strip, collapse "
                                              "whitespace, drop a trailing period.")
    tolerance: float = Field(1e-6, ge=0, description="numeric: absolute tolerance.")
    relative: float = Field(0.0, ge=0, description="numeric: relative tolerance.")
    pattern: str | None = Field(None, description="regex: fullmatch pattern; {answer} is the "
                                                  "escaped reference.")
    choices_field: str = Field("choices", description="choice: the row field listing the "
                                                      "options.")
    function: str | None = Field(None, description="python: 'package.module:function' of "
                                                   "(answer, row) -> bool or [0, 1].")
    tests_field: str = Field("tests", description="unit_tests: the row field holding the "
                                                  "test code.")
    time_limit_s: float = Field(5.0, gt=0, le=300, description="unit_tests: wall-clock "
                                                               "seconds per answer.")
    memory_mb: int = Field(256, ge=32, le=65536, description="unit_tests: address-space "
                                                            "limit in MB.")

    @model_validator(mode="before")
    @classmethod
    def _bare_kind(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _settings_apply(self) -> VerifierSpec:
        stray = sorted(self.model_fields_set - SETTINGS[self.kind] - {"kind"})
        if stray:
            owners = {name: [k for k, names in SETTINGS.items() if name in names]
                      for name in stray}
            raise ValueError("; ".join(
                f"verifier.{name} does not apply to kind {self.kind!r} (it is a setting of "
                f"{listing(owners[name])}); remove it or change verifier.kind"
                for name in stray))
        needed = {"regex": "pattern", "python": "function"}.get(self.kind)
        if needed and getattr(self, needed) is None:
            raise ValueError(f"verifier.{needed} is required for kind {self.kind!r}")
        if self.function is not None and not _FUNCTION.fullmatch(self.function):
            raise ValueError(f"verifier.function {self.function!r} must have the form "
                             "'package.module:function'")
        return self


Check = Callable[[str, Mapping[str, Any]], tuple[float, str | None]]


class _Unscorable(Exception):
    """The answer cannot be scored; the message is the verdict's reason."""


def parse_verifier(value: str | Mapping[str, Any] | VerifierSpec) -> VerifierSpec:
    """A spec from a bare kind or a mapping; pydantic's ValidationError names what is wrong.

    >>> parse_verifier("numeric").tolerance
    1e-06
    >>> parse_verifier({"kind": "regex", "pattern": "{answer}"}).pattern
    '{answer}'
    """
    return VerifierSpec.model_validate(value)


def build_verifier(spec: VerifierSpec,
                   answer_field: str) -> Callable[[str, Mapping[str, Any]], Verdict]:
    """``verify(answer, row) -> Verdict`` for ``spec``; the reference is ``row[answer_field]``.

    Configuration errors (a bad regex, a ``python`` function that cannot be imported) raise
    :class:`MarlError` here; ``verify`` itself never raises.

    >>> verify = build_verifier(parse_verifier("exact"), "answer")
    >>> verify(" Paris. ", {"answer": "paris"}).score
    1.0
    >>> verify("Lyon", {"answer": "paris"})[:2]
    (0.0, None)
    >>> verify("Lyon", {"question": "capital?"}).reason
    "row has no 'answer' field"
    """
    check = _CHECKS[spec.kind](spec, answer_field)

    def verify(answer: str, row: Mapping[str, Any]) -> Verdict:
        start = time.perf_counter()
        try:
            score, reason = check(answer, row)
        except _Unscorable as exc:
            score, reason = 0.0, str(exc)
        except Exception as exc:  # a user function, or data the checks did not foresee
            score, reason = 0.0, _clip(f"verifier raised {type(exc).__name__}: {exc}", 300)
        return Verdict(score, reason, time.perf_counter() - start)

    return verify


def normalize_text(text: str) -> str:
    """Casefold, strip, collapse whitespace and drop one trailing period.

    >>> normalize_text("  The  Capital is\\nPARIS. ")
    'the capital is paris'
    """
    text = " ".join(text.casefold().split())
    return text[:-1].rstrip() if text.endswith(".") else text


_NUMBER = re.compile(
    r"(?:(?<![\w.])[-+])?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def last_number(text: str) -> float | None:
    """The last number in ``text`` (commas between digit groups dropped), or None.

    >>> last_number("3 apples cost -1,234.5 dollars")
    -1234.5
    >>> last_number("#### 72"), last_number("3/4"), last_number("2024-05"), last_number("none")
    (72.0, 4.0, 5.0, None)
    """
    found = _NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def strip_fence(text: str) -> str:
    """The code inside a Markdown fence that surrounds all of ``text``, or ``text`` itself.

    >>> strip_fence("```python\\nx = 1\\n```\\n")
    'x = 1\\n'
    >>> strip_fence("x = 1")
    'x = 1'
    """
    body = text.strip()
    if body.startswith("```") and body.endswith("```") and "\n" in body:
        return body[body.index("\n") + 1:-3]
    return text


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _field(row: Mapping[str, Any], name: str) -> Any:
    value = row.get(name)
    if value is None:
        raise _Unscorable(f"row has no {name!r} field")
    return value


def _items(row: Mapping[str, Any], name: str) -> list[Any]:
    """A list-valued row field (a list, tuple or array), else a reason naming the field."""
    value = _field(row, name)
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise _Unscorable(f"row field {name!r} must be a list, got {type(value).__name__} "
                          "(decode it when loading the data)")
    return list(value)


def _exact(spec: VerifierSpec, answer_field: str) -> Check:
    def check(answer: str, row: Mapping[str, Any]) -> tuple[float, str | None]:
        reference = str(_field(row, answer_field))
        if spec.normalize:
            answer, reference = normalize_text(answer), normalize_text(reference)
        return float(answer == reference), None

    return check


def _numeric(spec: VerifierSpec, answer_field: str) -> Check:
    """The last number of the answer against the reference, within the tolerances.

    >>> verify = build_verifier(parse_verifier("numeric"), "answer")
    >>> verify("so the total is 1,000", {"answer": "1000"}).score
    1.0
    >>> verify("about 0.3", {"answer": 1 / 3})[:2], verify("many", {"answer": 3})[:2]
    ((0.0, None), (0.0, "unparsable number 'many'"))
    """
    def check(answer: str, row: Mapping[str, Any]) -> tuple[float, str | None]:
        reference = _field(row, answer_field)
        expected = (float(reference) if isinstance(reference, numbers.Real)
                    else last_number(str(reference)))
        if expected is None:
            raise _Unscorable(f"reference {_clip(str(reference))!r} holds no number")
        got = last_number(answer)
        if got is None:
            raise _Unscorable(f"unparsable number {_clip(answer)!r}")
        return float(math.isclose(got, expected, rel_tol=spec.relative,
                                  abs_tol=spec.tolerance)), None

    return check


def _regex(spec: VerifierSpec, answer_field: str) -> Check:
    """The pattern, with the escaped reference for ``{answer}``, fullmatches the answer.

    >>> spec = parse_verifier({"kind": "regex", "pattern": r"(?i)the answer is {answer}\\.?"})
    >>> verify = build_verifier(spec, "answer")
    >>> verify("The answer is 3.5.", {"answer": "3.5"}).score, verify("3x5", {"answer": "3.5"})[0]
    (1.0, 0.0)
    """
    pattern = spec.pattern
    try:
        re.compile(pattern.replace("{answer}", "x"))
    except re.error as exc:
        raise MarlError(f"verifier.pattern {pattern!r} is not a valid regular expression: "
                        f"{exc}; fix the pattern ({{answer}} stands for the escaped "
                        "reference)") from None

    def check(answer: str, row: Mapping[str, Any]) -> tuple[float, str | None]:
        full = pattern
        if "{answer}" in pattern:
            full = pattern.replace("{answer}", re.escape(str(_field(row, answer_field))))
        return float(re.fullmatch(full, answer) is not None), None

    return check


_LETTER = re.compile(r"\(?([A-Za-z])\)?\.?")


def _option(value: Any, options: list[str], normalize: bool) -> int | None:
    """The index of the option ``value`` names (letter, text, or 0-based int), or None."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value) if 0 <= value < len(options) else None
    text = str(value).strip()
    letter = _LETTER.fullmatch(text)
    if letter and ord(letter[1].upper()) - ord("A") < len(options):
        return ord(letter[1].upper()) - ord("A")
    same = normalize_text if normalize else str
    texts = [same(option) for option in options]
    return texts.index(same(text)) if same(text) in texts else None


def _choice(spec: VerifierSpec, answer_field: str) -> Check:
    """The answer names, by letter or text, the option the reference names.

    >>> verify = build_verifier(parse_verifier("choice"), "answer")
    >>> row = {"choices": ["Lyon", "Paris", "Nice"], "answer": "B"}
    >>> verify("(b)", row)[0], verify("paris", row)[0], verify("A", row)[:2]
    (1.0, 1.0, (0.0, None))
    >>> verify("Berlin", row).reason
    "answer 'Berlin' is neither an option's letter (A-C) nor its text"
    """
    def check(answer: str, row: Mapping[str, Any]) -> tuple[float, str | None]:
        options = [str(option) for option in _items(row, spec.choices_field)]
        reference = _field(row, answer_field)
        right = _option(reference, options, spec.normalize)
        if right is None:
            raise _Unscorable(f"reference {_clip(str(reference))!r} names none of the "
                              f"{len(options)} options in {spec.choices_field!r}")
        picked = _option(answer, options, spec.normalize)
        if picked is None:
            last = chr(ord("A") + min(len(options), 26) - 1)
            raise _Unscorable(f"answer {_clip(answer)!r} is neither an option's letter "
                              f"(A-{last}) nor its text")
        return float(picked == right), None

    return check


def _load_function(ref: str) -> Callable[..., Any]:
    """Import ``module:attr`` or raise a MarlError saying which part failed and the fix."""
    module_name, _, attr = ref.partition(":")
    head = f"verifier.function {ref!r}"
    try:
        module = import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name + ".").startswith(exc.name + "."):
            raise MarlError(f"{head}: module {module_name!r} not found; install the package "
                            "or put its folder on PYTHONPATH") from None
        raise MarlError(f"{head}: importing {module_name!r} failed: {exc}; install what it "
                        "needs") from exc
    except Exception as exc:
        raise MarlError(f"{head}: importing {module_name!r} raised {type(exc).__name__}: "
                        f"{exc}; fix the module") from exc
    try:
        function = getattr(module, attr)
    except AttributeError:
        names = [name for name in vars(module) if not name.startswith("_")]
        raise MarlError(f"{head}: module {module_name!r} has no attribute {attr!r}."
                        f"{did_you_mean(attr, names)}") from None
    if not callable(function):
        raise MarlError(f"{head}: {attr!r} is a {type(function).__name__}, not a function; "
                        "name a function of (answer, row)")
    try:
        signature(function).bind("answer", {})
    except TypeError as exc:
        raise MarlError(f"{head}: it cannot be called as function(answer, row): {exc}; give "
                        "it two positional parameters") from None
    except ValueError:  # no signature to inspect (some builtins): find out when it is called
        pass
    return function


def _python(spec: VerifierSpec, answer_field: str) -> Check:
    function = _load_function(spec.function)

    def check(answer: str, row: Mapping[str, Any]) -> tuple[float, str | None]:
        result = function(answer, dict(row))
        if isinstance(result, bool):
            return float(result), None
        if isinstance(result, numbers.Real) and 0 <= result <= 1:
            return float(result), None
        raise _Unscorable(f"verifier.function returned {_clip(repr(result))} "
                          f"({type(result).__name__}), not a bool or a number in [0, 1]")

    return check


def _unit_tests(spec: VerifierSpec, answer_field: str) -> Check:
    if os.name != "posix" or not sys.executable:
        raise MarlError(f"verifier.kind 'unit_tests' needs a POSIX system and a Python "
                        f"executable (platform {sys.platform!r}, sys.executable "
                        f"{sys.executable!r}); run it on Linux or macOS")

    def check(answer: str, row: Mapping[str, Any]) -> tuple[float, str | None]:
        tests = _field(row, spec.tests_field)
        if not isinstance(tests, str):
            lines = _items(row, spec.tests_field)
            if not all(isinstance(line, str) for line in lines):
                raise _Unscorable(f"row field {spec.tests_field!r} must be Python code: a "
                                  "string or a list of strings")
            tests = "\n".join(lines)
        return run_tests(strip_fence(answer), tests, spec.time_limit_s, spec.memory_mb)

    return check


_CHECKS: dict[str, Callable[[VerifierSpec, str], Check]] = {
    "exact": _exact, "numeric": _numeric, "regex": _regex, "choice": _choice,
    "python": _python, "unit_tests": _unit_tests,
}
