"""Atomic file and directory writes: a reader sees the old version or the new one, never
half of either; one home for every writer in the project."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from marl.errors import MarlError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: The process's umask, read once (reading it means setting it, which threads would race).
UMASK = _umask()


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, fsync it, then rename it over."""
    return atomic_write_lines(path, [text])


def atomic_write_lines(path: str | Path, chunks: Iterable[str]) -> Path:
    def write(f: Any) -> None:
        for chunk in chunks:
            f.write(chunk)

    return _atomic(path, "w", write)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Binary twin of :func:`atomic_write_text` (images)."""
    return _atomic(path, "wb", lambda f: f.write(data))


def _atomic(path: str | Path, mode: str, write: Callable[[Any], Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~UMASK)  # mkstemp makes 0600: give the usual permissions
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # the rename itself survives a power cut
    return path


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every directory, deepest first."""
    dirs = []
    for here, _, files in os.walk(root):
        dirs.append(Path(here))
        for name in files:
            fd = os.open(Path(here) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for d in reversed(dirs):
        fsync_dir(d)


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def atomic_write_jsonl(path: str | Path, rows: Iterable[Any]) -> Path:
    return atomic_write_lines(path, (json.dumps(r) + "\n" for r in rows))


def append_jsonl(path: str | Path, row: Any) -> None:
    """Append one JSON line whole or not at all: a single ``write`` on an ``O_APPEND``
    descriptor, then fsync. A short or failed write (a full disk) is cut back off before
    the error is raised; only a machine dying mid-write can leave a cut-off last line,
    which :func:`read_jsonl` drops."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(row) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"only {written} of {len(data)} bytes written",
                              str(path))
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def atomic_dir(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)`` on a fresh directory beside ``path``, then swap it into place.

    A crash while writing leaves ``path`` as it was (the half-written directory is
    removed); a crash between the two renames leaves the old version under a hidden
    ``.NAME.*.old`` name beside it, never a mix of the two.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp.chmod(0o777 & ~UMASK)
    old = tmp.with_suffix(".old")
    try:
        write(tmp)
        fsync_tree(tmp)  # every file on disk before the rename makes it visible
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not path.exists():
            os.replace(old, path)
        raise
    fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)
    return path


def recover(root: Path) -> list[str]:
    """Finish what a killed :func:`atomic_dir` or :func:`atomic_write_text` left in ``root``:
    an old version caught between its two renames goes back into place (nothing newer
    made it), half-written temporaries are removed. Returns what was done, a line each."""
    done = []
    if not root.is_dir():
        return done
    for entry in sorted(root.glob(".*.old")):
        name = entry.name[1:].removesuffix(".old").rsplit(".", 1)[0]
        if not (root / name).exists():
            os.replace(entry, root / name)
            done.append(f"restored {root / name} (a write of it was interrupted)")
        else:
            shutil.rmtree(entry, ignore_errors=True)
    for entry in sorted(root.glob(".*.tmp")):
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        done.append(f"removed {entry.name}, left half-written by an interrupted run")
    return done


def read_jsonl(path: Path, log: Callable[[str], None] | None = None,
               repair: bool = False) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file. A last line cut short by a kill is dropped (and
    reported to ``log``). A damaged line in the middle is an error, unless ``repair``:
    then it is dropped too, keeping a whole row that a later append glued onto its end."""
    if not path.exists():
        return []
    rows = []
    lines = path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
            continue
        except json.JSONDecodeError:
            pass
        last = i == len(lines) - 1
        if not (last or repair):
            raise MarlError(f"{path}:{i + 1} is not valid JSON; the file is corrupt beyond "
                            "its last line (`marl train --resume` repairs a run's "
                            "metrics.jsonl).")
        glued = _glued_row(line, next(iter(rows[0]), None) if rows else None)
        if glued is not None:
            rows.append(glued)
        if log is not None:
            log(f"{path}:{i + 1}: dropped a {'cut-off last' if last else 'damaged'} line"
                + (" (kept the whole row after it)" if glued is not None else ""))
    return rows


def _glued_row(line: str, first_key: str | None) -> Any:
    """The whole row at the end of a damaged line, if one was appended onto it: a JSON
    object that starts with the same key as the file's rows (not a mapping nested in the
    cut-off row)."""
    if first_key is None:
        return None
    start = line.find("{", 1)
    while start != -1:
        try:
            row = json.loads(line[start:])
            if isinstance(row, dict) and next(iter(row), None) == first_key:
                return row
        except json.JSONDecodeError:
            pass
        start = line.find("{", start + 1)
    return None
