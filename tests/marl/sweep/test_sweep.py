import json

import pytest
from typer.testing import CliRunner

from marl.cli import app
from marl.errors import ConfigError
from marl.scenario import read_yaml
from marl.sweep.grid import apply_cell, expand, parse_grids
from marl.sweep.run import train_settings
from marl.team import load_team
from tests.marl.conftest import ROOT

runner = CliRunner()
GATHER = str(ROOT / "scenarios" / "gather_star.yaml")
SIGNAL = str(ROOT / "scenarios" / "signal.yaml")
RAW = read_yaml(GATHER)[0]
SETTINGS = ["lr", "seed", "iterations"]


def sweep(out, *args):
    return runner.invoke(app, ["sweep", GATHER, "--policy", "scripted", "--episodes", "4",
                               "--workers", "1", "--out", str(out), *args])


def rows(out):
    return [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]


def test_grids_expand_in_order_with_yaml_values():
    grids = parse_grids(["topology.kind=star,debate", "costs.penalty_per_1k=0,1.5",
                         "topology.order=[w1, lead],'a,b'"], RAW)
    assert [g.path for g in grids][2] == ("topology", "order")
    cells = expand(grids)
    assert [tuple(c.values.values()) for c in cells][:3] == [
        ("star", 0, ["w1", "lead"]), ("star", 0, "a,b"), ("star", 1.5, ["w1", "lead"])]
    assert len(cells) == 8 and cells[-1].values["topology.kind"] == "debate"
    ids = [c.id for c in cells]
    assert len(set(ids)) == 8 and ids[0].startswith("c000-")
    assert ids == [c.id for c in expand(grids)]  # stable


@pytest.mark.parametrize("flags, words", [
    (["topology.kind"], ["--grid 'topology.kind'", "e.g. --grid"]),
    (["=star,chain"], ["--grid '=star,chain'", "e.g. --grid"]),
    (["topology.kind="], ["expected key=v1,v2"]),
    (["topology.kind=star,,chain"], ["not valid YAML", "single commas", "e.g. --grid"]),
    (["topology.kind=star,"], ["empty value", "e.g. --grid"]),
    (["topology.kind=star", "topology.kind=chain"], ["topology.kind is given twice"]),
    (["topology.kind=star,star"], ["repeats a value"]),
    (["topolgy.kind=star"], ["'topolgy'", "Did you mean 'topology'?",
                             "Valid top-level keys: name, description"]),
    (["costs.penalty=1"], ["'penalty' is not a key of costs", "Did you mean 'penalty_per_1k'?"]),
    (["policies.lead.backnd=tiny"], ["of policies.lead", "Did you mean 'backend'?"]),
    (["agents.5.count=2"], ["agents is a list of 2 entries", "0 to 1"]),
    (["agents.count=2"], ["agents is a list", "agents.1"]),
    (["train.lr=0.1"], ["train.lr", "--train CONFIG"]),
])
def test_malformed_and_unknown_grids_are_named(flags, words):
    with pytest.raises(ConfigError) as exc:
        parse_grids(flags, RAW)
    for word in words:
        assert word in str(exc.value)


def test_training_settings_are_checked():
    assert parse_grids(["train.lr=0.1,0.2"], RAW, SETTINGS)[0].values == (0.1, 0.2)
    with pytest.raises(ConfigError, match="'lrr' is not a training setting. Did you mean 'lr'"):
        parse_grids(["train.lrr=0.1"], RAW, SETTINGS)
    assert train_settings({"iterations": 2}, {"train.lr": 0.5, "x": 1}) == {
        "iterations": 2, "lr": 0.5}
    with pytest.raises(ConfigError, match="lr"):
        train_settings({}, {"train.lr": -1})


def test_cells_merge_topologies_and_index_lists():
    chain = apply_cell(RAW, {"topology.kind": "debate"})
    assert chain["topology"] == {"kind": "debate"}  # the star's hub does not survive
    sizes = [len(load_team(apply_cell(RAW, c.values)).ids)
             for c in expand(parse_grids(["agents.0.count=2,3,5"], RAW))]
    assert sizes == [3, 4, 6]
    assert RAW["agents"][0]["count"] == 3 and RAW["topology"]["hub"] == "lead"  # untouched


def test_scripted_sweep_through_the_cli(tmp_path):
    res = sweep(tmp_path, "--grid", "topology.kind=star,debate", "--grid",
                "costs.penalty_per_1k=0,1", "--grid", "protocol.rounds=2")
    assert res.exit_code == 0, res.output
    done = rows(tmp_path)
    assert [r["status"] for r in done] == ["done"] * 4
    for r in done:
        assert r["tokens_per_episode"] == r["predicted_tokens_per_episode"]
        assert r["cost_usd_per_episode"] == pytest.approx(r["predicted_cost_usd_per_episode"])
        assert r["success_rate"] == 1.0
        penalty = r["values"]["costs.penalty_per_1k"] * r["tokens_per_episode"] / 1000
        assert r["reward_mean"] == pytest.approx(1.0 - penalty)
        cell = tmp_path / r["run_dir"]
        assert (cell / "summary.json").is_file() and (cell / "episodes.jsonl").is_file()
        cost = runner.invoke(app, ["cost", str(cell / "scenario.yaml"), "--policy",
                                   "scripted", "--json"])
        assert json.loads(cost.output)["tokens_per_episode"]["total"] == r[
            "tokens_per_episode"]
    assert "hub" not in (tmp_path / done[2]["run_dir"] / "scenario.yaml").read_text()
    edges = [set(json.loads((tmp_path / r["run_dir"] / "summary.json").read_text())[
        "per_edge"]) for r in done]
    assert edges[0] == edges[1] != edges[2] and "w1->w2" in edges[2]  # a star, then debates
    table = (tmp_path / "table.md").read_text().splitlines()
    assert len(table) == 6 and table[2].startswith("| star | 0 | 2 | done | 1.000 |")
    assert (tmp_path / "table.csv").read_text().count("\n") == 5
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob(".*.tmp"))


def test_invalid_cells_are_reported_and_skipped(tmp_path):
    res = sweep(tmp_path, "--grid", "protocol.rounds=0,1")
    assert res.exit_code == 0, res.output
    bad, good = rows(tmp_path)
    assert bad["status"] == "invalid" and "protocol.rounds" in bad["error"]
    assert good["status"] == "done" and "protocol.rounds=0: invalid" in res.output
    assert not (tmp_path / "cells" / bad["id"]).exists()
    assert "invalid | - |" in (tmp_path / "table.md").read_text()
    res = sweep(tmp_path / "all", "--grid", "topology.kind=debate,ring")
    assert res.exit_code == 2 and "every one of the 2 cells is invalid" in res.output


def test_interrupted_sweep_resumes_and_other_arguments_are_refused(tmp_path):
    grid = ["--grid", "costs.penalty_per_1k=0,1,2"]
    assert sweep(tmp_path, *grid).exit_code == 0
    first = rows(tmp_path)
    lines = (tmp_path / "cells.jsonl").read_text().splitlines()
    (tmp_path / "cells.jsonl").write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    res = sweep(tmp_path, *grid)
    assert res.exit_code == 0, res.output
    assert "skipping 2 done before" in res.output and "running 1 cells" in res.output
    assert "1 run, 2 skipped" in res.output
    again = rows(tmp_path)
    assert [r["id"] for r in again] == [first[0]["id"], first[2]["id"], first[1]["id"]]
    assert again[2]["tokens_per_episode"] == first[1]["tokens_per_episode"]
    res = sweep(tmp_path, *grid)
    assert "3 run" not in res.output and "0 run, 3 skipped" in res.output
    res = sweep(tmp_path, "--grid", "costs.penalty_per_1k=0,1")
    assert res.exit_code == 2 and "holds another sweep" in res.output
    assert "grids" in res.output and "another --out" in res.output


def test_parallel_workers_give_the_same_numbers(tmp_path):
    grid = ["--grid", "topology.kind=star,debate", "--grid", "protocol.rounds=2"]
    for workers in ("1", "2"):
        res = runner.invoke(app, ["sweep", GATHER, "--policy", "random", "--episodes", "6",
                                  "--seed", "3", "--workers", workers, "--out",
                                  str(tmp_path / workers), *grid])
        assert res.exit_code == 0, res.output
    assert "on 2 workers" in res.output
    one, two = ({r["id"]: {k: v for k, v in r.items() if k != "wall_s"}
                 for r in rows(tmp_path / w)} for w in ("1", "2"))
    assert one == two and len(one) == 2
    for cell in one:
        assert (tmp_path / "1" / "cells" / cell / "episodes.jsonl").read_text() == (
            tmp_path / "2" / "cells" / cell / "episodes.jsonl").read_text()


def test_train_sweep_writes_a_run_per_cell(tmp_path):
    sets = [f"--set={s}" for s in ("iterations=1", "warmup_steps=1", "warmup_episodes=2",
                                   "eval_episodes=4", "episodes_per_iter=2", "group_size=2")]
    res = runner.invoke(app, ["sweep", SIGNAL, "--train",
                              str(ROOT / "configs" / "algorithm" / "magrpo.yaml"), *sets,
                              "--grid", "train.lr=0.001,0.002", "--workers", "1",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    cells = rows(tmp_path)
    assert [r["status"] for r in cells] == ["done", "done"]
    for r, lr in zip(cells, (0.001, 0.002), strict=True):
        run = tmp_path / r["run_dir"]
        assert (run / "metrics.jsonl").is_file() and (run / "summary.json").is_file()
        assert f"lr: {lr}" in (run / "config.yaml").read_text()
        assert r["iterations"] == 1 and 0.0 <= r["success_rate"] <= 1.0
        assert r["tokens_per_episode"] > 0 and r["predicted_exact"] is False
    res = runner.invoke(app, ["sweep", SIGNAL, "--train", "x.yaml", "--policy", "scripted",
                              "--grid", "train.lr=0.1", "--out", str(tmp_path / "no")])
    assert res.exit_code == 2 and "--policy only apply to evaluation sweeps" in res.output
