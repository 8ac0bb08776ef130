"""Small helpers for error messages: closest-match suggestions and short listings."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any


def did_you_mean(value: Any, choices: Sequence[Any]) -> str:
    """`` Did you mean 'x'?`` for the closest choice, or an empty string.

    >>> did_you_mean("hubb", ["hub", "kind"])
    " Did you mean 'hub'?"
    """
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def listing(names: Sequence[Any], limit: int = 10) -> str:
    """Comma-separated reprs, truncated after ``limit`` names.

    >>> listing(["a", "b"])
    "'a', 'b'"
    >>> listing([str(i) for i in range(12)], limit=2)
    "'0', '1', … (12 in all)"
    """
    shown = ", ".join(repr(name) for name in names[:limit])
    return shown + (f", … ({len(names)} in all)" if len(names) > limit else "")
