"""``marl sweep --ray``: the cells as Ray tasks give what worker processes give."""

import json

from typer.testing import CliRunner

from marl.cli import app
from tests.marl.conftest import ROOT

GATHER = str(ROOT / "scenarios" / "gather_star.yaml")


def _rows(out):
    return {r["id"]: {k: v for k, v in r.items() if k != "wall_s"}
            for r in map(json.loads, (out / "cells.jsonl").read_text().splitlines())}


def test_cells_on_ray_match_the_in_process_sweep(ray_local, tmp_path):
    grid = ["--grid", "topology.kind=star,debate", "--grid", "protocol.rounds=2",
            "--policy", "random", "--episodes", "6", "--seed", "3"]
    runner = CliRunner()
    local = runner.invoke(app, ["sweep", GATHER, "--workers", "1", "--out",
                                str(tmp_path / "local"), *grid])
    assert local.exit_code == 0, local.output
    on_ray = runner.invoke(app, ["sweep", GATHER, "--ray", "--out", str(tmp_path / "ray"),
                                *grid])
    assert on_ray.exit_code == 0, on_ray.output
    assert "cells on Ray" in on_ray.output
    assert _rows(tmp_path / "local") == _rows(tmp_path / "ray") != {}
    for cell in _rows(tmp_path / "ray"):
        assert (tmp_path / "ray" / "cells" / cell / "summary.json").is_file()
