"""What every ``marl`` command shares: the consoles, the error guard, extra checks."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from marl.errors import MarlError

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print the project's own errors without a traceback and exit with status 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MarlError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, highlight=False)
            raise typer.Exit(2) from None

    return wrapper


def need_ray_extra(command: str = "marl population") -> None:
    """``marl population`` and ``marl sweep --ray`` reach up into ``populations/`` (lazily:
    the one place in marl/ that does); they need the ``ray`` extra."""
    from importlib.util import find_spec

    missing = [name for name in ("ray", "openskill") if find_spec(name) is None]
    if missing:
        raise MarlError(f"{command} needs {' and '.join(missing)}: "
                        "pip install -e '.[ray]'")
