"""A response cache for API policies (``marl run --cache DIR``): one JSON file per response,
named by the hash of what was asked, so re-running a command costs nothing and replays
the same episodes.

The key is the sha256 of the canonical JSON (sorted keys, no spaces) of the request body
together with the endpoint: the model, the messages or prompt, and every sampling setting
including the per-request seed. A request sampled at temperature > 0 is cached too, so a
cached response fixes that sample: reruns are reproducible even where the server is not.
The key is never part of the body, so cache files hold no secret. The cache holds at most
``max_bytes`` on disk: past it, the least recently used responses are removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from marl.io import atomic_write_text


def request_key(base_url: str, body: dict[str, Any]) -> str:
    """The cache key of a request.

    >>> request_key("http://h/v1", {"b": 1, "a": [2]}) == request_key("http://h/v1",
    ...                                                              {"a": [2], "b": 1})
    True
    """
    text = json.dumps({"base_url": base_url.rstrip("/"), "body": body}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


#: The default size cap of a response cache on disk.
MAX_BYTES = 2 * 2**30


class ResponseCache:
    """Responses under ``root/<first two hex digits>/<key>.json``, written atomically
    (parallel requests and killed runs never leave half a file), at most ``max_bytes`` in
    all: a response read is marked used (its mtime), and a write past the cap removes the
    least recently used ones down to 90% of it."""

    def __init__(self, root: str | Path, max_bytes: int = MAX_BYTES):
        self.root, self.max_bytes = Path(root), max_bytes
        self._size: int | None = None  # bytes on disk, counted at the first write
        self._last_ns = 0

    def _touch(self, path: Path) -> None:
        """Mark ``path`` used now: its mtime, strictly later than any marked before in
        this process (a coarse clock would tie, and eviction would pick by chance)."""
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        os.utime(path, ns=(self._last_ns, self._last_ns))

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any | None:
        """The stored response, or None when there is none (or it cannot be read: the
        request is then sent again and the file rewritten)."""
        path = self._path(key)
        try:
            response = json.loads(path.read_text())["response"]
            self._touch(path)
            return response
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, base_url: str, body: dict[str, Any], response: Any) -> None:
        text = json.dumps({"base_url": base_url, "request": body, "response": response},
                          indent=2) + "\n"
        size = len(text.encode())
        if size > self.max_bytes:
            return  # larger than the whole cache: not kept
        path = self._path(key)
        if self._size is None:
            self._size = sum(f.stat().st_size for f in self._files())
        self._size -= path.stat().st_size if path.is_file() else 0
        if self._size + size > self.max_bytes:
            self._evict(self.max_bytes * 9 // 10 - size)
        atomic_write_text(path, text)
        self._touch(path)
        self._size += size

    def _files(self) -> list[Path]:
        return list(self.root.glob("??/*.json"))

    def _evict(self, target: int) -> None:
        """Remove the least recently used responses until at most ``target`` bytes remain."""
        aged = []
        for f in self._files():
            try:
                st = f.stat()
            except OSError:
                continue
            aged.append((st.st_mtime_ns, st.st_size, f))
        aged.sort()
        total = sum(size for _, size, _ in aged)
        for _, size, f in aged:
            if total <= target:
                break
            f.unlink(missing_ok=True)
            total -= size
        self._size = total
