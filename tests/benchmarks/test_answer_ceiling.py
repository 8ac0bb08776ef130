"""The answer ceiling's script: an answerer beside an oracle team learns its part from the
right answers, and a bad variant name is refused with the list of variants."""

import importlib.util
import sys

import pytest

from tests.marl.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
spec = importlib.util.spec_from_file_location("answer_ceiling",
                                              ROOT / "benchmarks/answer_ceiling.py")
ceiling = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ceiling)


def test_a_lewis_listener_beside_the_oracle_learns_its_answers():
    lines = []
    rows = ceiling.ceiling(ceiling.variant_path("lewis_3_chain"), steps=60, batch_size=16,
                           lr=1e-3, every=30, episodes=32, log=lines.append)
    assert [r["step"] for r in rows] == [0, 30, 60] and len(lines) == 3
    assert rows[0]["success"] < 0.5 and rows[-1]["success"] > 0.9
    out = ceiling.summary(rows, scripted=1.0, floor=0.25)
    assert out["best"] == rows[-1]["success"] and out["to_0.8_step"] in (30, 60)
    assert ceiling.summary(rows, scripted=0.5, floor=0.5)["to_0.8_step"] is None


def test_an_unknown_variant_names_the_variants():
    with pytest.raises(SystemExit, match="lewis_3_chain"):
        ceiling.variant_path("no_such_variant")
