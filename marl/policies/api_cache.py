"""A response cache for API policies (``marl run --cache DIR``): one JSON file per response,
named by the hash of what was asked, so re-running a command costs nothing and replays
the same episodes.

The key is the sha256 of the canonical JSON (sorted keys, no spaces) of the request body
together with the endpoint: the model, the messages or prompt, and every sampling setting
including the per-request seed. A request sampled at temperature > 0 is cached too, so a
cached response fixes that sample: reruns are reproducible even where the server is not.
The key is never part of the body, so cache files hold no secret.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from marl.io import atomic_write_json


def request_key(base_url: str, body: dict[str, Any]) -> str:
    """The cache key of a request.

    >>> request_key("http://h/v1", {"b": 1, "a": [2]}) == request_key("http://h/v1",
    ...                                                              {"a": [2], "b": 1})
    True
    """
    text = json.dumps({"base_url": base_url.rstrip("/"), "body": body}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


class ResponseCache:
    """Responses under ``root/<first two hex digits>/<key>.json``, written atomically
    (parallel requests and killed runs never leave half a file)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any | None:
        """The stored response, or None when there is none (or it cannot be read: the
        request is then sent again and the file rewritten)."""
        try:
            return json.loads(self._path(key).read_text())["response"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, base_url: str, body: dict[str, Any], response: Any) -> None:
        atomic_write_json(self._path(key), {"base_url": base_url, "request": body,
                                            "response": response})
