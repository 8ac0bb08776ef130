"""``marl run`` / ``cost`` / ``train`` on teams whose every policy is ``backend: openai``,
against the fake server on 127.0.0.1: billed usage in the ledger, faults, failed episodes,
the budget and the response cache."""

from __future__ import annotations

import json
import random
import zlib
from decimal import Decimal

import pytest
import yaml
from typer.testing import CliRunner

from marl.cli import app
from marl.cost.predict import predict_team
from marl.team import load_team
from tests.marl.conftest import ROOT
from tests.marl.policies.fake_openai import FakeOpenAI, Fault

pytest.importorskip("httpx")
runner = CliRunner()


def oracle_of(name: str):
    """Replies of the task's oracle for the prompt the server receives (the observation)."""
    task = load_team(ROOT / "scenarios" / f"{name}.yaml").task

    def reply(prompt: str) -> str:
        query = prompt.rsplit("\n", 1)[-1]
        final = query.endswith(" answer> ")
        agent = query.removesuffix(" answer> ") if final else query.removesuffix("> ")
        return task.oracle(agent, prompt, final)

    return reply


def api_scenario(tmp_path, url: str, name: str = "signal", **fields) -> str:
    """The shipped scenario with every policy on the fake server."""
    data = yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())
    data["policies"] = {p: {**spec, "backend": "openai", "model": "fake", "base_url": url,
                            **fields} for p, spec in data["policies"].items()}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def play(path: str, out, *args: str):
    res = runner.invoke(app, ["run", path, "--out", str(out), *args])
    summary = json.loads((out / "summary.json").read_text()) if res.exit_code == 0 else None
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()
                ] if res.exit_code == 0 else None
    return res, summary, episodes


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr("marl.policies.api.BACKOFF_BASE_S", 0.001)
    monkeypatch.setattr("marl.policies.api.BACKOFF_CAP_S", 0.002)


@pytest.mark.parametrize(("name", "api"), [("signal", "chat"), ("gather_star", "completions")])
def test_ledger_holds_the_usage_the_server_billed(tmp_path, name, api):
    with FakeOpenAI(reply=oracle_of(name)) as server:
        res, summary, episodes = play(api_scenario(tmp_path, server.url, name, api=api),
                                      tmp_path / "run", "--episodes", "12", "--batch-size", "5")
    assert res.exit_code == 0, res.output
    assert summary["success_rate"] == 1.0 and summary["failed_episodes"] == 0
    rows = [r for e in episodes for r in e["ledger"]]
    assert len(rows) == len(server.requests)
    measured = {k: sum(r[f"{k}_tokens"] for r in rows) for k in ("prompt", "cached",
                                                                  "completion")}
    assert measured == server.billed  # the server's counts, not our tokenizer's
    assert {k: summary["tokens_per_episode"][k] * 12 for k in measured} == pytest.approx(
        server.billed)
    assert summary["api_usd_spent_exact"] == summary["cost_usd_total"]
    assert summary["api_retries"] == 0 and summary["cache_hits"] == 0
    assert f"API: {len(rows)} calls, 0 retries" in res.output


def test_429_on_a_third_of_requests_is_retried_and_every_episode_played(tmp_path):
    seen: set[str] = set()
    limited: list[int] = []

    def fault(n, body):
        key = json.dumps(body, sort_keys=True)
        first, _ = key not in seen, seen.add(key)
        if first and zlib.crc32(key.encode()) % 3 == 0:
            limited.append(n)
            return Fault("status", 429, {"Retry-After": "0"})
        return None

    with FakeOpenAI(reply=oracle_of("signal"), fault=fault) as server:
        res, summary, episodes = play(api_scenario(tmp_path, server.url), tmp_path / "run",
                                      "--episodes", "30")
    assert res.exit_code == 0, res.output
    assert len(episodes) == 30 and summary["failed_episodes"] == 0
    assert summary["success_rate"] == 1.0
    assert summary["api_retries"] == len(limited) > 5
    assert summary["api"]["speaker"]["http_requests"] + summary["api"]["listener"][
        "http_requests"] == len(server.requests) == 60 + len(limited)


def test_failed_calls_fail_their_episodes_and_the_run_goes_on(tmp_path, fast_backoff):
    def fault(n, body):
        prompt = body["messages"][0]["content"]
        return Fault("status", 500) if "object: 2" in prompt else None

    with FakeOpenAI(reply=oracle_of("signal"), fault=fault) as server:
        res, summary, episodes = play(api_scenario(tmp_path, server.url, max_retries=1),
                                      tmp_path / "run", "--episodes", "16")
    assert res.exit_code == 0, res.output
    failed = [e for e in episodes if "error" in e]
    assert 0 < len(failed) < 16 and summary["failed_episodes"] == len(failed)
    assert "episode(s) failed" in res.output
    for e in failed:
        assert e["error"].startswith(f"agent 'speaker', round 1: policy 'speaker': openai fake "
                                     f"at {server.url}: HTTP 500 after 1 retries: ")
        assert e["score"] == 0 and e["success"] is False and e["ledger"] == []
        speaker, listener = e["transcript"]
        assert speaker["flags"]["error"] and listener["flags"] == {
            "skipped": "the episode failed"}
    assert all(e["success"] for e in episodes if "error" not in e)
    listener_calls = [b for b in server.requests if "listener" in json.dumps(b)]
    assert len(listener_calls) == 16 - len(failed)  # nothing is asked for a failed episode
    assert summary["api"]["speaker"]["failed"] == len(failed)


def test_malformed_json_is_a_clear_error_in_the_episode_record(tmp_path):
    def fault(n, body):
        return Fault("malformed") if "listener" in body["messages"][0]["content"] else None

    with FakeOpenAI(reply=oracle_of("signal"), fault=fault) as server:
        res, summary, episodes = play(api_scenario(tmp_path, server.url), tmp_path / "run",
                                      "--episodes", "4")
    assert res.exit_code == 0, res.output
    assert len(server.requests) == 8  # not retried
    for e in episodes:
        assert "agent 'listener', round 1: policy 'listener'" in e["error"]
        assert "malformed JSON in the response (HTTP 200)" in e["error"]
        assert [r["agent"] for r in e["ledger"]] == ["speaker"]  # billed before it failed


def scripted_signal(tmp_path, budget: Decimal | None) -> tuple[str, Decimal]:
    data = yaml.safe_load((ROOT / "scenarios" / "signal.yaml").read_text())
    data["policies"] = {p: {"backend": "scripted", "max_new_tokens": 4} for p in data["policies"]}
    path = tmp_path / "signal.yaml"
    path.write_text(yaml.safe_dump(data))
    per_episode = predict_team(load_team(path)).cost  # exact for scripted policies
    if budget is not None:
        data["costs"]["budget_usd"] = str(budget * per_episode)
        path.write_text(yaml.safe_dump(data))
    return str(path), per_episode


@pytest.mark.parametrize(("budget", "played"), [(Decimal("2.5"), 2), (Decimal("5.5"), 5)])
def test_budget_stops_before_it_would_be_exceeded(tmp_path, budget, played):
    path, per_episode = scripted_signal(tmp_path, budget)
    res, summary, episodes = play(path, tmp_path / "run", "--episodes", "10",
                                  "--batch-size", "4")
    assert res.exit_code == 0, res.output
    assert summary["stopped"] == "budget" and summary["episodes"] == len(episodes) == played
    assert summary["budget_usd"] == float(budget * per_episode)
    assert Decimal(summary["cost_usd_total"]) == played * per_episode <= budget * per_episode
    assert f"stopped by the budget: played {played} of 10 episodes" in res.output


def test_budget_that_fits_the_run_changes_nothing(tmp_path):
    path, _ = scripted_signal(tmp_path, Decimal(100))
    res, summary, episodes = play(path, tmp_path / "run", "--episodes", "10")
    assert res.exit_code == 0 and "stopped" not in summary and len(episodes) == 10


def test_budget_below_one_episode_is_refused(tmp_path):
    path, _ = scripted_signal(tmp_path, Decimal("0.5"))
    res = runner.invoke(app, ["run", path, "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "below the worst-case cost of one episode" in res.output
    assert not (tmp_path / "run").exists()


def test_cache_replays_with_no_server_call(tmp_path):
    noisy = random.Random()  # a server that samples: only the cache makes runs repeat

    with FakeOpenAI(reply=lambda prompt: noisy.choice("abcd")) as server:
        path = api_scenario(tmp_path, server.url, temperature=1.0)
        args = ("--episodes", "10", "--cache", str(tmp_path / "cache"))
        res, first, episodes = play(path, tmp_path / "a", *args)
        assert res.exit_code == 0, res.output
        sent = len(server.requests)
        res, again, replayed = play(path, tmp_path / "b", *args)
    assert res.exit_code == 0, res.output
    assert len(server.requests) == sent == 20
    assert replayed == episodes
    assert again["cache_hits"] == 20 and again["api_usd_spent"] == 0
    assert first["cache_hits"] == 0 and first["api_usd_spent"] > 0
    assert again["cost_usd_total"] == first["cost_usd_total"]  # episodes cost what they cost


def test_missing_key_variable_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("MARL_TEST_ABSENT_KEY", raising=False)
    with FakeOpenAI() as server:
        path = api_scenario(tmp_path, server.url, api_key_env="MARL_TEST_ABSENT_KEY")
        res = runner.invoke(app, ["run", path, "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "MARL_TEST_ABSENT_KEY" in res.output
    assert "not set" in res.output and "Traceback" not in res.output
    assert server.requests == []


def test_train_refuses_api_policies(tmp_path):
    path = api_scenario(tmp_path, "http://127.0.0.1:9/v1")
    res = runner.invoke(app, ["train", path, "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "cannot be trained" in res.output
    assert "marl run" in res.output and not (tmp_path / "run").exists()


def test_cost_marks_api_predictions_as_estimates(tmp_path):
    path = api_scenario(tmp_path, "http://127.0.0.1:9/v1")
    res = runner.invoke(app, ["cost", path])
    assert res.exit_code == 0, res.output
    assert "estimate" in res.output and "tokenizer" in res.output
    data = json.loads(runner.invoke(app, ["cost", path, "--json"]).output)
    assert data["kind"] == "estimate" and data["exact"] is False
    scripted = json.loads(runner.invoke(app, ["cost", path, "--json", "--policy",
                                              "scripted"]).output)
    assert scripted["kind"] == "exact" and "estimate_reason" not in scripted


def test_a_sweep_of_an_api_team_replays_from_the_cache(tmp_path):
    with FakeOpenAI(reply=oracle_of("signal")) as server:
        path = api_scenario(tmp_path, server.url)
        runs = []
        for out in ("first", "again"):
            res = runner.invoke(app, ["sweep", path, "--grid", "costs.penalty_per_1k=0,1",
                                      "--episodes", "4", "--workers", "1", "--cache",
                                      str(tmp_path / "cache"), "--out", str(tmp_path / out)])
            assert res.exit_code == 0, res.output
            runs.append([json.loads(x) for x in
                         (tmp_path / out / "cells.jsonl").read_text().splitlines()])
            if out == "first":
                sent = len(server.requests)
    assert sent == len(server.requests) > 0  # the second sweep sent nothing
    for a, b in zip(*runs, strict=True):
        assert a["success_rate"] == b["success_rate"] == 1.0
        assert a["tokens_per_episode"] == b["tokens_per_episode"]


def test_a_server_that_bills_more_than_estimated_stays_within_the_budget(tmp_path):
    def dear(prompt: str, text: str, chat: bool) -> dict:
        """Three times our character count: a long chat template, another tokenizer."""
        n = 3 * len(prompt)
        return {"prompt_tokens": n, "completion_tokens": len(text), "total_tokens": n,
                "prompt_tokens_details": {"cached_tokens": 0}}

    with FakeOpenAI(reply=oracle_of("signal"), bill=dear) as server:
        path = api_scenario(tmp_path, server.url)
        worst = predict_team(load_team(path)).cost
        data = yaml.safe_load(open(path).read())
        data["costs"]["budget_usd"] = str(6 * worst)  # room for about 2 billed episodes
        open(path, "w").write(yaml.safe_dump(data))
        res, summary, episodes = play(path, tmp_path / "run", "--episodes", "10")
    assert res.exit_code == 0, res.output
    assert summary["stopped"] == "budget" and 1 <= len(episodes) < 10
    assert Decimal(summary["cost_usd_total"]) <= 6 * worst  # never over the budget
