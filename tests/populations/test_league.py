"""Self-play leagues: PFSP weights and ratings with known answers, matches between known
players, and a small league on a local Ray."""

import json

import pytest
import torch

from marl.errors import MarlError
from marl.runner import build_policies
from marl.team import load_team
from populations.config import LeagueConfig
from populations.league import games, run_league
from populations.ratings import Ratings, pfsp_weights
from tests.marl.conftest import ROOT

CIPHER = ROOT / "scenarios" / "cipher.yaml"


@pytest.mark.parametrize(("kind", "expected"), [
    ("squared", [0.64 / 0.89, 0.25 / 0.89, 0.0]),
    ("variance", [0.16 / 0.41, 0.25 / 0.41, 0.0]),
    ("linear_capped", [0.5 / 1.0, 0.5 / 1.0, 0.0]),
    ("uniform", [1 / 3] * 3),
])
def test_pfsp_weights(kind, expected):
    assert pfsp_weights([0.2, 0.5, 1.0], kind) == pytest.approx(expected)


def test_ratings_follow_the_games():
    r = Ratings()
    for name in ("strong", "weak", "even_a", "even_b"):
        r.add(name)
    for _ in range(20):
        r.game("strong", "weak", 1.0)
        r.game("even_a", "even_b", 0.5)
    table = r.table()
    assert table["strong"]["mu"] > 25 > table["weak"]["mu"]
    assert table["even_a"]["mu"] == pytest.approx(table["even_b"]["mu"])
    assert table["strong"]["sigma"] < 25 / 3  # certainty grows with games
    assert table["strong"]["ordinal"] == pytest.approx(
        table["strong"]["mu"] - 3 * table["strong"]["sigma"])


def test_the_oracle_team_beats_random_play_on_both_sides():
    team = load_team(CIPHER)
    oracle, rand = build_policies(team, "scripted"), build_policies(team, "random")
    results = games(team, oracle, rand, episodes=200, seed=0)
    assert len(results) == 400
    # Its receiver always decodes; its eavesdropper reads random codes only by chance,
    # and the random receiver is as lucky as the random eavesdropper.
    assert sum(results) / len(results) > 0.6
    assert sum(games(team, oracle, oracle, episodes=50, seed=0)) / 100 == pytest.approx(0.5,
                                                                                       abs=0.2)


def small(**kw) -> LeagueConfig:
    base = {"generations": 2, "iterations_per_generation": 4, "match_episodes": 4,
            "snapshot_win_rate": 0.01,
            "train": {"warmup_steps": 2, "warmup_episodes": 4, "episodes_per_iter": 2,
                      "group_size": 4, "eval_episodes": 4}}
    return LeagueConfig.model_validate({**base, **kw})


def test_a_small_league_writes_snapshots_ratings_and_win_rates(ray_local, tmp_path):
    out = tmp_path / "league"
    result = run_league(CIPHER, small(), out, log=lambda m: None)
    # At this threshold the exploiter and then the main player join every generation.
    names = ["s000", "x001", "s002", "x003", "s004"]
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == sorted(names)
    saved = json.loads((out / "winrates.json").read_text())
    assert saved == result["winrates"] and saved["players"] == names
    m = saved["matrix"]
    assert all(m[i][i] is None for i in range(5))
    assert all(m[i][j] == pytest.approx(1 - m[j][i]) for i in range(5) for j in range(5)
               if i != j)
    assert set(json.loads((out / "ratings.json").read_text())) == set(names)
    assert (out / "league.png").stat().st_size > 0
    rows = [json.loads(x) for x in (out / "league.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and {r["side"] for r in rows} == {"red", "blue"}
    assert {r["player"] for r in rows} == {"main", "exploiter"}
    assert {r["opponent"] for r in rows if r["player"] == "exploiter"} == {"main"}
    assert len((out / "generations.jsonl").read_text().splitlines()) == 2
    team = load_team(CIPHER)
    first = build_policies(team, checkpoint=out / "snapshots" / "s000")
    last = build_policies(team, checkpoint=out / "snapshots" / "s004")
    for agent in team.ids:  # both teams trained
        assert any(not torch.equal(p, q) for p, q in zip(
            first[agent].parameters(), last[agent].parameters(), strict=True))
    with pytest.raises(MarlError, match="already holds a league"):
        run_league(CIPHER, small(), out, log=lambda m: None)


def test_a_league_needs_two_teams(tmp_path):
    with pytest.raises(MarlError, match="two teams"):
        run_league(ROOT / "scenarios" / "signal.yaml", small(), tmp_path / "l")


@pytest.mark.parametrize(("data", "fragment"), [
    ({"train": {"iterations": 5}}, "set by the league"),
    ({"train": {"lr": 0}}, "train.lr"),
    ({"pfsp": "hardest"}, "pfsp"),
])
def test_bad_league_configs_name_the_key(data, fragment):
    with pytest.raises(ValueError, match=fragment):
        LeagueConfig.model_validate(data)
