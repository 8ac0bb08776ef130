"""A small OpenAI-compatible server for tests: chat and completions on 127.0.0.1, in a
thread, with scripted replies, its own usage counts and injectable faults. Nothing leaves
the machine.

``reply(prompt) -> str`` gives the text. ``fault(n, body) -> Fault | None`` may replace
the n-th request's answer (n counts from 0) by an HTTP status (with headers), a body that
is not JSON, a response that lacks the expected fields, a dropped connection or a delay.
The server bills in its own units (one token per word of the prompt, plus a chat
template's 5 tokens; one per two characters of the reply, rounded up), deliberately not
the character counts the environment would make, and reports a third of the prompt as
cached, so a test can tell billed usage from our own counts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Fault:
    kind: str  # status | malformed | empty | drop | slow
    status: int = 500
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def prompt_of(body: dict[str, Any]) -> str:
    return body["messages"][-1]["content"] if "messages" in body else body["prompt"]


def usage_of(prompt: str, text: str, chat: bool) -> dict[str, Any]:
    prompt_tokens = len(prompt.split()) + (5 if chat else 0)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": (len(text) + 1) // 2,
            "total_tokens": prompt_tokens + (len(text) + 1) // 2,
            "prompt_tokens_details": {"cached_tokens": prompt_tokens // 3}}


class FakeOpenAI:
    """Start with ``with FakeOpenAI(reply) as server:``; ``server.url`` is the base URL."""

    def __init__(self, reply: Callable[[str], str] = lambda prompt: "a",
                 fault: Callable[[int, dict[str, Any]], Fault | None] | None = None,
                 bill: Callable[[str, str, bool], dict[str, Any]] = usage_of):
        self.reply, self.fault, self.bill = reply, fault or (lambda n, body: None), bill
        self.requests: list[dict[str, Any]] = []  # every request body, in arrival order
        self.headers: list[dict[str, str]] = []
        self.billed = {"prompt": 0, "cached": 0, "completion": 0}  # usage of 200 answers
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()  # wakes slow handlers
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, path: str, body: dict[str, Any], headers: dict[str, str]
               ) -> tuple[int, dict[str, str], bytes] | Fault:
        with self.lock:
            n = len(self.requests)
            self.requests.append(body)
            self.headers.append(headers)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return self._answer(n, path, body)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _answer(self, n: int, path: str, body: dict[str, Any]
                ) -> tuple[int, dict[str, str], bytes] | Fault:
        fault = self.fault(n, body)
        if fault is not None and fault.kind != "slow":
            return fault
        if fault is not None:
            self.stop.wait(fault.delay_s)
        chat = path.endswith("/chat/completions")
        text = self.reply(prompt_of(body))
        usage = self.bill(prompt_of(body), text, chat)
        with self.lock:
            for k, key in (("prompt", "prompt_tokens"), ("completion", "completion_tokens")):
                self.billed[k] += usage[key]
            self.billed["cached"] += usage["prompt_tokens_details"]["cached_tokens"]
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                  else {"index": 0, "text": text})
        data = {"id": f"cmpl-{n}", "object": "chat.completion" if chat else "text_completion",
                "model": body["model"], "choices": [{**choice, "finish_reason": "stop"}],
                "usage": usage}
        return 200, {}, json.dumps(data).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                got = server.answer(self.path, json.loads(raw), dict(self.headers))
                if isinstance(got, Fault):
                    if got.kind == "drop":
                        self.close_connection = True  # no response at all
                        return
                    status, headers = got.status, got.headers
                    body = {"malformed": b'{"choices": [', "empty": b'{"choices": []}'}.get(
                        got.kind, b'{"error": {"message": "injected fault"}}')
                    status = 200 if got.kind in ("malformed", "empty") else status
                else:
                    status, headers, body = got
                try:
                    self.send_response(status)
                    for k, v in {"content-type": "application/json", **headers}.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (a timeout test)
                    pass

        return Handler
