"""``marl analyze``: reading runs (damaged ones too), the numbers, the replays, the report."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marl.analysis.analyze import analyze
from marl.analysis.report import figures, html_report
from marl.analysis.runs import discover
from marl.cli import app
from tests.marl.conftest import ROOT

runner = CliRunner()
SIGNAL = ROOT / "scenarios" / "signal.yaml"
TINY = ["--set", "iterations=4", "--set", "episodes_per_iter=2", "--set", "group_size=2",
        "--set", "eval_episodes=8", "--set", "eval_every=2", "--set", "warmup_steps=2",
        "--set", "warmup_episodes=4", "--set", "checkpoint_every=2",
        "--set", "keep_checkpoints=5"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("analyze") / "signal_run"
    res = runner.invoke(app, ["train", str(SIGNAL), "--out", str(out), *TINY])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("analyze") / "scripted"
    res = runner.invoke(app, ["run", str(SIGNAL), "--policy", "scripted", "--episodes", "16",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _record(meaning, message, answer_ok=True):
    """One ref-like episode record: a speaker's message about an attribute vector."""
    return {"success": answer_ok, "split": "train", "instance": {"meaning": list(meaning)},
            "private": {"speaker": "".join(map(str, meaning)), "listener": ""},
            "transcript": [{"round": 0, "agent": "speaker", "message": message},
                           {"round": 0, "agent": "listener", "message": "00"}],
            "ledger": [{"agent": "speaker", "prompt_tokens": 10, "cached_tokens": 0,
                        "completion_tokens": 2, "cost_usd": "0.001", "received": {}},
                       {"agent": "listener", "prompt_tokens": 12, "cached_tokens": 2,
                        "completion_tokens": 2, "cost_usd": "0.002",
                        "received": {"speaker": 3}}]}


def _fake_run(path: Path, iterations: int, language) -> Path:
    """A training run directory as the trainer writes it, with a chosen language."""
    (path / "episodes").mkdir(parents=True)
    rows = [{"phase": "rl", "iteration": i, "episodes": 4 * i, "success_rate": 0.5,
             "reward_mean": 0.5, "tokens_per_episode": 29.0, "cost_per_episode": 0.003,
             **({"eval_success_rate": 1.0} if i % 10 == 0 else {})}
            for i in range(1, iterations + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meanings = [(a, b) for a in range(4) for b in range(4)]
    for i in range(10, iterations + 1, 10):
        (path / "episodes" / f"eval_{i:06d}.jsonl").write_text("".join(
            json.dumps(_record(m, language(m))) + "\n" for m in meanings))
    (path / "summary.json").write_text(json.dumps({"scenario": "ref", "iterations": iterations,
                                                   "uses_oracle": False}))
    return path


def compositional(m):
    return "abcd"[m[0]] + "efgh"[m[1]]


def test_a_compositional_language_reads_as_one(tmp_path):
    _fake_run(tmp_path / "run", 30, compositional)
    data = analyze([tmp_path / "run"])
    (run,) = data["runs"]
    speaker = run["emergence"]["agents"]["speaker"]
    assert run["emergence"]["iteration"] == [10, 20, 30]
    assert speaker["topographic_similarity"] == [pytest.approx(1.0)] * 3
    assert speaker["posdis"] == [pytest.approx(1.0)] * 3
    assert speaker["entropy"] == [pytest.approx(4.0)] * 3  # 16 distinct messages
    # Without scenario.yaml the listener's answer counts as a message; it is said.
    assert any("scenario.yaml" in n for n in run["notes"])
    assert run["tokens"]["per_edge"] == {"speaker->listener": 3.0}
    assert run["usd_per_episode"] == pytest.approx(0.003)
    assert run["curve"]["cum_tokens"][:2] == [4 * 29.0, 8 * 29.0]


def test_a_holistic_language_does_not(tmp_path):
    import numpy as np

    order = np.random.default_rng(0).permutation(16)
    codes = [compositional((a, b)) for a in range(4) for b in range(4)]
    _fake_run(tmp_path / "run", 10, lambda m: codes[order[m[0] * 4 + m[1]]])
    speaker = analyze([tmp_path / "run"])["runs"][0]["emergence"]["agents"]["speaker"]
    assert abs(speaker["topographic_similarity"][0]) < 0.3 and speaker["posdis"][0] < 0.5


def test_damaged_and_foreign_directories_are_reported_and_the_rest_read(tmp_path):
    good = _fake_run(tmp_path / "good", 20, compositional)
    cut = _fake_run(tmp_path / "cut", 20, compositional)
    with (cut / "metrics.jsonl").open("a") as f:
        f.write('{"phase": "rl", "iterati')  # a kill in the middle of a write
    live = _fake_run(tmp_path / "live", 20, compositional)
    (live / "summary.json").unlink()  # still being written
    (tmp_path / "notarun").mkdir()
    (tmp_path / "notarun" / "readme.txt").write_text("hello")
    data = analyze([good, cut, live, tmp_path / "notarun", tmp_path / "missing"])
    by = {r["label"]: r for r in data["runs"]}
    assert set(by) == {"good", "cut", "live"}
    assert any("cut short" in n for n in by["cut"]["notes"])
    assert len(by["cut"]["curve"]["iteration"]) == 20
    assert not by["live"]["finished"] and any("still being written" in n
                                               for n in by["live"]["notes"])
    assert any("notarun is not a run directory" in p for p in data["problems"])
    assert any("missing: no such directory" in p for p in data["problems"])
    page = html_report(data, figures(data))
    assert "cut short" in page and "not a run directory" in page


def test_the_cli_reports_a_training_run_and_an_evaluation(trained, evaluated, tmp_path):
    report = tmp_path / "report.html"
    res = runner.invoke(app, ["analyze", str(trained), str(evaluated), "--out", str(report),
                              "--figures", str(tmp_path / "png"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    by = {r["label"]: r for r in data["runs"]}
    assert by["scripted"]["success"] == 1.0 and by["scripted"]["uses_oracle"]
    assert by["signal_run"]["curve"]["iteration"] == [1, 2, 3, 4]
    # The team as the warm-up left it is the emergence curves' iteration 0.
    assert by["signal_run"]["emergence"]["iteration"] == [0, 2, 4]
    assert by["signal_run"]["edges"] == [["speaker", "listener", 0]]
    # The scripted oracle's code is a perfect one: every object its own letter.
    speaker = by["scripted"]["emergence"]["agents"]["speaker"]
    assert speaker["speaker_consistency"] == [pytest.approx(1.0)]
    assert "listener" not in by["scripted"]["emergence"]["agents"]  # answers only
    page = report.read_text()
    assert page.count("<img") == len(list((tmp_path / "png").glob("*.png"))) >= 4
    assert "scripted (scripted oracle)" in page
    assert "http" not in page.replace("http-equiv", "")  # nothing fetched from a network


def test_analyze_fails_clearly_with_nothing_to_read(tmp_path):
    res = runner.invoke(app, ["analyze", str(tmp_path / "nothing")])
    assert res.exit_code == 2
    assert "no run to analyze" in res.output and "no such directory" in res.output


def test_replays_measure_influence_at_every_checkpoint_and_are_cached(trained, tmp_path):
    args = ["analyze", str(trained), "--out", str(tmp_path / "r.html"), "--replay",
            "--replay-episodes", "4", "--replay-samples", "2", "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "replayed iter_000002" in first.stderr and "tokens" in first.stderr
    replays = json.loads(first.stdout)["runs"][0]["interventions"]
    assert [r["iteration"] for r in replays] == [0, 2, 4]  # 0: after the warm-up
    for r in replays:
        assert set(r["causal_influence"]) == {"speaker->listener"}
        assert r["causal_influence"]["speaker->listener"] >= 0
        assert set(r["importance"]) == {"speaker", "listener"}
        assert all(0.0 <= x <= 1.0 for x in r["importance"].values())
        assert r["replay_cost"]["tokens"] > 0 and r["replay_cost"]["cost_usd"] > 0
    second = runner.invoke(app, args)
    assert "replayed" not in second.stderr  # read back from RUN/analysis/
    assert json.loads(second.stdout)["runs"][0]["interventions"] == replays


def test_the_analysis_never_imports_torch(trained):
    code = ("import sys; from marl.analysis.analyze import analyze; "
            "from marl.analysis.report import figures, html_report; "
            f"d = analyze([{str(trained)!r}]); html_report(d, figures(d)); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_sweeps_and_populations_are_read_with_their_values(tmp_path):
    sweep = tmp_path / "sweep"
    _fake_run(sweep / "cells" / "c000-aa", 10, compositional)
    _fake_run(sweep / "cells" / "c001-bb", 10, lambda m: "aa")
    (sweep / "cells.jsonl").write_text(
        json.dumps({"id": "c000-aa", "values": {"topology.kind": "star"}, "status": "done"})
        + "\n" + json.dumps({"id": "c001-bb", "values": {"topology.kind": "chain"},
                             "status": "done"}) + "\n"
        + json.dumps({"id": "c002-cc", "values": {"topology.kind": "ring"},
                      "status": "invalid", "error": "a ring needs 2 rounds"}) + "\n")
    runs, problems = discover([sweep])
    assert {r.label: r.values for r in runs} == {
        "sweep/c000-aa": {"topology.kind": "star"}, "sweep/c001-bb": {"topology.kind": "chain"}}
    assert any("a ring needs 2 rounds" in p for p in problems)


def _scripted(team, listener="scripted"):
    from marl.policies.scripted import RandomPolicy, ScriptedPolicy

    return {"speaker": ScriptedPolicy(team.task),
            "listener": ScriptedPolicy(team.task) if listener == "scripted"
            else RandomPolicy(team.task, seed=1)}


def test_influence_is_the_code_entropy_for_a_reading_listener_and_0_for_a_deaf_one():
    from collections import Counter

    from marl.analysis.emergence import entropy
    from marl.analysis.replay import agent_importance, edge_influence
    from marl.rollout import collect
    from marl.team import load_team

    team = load_team(SIGNAL)
    edge = ("speaker", "listener", 0)
    for kind in ("scripted", "random"):
        policies = _scripted(team, kind)
        base = collect(team, policies, 24, seed=5).records
        value, rows = edge_influence(team, policies, base, edge, samples=3, seed=5)
        sent = [r["transcript"][0]["message"] for r in base]
        assert rows  # the replays are accounted for
        if kind == "scripted":  # the oracle answers what the code says: I = H(code)
            assert value == pytest.approx(entropy(sent)) and len(Counter(sent)) > 1
        else:  # a listener that ignores the message, same random numbers under every do(c)
            assert value == 0.0
    found, _ = agent_importance(team, _scripted(team), 24, seed=5)
    # Muting the oracle speaker leaves the listener guessing its fallback; muting the
    # listener (the answer agent) always changes the answer.
    assert found["importance"]["listener"] == 1.0
    assert 0.5 < found["importance"]["speaker"] < 1.0
    assert 0.0 < found["wasted_share"] < 0.5


def test_a_run_with_nothing_played_yet_has_no_point_in_the_cost_figure():
    from marl.analysis.report import cost_figure

    base = {"kind": "train", "uses_oracle": False, "tokens_are": "tokens"}
    runs = [{**base, "label": "live", "usd_per_episode": None, "tokens_per_episode": None,
             "success": None},
            {**base, "label": "done", "usd_per_episode": 0.1, "tokens_per_episode": 10.0,
             "success": 1.0}]
    fig = cost_figure(runs, "s", {"usd": ["done"], "tokens": ["done"]})
    fig.savefig(io.BytesIO(), format="png")
    assert [len(ax.collections) for ax in fig.axes] == [1, 1]
