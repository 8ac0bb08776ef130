"""The generality suite's script: its variants load, and its figures over seeds."""

import importlib.util
import sys

import pytest

from marl.team import load_team
from tests.marl.conftest import ROOT

spec = importlib.util.spec_from_file_location("generality", ROOT / "benchmarks/generality.py")
generality = importlib.util.module_from_spec(spec)
spec.loader.exec_module(generality)


@pytest.mark.parametrize("path", sorted(generality.VARIANTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_variant_loads(path):
    assert load_team(path).ids


def run(normalised, reach=None, iterations=100, habits=None):
    return {"best": normalised, "final": normalised, "normalised": normalised,
            "to_0.8_s": reach, "iterations": iterations, "habits": habits}


def test_habits_learnt_is_the_lowest_agent_at_the_warmups_last_evaluation():
    rows = [{"phase": "warmup", "habit_agreement": {"a": 0.1, "b": 0.2}},
            {"phase": "warmup", "sft_loss": 1.0},
            {"phase": "warmup", "habit_agreement": {"a": 0.9, "b": 0.4}},
            {"phase": "rl", "iteration": 1, "eval_success_rate": 0.5}]
    assert generality.habits_learnt(rows) == 0.4
    assert generality.habits_learnt(rows[3:]) is None  # no warm-up
    text = generality.table({"v": {"scripted": 1.0, "floor": 0.0, **run(0.5, habits=0.4)}})
    assert "| habits learnt |" in text and "| 100 | 0.40 |" in text


def test_over_seeds_takes_medians_and_counts_never_as_slowest():
    out = generality.over_seeds([run(0.1, None, 90, 0.2), run(0.9, 40, 100, 1.0),
                                 run(0.5, 60, 300, None)])
    assert out["normalised"] == 0.5 and out["iterations"] == 100
    assert out["habits"] == 0.6  # the median of the runs that had a warm-up
    assert out["to_0.8_s"] == 60  # never, 40, 60: the median is 60
    assert out["seeds"] == [0.1, 0.9, 0.5]
    assert generality.over_seeds([run(0.1), run(0.9, 40), run(0.2)])["to_0.8_s"] is None


def test_table_counts_each_variant_by_its_median():
    results = {"a": {"scripted": 1.0, "floor": 0.0, **generality.over_seeds(
                   [run(0.9, 10), run(0.85, 20), run(0.1)])},
               "b": {"scripted": 1.0, "floor": 0.0, **generality.over_seeds(
                   [run(0.9, 10), run(0.1), run(0.2)])}}
    text = generality.table(results)
    assert "normalised per seed" in text and "| 0.90, 0.85, 0.10 |" in text
    assert "1 of 2 variants" in text and "median over its seeds" in text


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0"], "at least one seed"),
    (["--seeds", "2", "--set", "seed=3"], "drop --set seed"),
])
def test_bad_seed_arguments_are_refused_before_anything_runs(monkeypatch, argv, message):
    monkeypatch.setattr(sys, "argv", ["generality.py", *argv])
    with pytest.raises(SystemExit, match=message):
        generality.main()
