import json

from typer.testing import CliRunner

from marl.cli import app
from tests.marl.conftest import ROOT

runner = CliRunner()
SIGNAL = str(ROOT / "scenarios" / "signal.yaml")
TOKEN_KEYS = {"prompt", "cached", "completion", "total"}


def test_run_writes_summary_and_episodes(tmp_path):
    res = runner.invoke(app, ["run", SIGNAL, "--policy", "scripted", "--episodes", "12",
                              "--seed", "3", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "success rate 1.000" in res.output and "TOTAL" in res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episodes"] == 12 and summary["success_rate"] == 1.0
    assert set(summary["tokens_per_episode"]) == TOKEN_KEYS
    assert summary["tokens_per_episode"] == summary["predicted_tokens_per_episode"]
    assert set(summary["per_agent"]) == {"speaker", "listener"}
    assert summary["cost_usd_per_episode"] > 0
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 12
    episode = json.loads(lines[0])
    assert {"transcript", "ledger", "answer", "score", "reward"} <= set(episode)
    assert episode["ledger"][0]["agent"] == "speaker"
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_run_random_policy_and_seed_determinism(tmp_path):
    outs = []
    for i in range(2):
        res = runner.invoke(app, ["run", SIGNAL, "--policy", "random", "--episodes", "30",
                                  "--seed", "9", "--out", str(tmp_path / str(i))])
        assert res.exit_code == 0, res.output
        outs.append((tmp_path / str(i) / "episodes.jsonl").read_text())
    assert outs[0] == outs[1]
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["success_rate"] < 0.6


def test_run_rejects_unknown_policy_without_traceback(tmp_path):
    res = runner.invoke(app, ["run", SIGNAL, "--policy", "scriptd", "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert "Did you mean 'scripted'?" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "summary.json").exists()


def test_cost_json_has_run_keys():
    res = runner.invoke(app, ["cost", SIGNAL, "--policy", "scripted", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data["tokens_per_episode"]) == TOKEN_KEYS
    assert data["exact"] is True and data["cost_usd_per_episode"] > 0
    assert set(data["per_edge"]) == {"speaker->listener"}


def test_cost_table():
    res = runner.invoke(app, ["cost", str(ROOT / "scenarios" / "gather_star.yaml")])
    assert res.exit_code == 0 and "w1->lead" in res.output and "upper bound" in res.output


def test_topology_show_text_and_png(tmp_path):
    png = tmp_path / "tree.png"
    res = runner.invoke(app, ["topology", "show", "tree", "--agents", "7", "--set", "k=3",
                              "--out", str(png)])
    assert res.exit_code == 0, res.output
    assert "layer 0" in res.output and "a1 -> a0" in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_topology_show_errors(tmp_path):
    res = runner.invoke(app, ["topology", "show", "stra"])
    assert res.exit_code == 2 and "Did you mean 'star'?" in res.output
    res = runner.invoke(app, ["topology", "show", "star", "--set", "hubb=a0"])
    assert res.exit_code == 2 and "hubb" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["topology", "show", "custom", "--set",
                              "edges=[[a0, a1], [a1, a0]]"])
    assert res.exit_code == 2 and "a0 -> a1 -> a0" in res.output
