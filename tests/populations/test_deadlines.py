"""Every blocking Ray call has a deadline and ends in a clear message: a league's matches
(``marl.cluster.gather``) and the cells of ``marl sweep --ray``."""

import time

import pytest
from typer.testing import CliRunner

from marl.cli import app
from marl.cluster import gather
from marl.errors import MarlError
from tests.marl.conftest import ROOT


def test_a_blocking_ray_call_has_a_deadline_and_a_clear_message(ray_local):
    @ray_local.remote
    def slow() -> int:
        time.sleep(60)
        return 1

    @ray_local.remote
    def refuses() -> None:
        raise MarlError("the task's own words")

    @ray_local.remote
    def breaks() -> None:
        raise ValueError("boom")

    start = time.monotonic()
    with pytest.raises(MarlError, match=r"the slow task did not finish within 0.5 s.*"
                                        r"Raise match_timeout_s"):
        gather([slow.remote()], 0.5, "the slow task", "match_timeout_s")
    assert time.monotonic() - start < 10
    with pytest.raises(MarlError, match="^the task's own words$"):
        gather([refuses.remote()], 30, "a task", "x")
    with pytest.raises(MarlError, match="a task failed: ValueError: boom"):
        gather([breaks.remote()], 30, "a task", "x")
    assert gather([ray_local.put(3)], 5, "a value", "x") == [3]


def test_a_sweep_whose_cells_never_finish_stops_with_a_message(ray_local, tmp_path,
                                                               monkeypatch):
    import populations.cells

    monkeypatch.setattr(populations.cells, "STALL_S", 0.001)  # no cell is that fast
    res = CliRunner().invoke(app, ["sweep", str(ROOT / "scenarios" / "gather_star.yaml"),
                                   "--ray", "--out", str(tmp_path / "s"), "--grid",
                                   "protocol.rounds=1,2", "--policy", "random",
                                   "--episodes", "4"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "no sweep cell finished in 0.001 s (2 still running)" in res.output
