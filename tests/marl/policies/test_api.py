"""The ``openai`` backend against a fake OpenAI-compatible server on 127.0.0.1: requests,
usage, retries (429 / 5xx / timeouts / dropped connections, Retry-After), errors that are
not retried, the response cache, and the settings checked before any request."""

from __future__ import annotations

import sys

import pytest

from marl.cost.ledger import Usage
from marl.errors import MarlError, ScenarioError
from marl.policies import Request
from marl.policies.api import APIPolicy, build_openai
from marl.policies.api_cache import ResponseCache
from marl.scenario import PolicySpec
from marl.team import load_team
from tests.marl.conftest import ROOT
from tests.marl.policies.fake_openai import FakeOpenAI, Fault

pytest.importorskip("httpx")


def spec(url: str, **fields) -> PolicySpec:
    return PolicySpec(backend="openai", model="fake-model", base_url=url, **fields)


def policy(url: str, sleeps: list[float] | None = None, **fields) -> APIPolicy:
    """A policy whose waits are recorded, not slept."""
    waits = sleeps if sleeps is not None else []
    return APIPolicy(spec(url, **fields), seed=0, backoff_base_s=0.001, backoff_cap_s=0.002,
                     sleep=waits.append)


REQS = [Request("w1", "you are w1.\nw1> "), Request("w2", "you are w2 too.\nw2> ")]


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_requests_and_billed_usage(api):
    with FakeOpenAI(reply=lambda prompt: prompt.split()[2] + "\nrest") as server:
        out = policy(server.url, api=api, temperature=0.7, stop=["\n"]).generate(REQS)
    assert [c.text for c in out] == ["w1.", "w2"]  # cut at the stop string
    assert all(c.error is None and c.finish == "stop" for c in out)
    body = server.requests[0]
    assert body["model"] == "fake-model" and body["temperature"] == 0.7
    assert body["max_tokens"] == 32 and body["stop"] == ["\n"]
    assert ("messages" in body) == (api == "chat") and ("prompt" in body) == (api != "chat")
    assert body["seed"] != server.requests[1]["seed"]  # each request its own sample
    # the server's own counts: words of the prompt (+ 5 for a chat template), and half
    # the characters of the whole reply it generated (before our stop cut it)
    chat = 5 if api == "chat" else 0
    assert out[0].usage == Usage(prompt_tokens=4 + chat, completion_tokens=4,
                                 cached_tokens=(4 + chat) // 3)


def test_greedy_sends_temperature_zero_and_no_seed():
    with FakeOpenAI() as server:
        policy(server.url, temperature=0.9).generate(REQS[:1], greedy=True)
    assert server.requests[0]["temperature"] == 0.0 and "seed" not in server.requests[0]


def test_concurrency_is_bounded_and_every_request_answered():
    reqs = [Request(f"a{i}", f"prompt {i}\n") for i in range(24)]
    with FakeOpenAI(reply=lambda p: p.split()[1],
                    fault=lambda n, body: Fault("slow", delay_s=0.02)) as server:
        out = policy(server.url, max_concurrency=3).generate(reqs)
    assert [c.text for c in out] == [str(i) for i in range(24)]  # order kept
    assert len(server.requests) == 24 and 2 <= server.max_in_flight <= 3


def test_key_is_sent_as_bearer_and_missing_variable_is_an_error(monkeypatch):
    monkeypatch.setenv("MARL_TEST_KEY", "secret-value")
    with FakeOpenAI() as server:
        p = build_openai(spec(server.url, api_key_env="MARL_TEST_KEY"), None, 0)
        p.generate(REQS[:1])
    assert server.headers[0]["Authorization"] == "Bearer secret-value"
    monkeypatch.delenv("MARL_TEST_KEY")
    with pytest.raises(MarlError, match="MARL_TEST_KEY.*not set"):
        build_openai(spec(server.url, api_key_env="MARL_TEST_KEY"), None, 0)


def test_retry_after_is_honoured():
    def fault(n, body):
        return Fault("status", 429, {"Retry-After": "7"}) if n == 0 else None

    sleeps: list[float] = []
    with FakeOpenAI(fault=fault) as server:
        p = policy(server.url, sleeps)
        out = p.generate(REQS[:1])
    assert out[0].text == "a" and sleeps == [7.0]  # waited what the server asked
    assert p.stats.retries == 1 and p.stats.http_requests == 2


def test_backoff_is_exponential_with_full_jitter():
    with FakeOpenAI(fault=lambda n, body: Fault("status", 503)) as server:
        sleeps: list[float] = []
        p = APIPolicy(spec(server.url, max_retries=6), backoff_base_s=0.001,
                      backoff_cap_s=0.004, sleep=sleeps.append)
        out = p.generate(REQS[:1])
    assert out[0].error.endswith("HTTP 503 after 6 retries: "
                                 '{"error": {"message": "injected fault"}}')
    assert len(sleeps) == 6 and len(server.requests) == 7
    assert all(0 <= s <= min(0.004, 0.001 * 2 ** i) for i, s in enumerate(sleeps))


@pytest.mark.parametrize("fault", [Fault("status", 500), Fault("status", 502),
                                   Fault("drop")], ids=["500", "502", "dropped"])
def test_transient_failure_then_success_is_retried(fault):
    with FakeOpenAI(fault=lambda n, body: fault if n == 0 else None) as server:
        p = policy(server.url)
        out = p.generate(REQS[:1])
    assert out[0].text == "a" and out[0].error is None
    assert p.stats.retries == 1 and len(server.requests) == 2


def test_timeout_is_retried_then_fails():
    with FakeOpenAI(fault=lambda n, body: Fault("slow", delay_s=5.0)) as server:
        p = policy(server.url, timeout_s=0.2, max_retries=1)
        out = p.generate(REQS[:1])
    assert out[0].text == "" and out[0].usage is None
    assert "fake-model at " + server.url in out[0].error
    assert "timed out after 1 retries: no answer within 0.2 s" in out[0].error
    assert len(server.requests) == 2 and p.stats.failed == 1


@pytest.mark.parametrize(("fault", "message"), [
    (Fault("status", 400), "HTTP 400: "),
    (Fault("status", 401), "check api_key_env"),
    (Fault("malformed"), "malformed JSON in the response (HTTP 200): {\"choices\": ["),
    (Fault("empty"), "the response has no choices[0].message.content"),
], ids=["400", "401", "malformed", "empty"])
def test_errors_that_would_repeat_are_not_retried(fault, message):
    with FakeOpenAI(fault=lambda n, body: fault) as server:
        p = policy(server.url)
        out = p.generate(REQS)
    assert all(message in c.error and c.text == "" for c in out)
    assert len(server.requests) == 2 and p.stats.retries == 0 and p.stats.failed == 2


def test_cache_answers_without_http(tmp_path):
    with FakeOpenAI(reply=lambda p: p[-4:-2]) as server:
        first = policy(server.url)
        first.cache = ResponseCache(tmp_path)
        a = first.generate(REQS)
        again = policy(server.url)
        again.cache = ResponseCache(tmp_path)
        b = again.generate(REQS)
    assert a == b and len(server.requests) == 2
    assert again.stats.cache_hits == 2 and again.stats.http_requests == 0
    assert again.stats.from_cache == first.stats.paid and again.stats.paid.total == 0
    assert len(list(tmp_path.glob("*/*.json"))) == 2


def test_the_cache_on_disk_stays_under_its_cap_dropping_the_least_recently_used(tmp_path):
    cache = ResponseCache(tmp_path, max_bytes=4000)
    body = {"prompt": "x" * 300}
    for i in range(3):
        cache.put(f"{i:064x}", "http://h/v1", {**body, "i": i}, {"n": i})
    size = lambda: sum(f.stat().st_size for f in tmp_path.glob("*/*.json"))  # noqa: E731
    assert cache.get(f"{0:064x}") == {"n": 0}  # used again: now the most recent
    time_order = sorted(tmp_path.glob("*/*.json"), key=lambda f: f.stat().st_mtime_ns)
    assert time_order[-1].stem == f"{0:064x}"
    for i in range(3, 12):
        cache.put(f"{i:064x}", "http://h/v1", {**body, "i": i}, {"n": i})
        assert size() <= 4000
    assert cache.get(f"{11:064x}") == {"n": 11} and cache.get(f"{1:064x}") is None
    cache.put("f" * 64, "http://h/v1", {"prompt": "y" * 5000}, {})  # bigger than the cap
    assert cache.get("f" * 64) is None and size() <= 4000


def test_missing_httpx_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "httpx", None)
    p = policy("http://127.0.0.1:9/v1")
    with pytest.raises(MarlError, match=r"pip install -e '\.\[api\]'"):
        p.generate(REQS[:1])


def scenario(**lead) -> dict:
    return {"name": "t", "task": {"name": "gather_v1"},
            "agents": [{"count": 2, "id": "w{i}", "policy": "worker"},
                       {"id": "lead", "policy": "lead"}],
            "policies": {"worker": {"backend": "scripted"}, "lead": lead},
            "topology": {"kind": "star", "hub": "lead"}, "protocol": {"answer": "lead"}}


def problems(**lead) -> str:
    with pytest.raises(ScenarioError) as exc:
        load_team(scenario(**lead))
    return str(exc.value)


OPENAI = {"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:8000/v1"}


def test_a_key_in_the_scenario_is_refused_without_echoing_it():
    text = problems(**OPENAI, api_key="sk-live-1234567890abcdef")
    assert "policies.lead.api_key" in text and "api_key_env" in text
    assert "environment variable" in text and "1234567890" not in text
    text = problems(**OPENAI, api_key_env="sk-proj-Ab3dEf6hIj9kLm2nOp5q")
    assert "policies.lead.api_key_env" in text and "looks like a key" in text
    assert "Ab3dEf6h" not in text
    assert "not an environment variable name" in problems(**OPENAI, api_key_env="MY-KEY")


def test_openai_needs_model_and_base_url():
    text = problems(backend="openai")
    assert "policies.lead.model" in text and "policies.lead.base_url" in text
    assert "not an http(s) URL" in problems(**{**OPENAI, "base_url": "127.0.0.1:8000"})


def test_a_key_over_plain_http_to_another_host_is_refused_unless_allowed():
    remote = {**OPENAI, "base_url": "http://10.0.0.5:8000/v1", "api_key_env": "KEY"}
    text = problems(**remote)
    assert "policies.lead.base_url" in text and "unencrypted" in text
    assert "allow_plain_http: true" in text
    load_team(scenario(**remote, allow_plain_http=True))  # a trusted network: the user says
    load_team(scenario(**{**remote, "base_url": "https://10.0.0.5:8000/v1"}))
    load_team(scenario(**{**remote, "base_url": "http://localhost:8000/v1"}))
    load_team(scenario(**{**remote, "api_key_env": None}))  # no key, nothing to leak
    assert "allow_plain_http` applies to the" in problems(backend="tiny", allow_plain_http=True)


@pytest.mark.parametrize(("lead", "field"), [
    ({"backend": "tiny", "base_url": "http://x/v1"}, "base_url"),
    ({"backend": "scripted", "max_retries": 2}, "max_retries"),
    ({"backend": "tiny", "api": "completions"}, "api"),
    ({**OPENAI, "preset": "tiny"}, "preset"),
    ({**OPENAI, "lora": {"r": 4}}, "lora"),
    ({**OPENAI, "top_k": 5}, "top_k"),
])
def test_backend_fields_on_the_wrong_backend_are_refused(lead, field):
    text = problems(**lead)
    assert f"policies.lead.{field}: `{field}` applies to the" in text and "only, not" in text


def test_api_model_name_is_not_a_price_model():
    team = load_team({**scenario(**{**OPENAI, "model": "Qwen/Qwen2.5-0.5B-Instruct"}),
                      "costs": {"model": "gpt-4o-mini"}})
    assert team.models["lead"] == "gpt-4o-mini"


def test_shipped_scenarios_still_load():
    assert load_team(ROOT / "scenarios" / "gather_star.yaml").models["lead"] == "gpt-4o-mini"


def test_a_chat_prompt_format_sends_the_conversation():
    obs = ("you are w2 (worker). v: 3\nBe brief.\n[round 1]\nw1> hi\nw2> 7\n"
           "[round 2]\nw1> again\nw2 answer> ")
    with FakeOpenAI() as server:
        policy(server.url, prompt_format="chat",
               chat_template_kwargs={"enable_thinking": False}).generate([Request("w2", obs)])
    body = server.requests[0]
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["messages"][0]["content"] == "you are w2 (worker). v: 3\nBe brief."
    assert body["messages"][3]["content"] == "[round 2]\nw1: again\nYour answer:"
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
