"""The project's own errors. The CLI prints them without a traceback and exits non-zero."""

from __future__ import annotations

from dataclasses import dataclass


class MarlError(Exception):
    """An error whose message says what is wrong, why, and how to fix it."""


@dataclass(frozen=True)
class Problem:
    """One validation problem: a dotted key path (``topology.edges[2][1]``) and a message."""

    path: str
    message: str
    line: int | None = None

    def render(self, source: str | None = None) -> str:
        where = source or "<scenario>"
        if self.line is not None:
            where += f":{self.line}"
        return f"{where}: {self.path or '(root)'}: {self.message}"


class ScenarioError(MarlError):
    """A scenario file is malformed; ``problems`` lists every problem found."""

    def __init__(self, source: str | None, problems: list[Problem]):
        self.source = source
        self.problems = problems
        head = f"{source or 'scenario'} is not a valid scenario ({len(problems)} problem"
        head += "s):" if len(problems) != 1 else "):"
        super().__init__("\n".join([head, *("  " + p.render(source) for p in problems)]))

    def __reduce__(self):  # pickles across processes (sweep workers, Ray tasks)
        return type(self), (self.source, self.problems)


class ConfigError(MarlError):
    """A command-line option or configuration value is invalid."""
