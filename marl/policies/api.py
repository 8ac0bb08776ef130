"""The ``openai`` backend: agents played by a model behind any OpenAI-compatible endpoint
(OpenAI, ``vllm serve``, llama.cpp's server, ...). Evaluation only: such teams are run,
swept and priced, never trained (``marl train`` refuses them).

Each :class:`~marl.policies.Request` is one HTTP request (chat: the observation as one
user message; completions: the observation as the prompt), up to ``max_concurrency`` in
flight over one ``httpx.Client``. ``greedy`` sends temperature 0; a sampled request
carries its own seed, derived from the policy's seed and its place in the rollout, so
episodes draw distinct samples and a rerun sends (and caches) the same requests.

Retries: a 429, a 5xx, a timeout or a dropped connection is retried up to
``max_retries`` times, after ``Retry-After`` seconds when the server sends that header,
else after an exponential backoff with full jitter, uniform(0, min(cap, base·2^attempt)).
Another 4xx, a body that is not JSON, or one without the expected fields is not retried:
the same request would fail the same way. A request that finally fails does not stop the
run: its completion comes back empty with ``error`` set, and the environment ends that
episode as failed with the reason in its record.

Usage: the completion carries what the server billed (``usage.prompt_tokens``,
``completion_tokens`` and ``prompt_tokens_details.cached_tokens``), which the ledger
records instead of our own counts. The policy's tokenizer is the character tokenizer: it
sizes observations and the cost model's predictions, which for API teams are estimates
(the server's tokenizer and chat template are not ours).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl.cost.ledger import Usage
from marl.errors import MarlError
from marl.policies.api_cache import ResponseCache, request_key
from marl.policies.api_settings import api_key, check_api_fields
from marl.policies.base import Completion, Policy, Request
from marl.prompts import conversation
from marl.scenario import PolicySpec
from marl.seeds import derive_seed
from orchestration.cost import TokenCounts

#: Exponential backoff: the first retry waits up to BASE seconds, each next one up to
#: twice as long, never more than CAP (tests pass tiny values).
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 20.0
#: OpenAI accepts at most four stop strings; any further ones are applied here.
MAX_STOP = 4
FINISH = {"stop": "stop", "length": "length"}


class CallFailed(Exception):
    """A request that will not succeed: ``head`` says what happened, ``detail`` shows it."""

    def __init__(self, head: str, detail: str = "", retryable: bool = False,
                 wait_s: float | None = None):
        super().__init__(f"{head}: {detail}" if detail else head)
        self.head, self.detail, self.retryable, self.wait_s = head, detail, retryable, wait_s


@dataclass
class APIStats:
    """What a policy's requests did in this process: calls answered, HTTP requests sent
    (retries included), retries, failures, answers from the response cache, and the usage
    billed for calls sent over HTTP (``paid``) and for those answered from the cache."""

    calls: int = 0
    http_requests: int = 0
    retries: int = 0
    failed: int = 0
    cache_hits: int = 0
    missing_usage: int = 0
    paid: TokenCounts = TokenCounts()
    from_cache: TokenCounts = TokenCounts()
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: Any) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def to_json(self) -> dict[str, Any]:
        return {"calls": self.calls, "http_requests": self.http_requests,
                "retries": self.retries, "failed": self.failed, "cache_hits": self.cache_hits,
                "missing_usage": self.missing_usage, "paid_tokens": self.paid.as_dict(),
                "cached_response_tokens": self.from_cache.as_dict()}


class APIPolicy(Policy):
    """A policy whose completions come from an OpenAI-compatible server (see the module
    docstring). ``sleep`` and ``backoff_*`` exist so tests can check waits without
    waiting; ``cache`` answers repeated requests from disk."""

    def __init__(self, spec: PolicySpec, seed: int = 0, key: str | None = None,
                 cache: ResponseCache | None = None, backoff_base_s: float = BACKOFF_BASE_S,
                 backoff_cap_s: float = BACKOFF_CAP_S,
                 sleep: Callable[[float], None] = time.sleep):
        assert spec.model is not None and spec.base_url is not None
        self.spec, self.model, self.base_url = spec, spec.model, spec.base_url.rstrip("/")
        self.key, self.cache = key, cache
        self.backoff_base_s, self.backoff_cap_s, self.sleep = backoff_base_s, backoff_cap_s, sleep
        self.stats = APIStats()
        self.label = f"openai {self.model} at {self.base_url}"
        self._jitter = random.Random(seed)  # only timing depends on it, never results
        self._client: Any = None
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        self._seed, self._batches = seed, 0

    def generate(self, requests: Sequence[Request], greedy: bool = False) -> list[Completion]:
        self._batches += 1
        bodies = [self._body(r, greedy, derive_seed(self._seed, self._batches, i))
                  for i, r in enumerate(requests)]
        if not bodies:
            return []
        if self._client is None:
            self._client = _make_client(self.spec, self.key)
        workers = min(self.spec.max_concurrency, len(bodies))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="marl-api") as pool:
            return list(pool.map(self._complete, bodies))

    def _body(self, request: Request, greedy: bool, seed: int) -> dict[str, Any]:
        spec = self.spec
        body: dict[str, Any] = {"model": self.model, "max_tokens": spec.max_new_tokens,
                                "temperature": 0.0 if greedy else spec.temperature,
                                "top_p": spec.top_p}
        if spec.stop:
            body["stop"] = spec.stop[:MAX_STOP]
        if body["temperature"] > 0:
            body["seed"] = seed
        if spec.chat_template_kwargs:
            body["chat_template_kwargs"] = spec.chat_template_kwargs
        if spec.api == "chat":
            body["messages"] = (conversation(request.observation)
                                if spec.prompt_format == "chat" else
                                [{"role": "user", "content": request.observation}])
        else:
            body["prompt"] = request.observation
        return body

    def _complete(self, body: dict[str, Any]) -> Completion:
        """One request, from the cache or the server; a failure becomes ``error``."""
        key = request_key(self.base_url, body) if self.cache is not None else ""
        stored = self.cache.get(key) if self.cache is not None else None
        if stored is not None:
            try:
                out = parse_response(stored, self.spec.api, self.spec.stop)
            except CallFailed:
                stored = None  # unreadable entry: ask the server again, then overwrite it
            else:
                self.stats.add(calls=1, cache_hits=1, from_cache=_counts(out.usage))
                return out
        try:
            data = self._post(body)
            out = parse_response(data, self.spec.api, self.spec.stop)
        except CallFailed as exc:
            self.stats.add(calls=1, failed=1)
            return Completion("", error=f"{self.label}: {exc}")
        if self.cache is not None:
            self.cache.put(key, self.base_url, body, data)
        self.stats.add(calls=1, paid=_counts(out.usage), missing_usage=int(out.usage is None))
        return out

    def _post(self, body: dict[str, Any]) -> Any:
        """The response JSON, after up to ``max_retries`` retries; raises CallFailed."""
        import httpx

        url = f"{self.base_url}/{'chat/completions' if self.spec.api == 'chat' else 'completions'}"
        retries = self.spec.max_retries
        for attempt in range(retries + 1):
            self.stats.add(http_requests=1, retries=int(attempt > 0))
            try:
                return _answer(self._client.post(url, json=body))
            except httpx.TimeoutException:
                failure = CallFailed("timed out", f"no answer within {self.spec.timeout_s} s",
                                     retryable=True)
            except httpx.TransportError as exc:  # refused, reset or dropped connection
                failure = CallFailed("connection failed", f"{type(exc).__name__}: {exc}",
                                     retryable=True)
            except CallFailed as exc:
                failure = exc
            if not failure.retryable:
                raise failure
            if attempt == retries:
                raise CallFailed(f"{failure.head} after {retries} retries", failure.detail)
            self.sleep(failure.wait_s if failure.wait_s is not None else self._backoff(attempt))
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int) -> float:
        """Full jitter: uniform over [0, min(cap, base · 2^attempt)]."""
        return self._jitter.uniform(0, min(self.backoff_cap_s,
                                           self.backoff_base_s * 2 ** attempt))


def _make_client(spec: PolicySpec, key: str | None) -> Any:
    try:
        import httpx
    except ImportError as exc:
        raise MarlError(f"the openai backend needs the Python package 'httpx', which is not "
                        f"installed ({exc}); pip install -e '.[api]'") from exc
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(timeout=httpx.Timeout(spec.timeout_s), headers=headers,
                        limits=httpx.Limits(max_connections=spec.max_concurrency))


def _answer(response: Any) -> Any:
    """The JSON of a successful response; raises CallFailed, retryable on 429 and 5xx."""
    status = response.status_code
    if status == 429 or status >= 500:
        raise CallFailed(f"HTTP {status}", _excerpt(response.text), retryable=True,
                         wait_s=retry_after(response.headers.get("retry-after")))
    if status >= 400:
        raise CallFailed(f"HTTP {status}", _excerpt(response.text) + (
            " (check api_key_env and the key in it)" if status in (401, 403) else ""))
    try:
        return response.json()
    except ValueError:
        raise CallFailed(f"malformed JSON in the response (HTTP {status})",
                         _excerpt(response.text)) from None


def retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (None when absent or not a number of
    seconds: the backoff applies then).

    >>> retry_after("2"), retry_after("0.5"), retry_after("Wed, 21 Oct 2015 07:28:00 GMT")
    (2.0, 0.5, None)
    """
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def parse_response(data: Any, api: str, stop: Sequence[str]) -> Completion:
    """The completion in a chat or completions response; raises CallFailed when the
    expected fields are missing."""
    where = "choices[0].message.content" if api == "chat" else "choices[0].text"
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"] if api == "chat" else choice["text"]
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise CallFailed(f"the response has no {where}",
                         _excerpt(json.dumps(data))) from None
    if text is None:  # e.g. a reasoning model that spent max_tokens before answering
        text = ""
    if not isinstance(text, str):
        raise CallFailed(f"{where} is not a string", _excerpt(json.dumps(data)))
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    if cut >= 0:  # servers apply the first MAX_STOP stop strings; apply every one
        text, finish = text[:cut], "stop"
    usage = parse_usage(data.get("usage"))
    return Completion(text, finish=FINISH.get(finish), usage=usage)


def parse_usage(usage: Any) -> Usage | None:
    """The billed usage (None when the server reports none: our own counts apply then).

    >>> parse_usage({"prompt_tokens": 9, "completion_tokens": 2,
    ...              "prompt_tokens_details": {"cached_tokens": 4}})
    Usage(prompt_tokens=9, completion_tokens=2, cached_tokens=4)
    """
    if usage is None:
        return None
    try:
        details = usage.get("prompt_tokens_details") or {}
        counts = (usage["prompt_tokens"], usage["completion_tokens"],
                  details.get("cached_tokens") or 0)
    except (KeyError, AttributeError):
        raise CallFailed("the response's usage lacks prompt_tokens or completion_tokens",
                         _excerpt(json.dumps(usage))) from None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        raise CallFailed("the response's usage holds a count that is not a whole number "
                         ">= 0", _excerpt(json.dumps(usage)))
    prompt, completion, cached = counts
    return Usage(prompt, completion, min(cached, prompt))


def _counts(usage: Usage | None) -> TokenCounts:
    if usage is None:
        return TokenCounts()
    return TokenCounts(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def build_openai(spec: PolicySpec, task: Any, seed: int,
                 checkpoint: Path | None = None, team: Any = None) -> APIPolicy:
    """An API policy from a scenario's spec (checked again here, since ``--policy openai``
    replaces backends after the scenario was validated). The key is read from the
    environment now, so a missing variable fails before any episode is played."""
    problems = check_api_fields("policy", spec)
    if problems:
        raise MarlError("the openai backend cannot be built: "
                        + " ".join(f"{p.path}: {p.message}" for p in problems))
    seed = seed if spec.seed is None else spec.seed
    return APIPolicy(spec, seed=seed, key=api_key(spec), backoff_base_s=BACKOFF_BASE_S,
                     backoff_cap_s=BACKOFF_CAP_S)
