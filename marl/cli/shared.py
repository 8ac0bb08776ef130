"""What every ``marl`` command shares: the consoles, the error guard, extra checks."""

from __future__ import annotations

import errno
import functools
import sys
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
        except OSError as exc:  # the machine's, not the input's: a full disk, a permission
            err.print(f"[bold red]error:[/] {escape(os_problem(exc))}", markup=True,
                      highlight=False)
            raise typer.Exit(2) from None

    return wrapper


def os_problem(exc: OSError) -> str:
    """What a failed file operation means for the user, and what to do."""
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return (f"the disk is full, or a file size limit was reached{where}: "
                f"{exc.strerror or exc}. Every file is written whole or not at all, so "
                "nothing complete was lost: free some space, then run the command again "
                "(`marl train --resume` continues from the last complete checkpoint).")
    return f"{exc.strerror or exc}{where}; check the path and its permissions."


def need_ray_extra(command: str = "marl population", extra: str = "ray",
                   modules: tuple[str, ...] = ("ray", "openskill")) -> None:
    """``marl population``, ``marl sweep --ray`` and ``marl baseline`` reach up into
    ``populations/`` (lazily: the one place in marl/ that does); they need an extra."""
    from importlib.util import find_spec

    missing = [name for name in modules if find_spec(name) is None]
    if missing:
        raise MarlError(f"{command} needs {' and '.join(missing)}: "
                        f"pip install -e '.[{extra}]'")


def split_rates(row: dict[str, Any]) -> dict[str, float]:
    """A row's eval success on held-out splits (``eval_<split>_success_rate``), by split.

    >>> split_rates({"eval_success_rate": 1.0, "eval_holdout_success_rate": 0.5})
    {'holdout': 0.5}
    """
    return {k.removeprefix("eval_").removesuffix("_success_rate"): v for k, v in row.items()
            if k.startswith("eval_") and k.endswith("_success_rate")
            and k != "eval_success_rate" and not isinstance(v, dict)}


def eval_text(row: dict[str, Any]) -> str:
    """`` | eval success 0.922, holdout 0.266`` for a row with an evaluation, else ''."""
    if "eval_success_rate" not in row:
        return ""
    return (f" | eval success {row['eval_success_rate']:.3f}"
            + "".join(f", {split} {v:.3f}" for split, v in split_rates(row).items()))


class progress_bar:
    """A progress bar on a terminal; otherwise the text of every ``every``-th update (and
    the last) as a plain line. The context gives ``tick(completed, text, total=None)``
    (``total``: a new length, for work that turned out shorter)."""

    def __init__(self, label: str, total: int, done: int = 0, every: int = 1,
                 transient: bool = True):
        self.label, self.total, self.done, self.every = label, total, done, every
        self.transient, self.bar = transient, None

    def __enter__(self) -> Callable[[int, str], None]:
        if sys.stderr.isatty():
            from rich.progress import Progress

            self.bar = Progress(*Progress.get_default_columns(), "{task.fields[text]}",
                                console=err, transient=self.transient)
            self.bar.start()
            task = self.bar.add_task(self.label, total=self.total, completed=self.done,
                                     text="")
            return lambda completed, text, total=None: self.bar.update(
                task, completed=completed, text=text, total=total or self.total)

        def tick(completed: int, text: str, total: int | None = None) -> None:
            self.total = total or self.total
            if completed % self.every == 0 or completed == self.total:
                err.print(text, highlight=False)

        return tick

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()
