from decimal import Decimal
from pathlib import Path

import pytest

from marl.cost.ledger import Ledger, make_row
from marl.cost.predict import predict_team
from marl.cost.prices import price_table, token_price
from marl.runner import run
from marl.team import load_team
from marl.testing import check_prediction
from orchestration.cost import TokenCounts, TokenPrice
from tests.marl.conftest import CODE_SCENARIOS, ROOT, SCENARIOS


@pytest.mark.parametrize(("path", "policy"),
                         [*((p, "scripted") for p in CODE_SCENARIOS),
                          *((p, "random") for p in SCENARIOS)],
                         ids=lambda x: getattr(x, "stem", x))
def test_measured_tokens_equal_prediction(path: Path, policy: str):
    check_prediction(load_team(path), policy, episodes=3, seed=5)


def test_prediction_detects_a_wrong_cost_model(monkeypatch):
    team = load_team(ROOT / "scenarios" / "gather_chain.yaml")
    import marl.cost.predict

    original = marl.cost.predict.expected_completion
    monkeypatch.setattr(marl.cost.predict, "expected_completion",
                        lambda team, a, r, b=None: original(team, a, r, b) + (a == "middle"))
    with pytest.raises(AssertionError):
        check_prediction(team, "scripted", episodes=1)


def test_row_cost_is_exact_decimal():
    price = token_price("gpt-4o-mini")
    row = make_row(0, 0, 0, "a", "gpt-4o-mini", price, prompt=1000, cached=400, completion=10,
                   received={"b": 7})
    expected = 600 * Decimal("1.5e-7") + 400 * Decimal("7.5e-8") + 10 * Decimal("6e-7")
    assert row.cost_usd == expected == Decimal("0.000126")
    assert row.to_json()["cost_usd"] == "0.000126000"
    assert row.to_json()["total_tokens"] == 1010


def test_price_overrides_and_fallback():
    p = token_price("gpt-4o", {"input_cost_per_token": Decimal("1e-6"),
                               "output_cost_per_token": None})
    assert p == TokenPrice(Decimal("1e-6"), Decimal("1.25e-6"), Decimal("1e-5"))
    assert all(isinstance(v, Decimal) for entry in price_table().values()
               for k, v in entry.items() if k.endswith("token") or k.endswith("cost"))


def test_aggregates_and_tensors():
    free = TokenPrice()
    rows = [make_row(0, 0, 0, "a", "m", free, 10, 0, 2, {}),
            make_row(0, 0, 1, "b", "m", free, 20, 0, 3, {"a": 5}),
            make_row(0, 1, 0, "a", "m", free, 30, 12, 2, {"b": 6}),
            make_row(1, 0, 0, "a", "m", free, 11, 0, 1, {})]
    ledger = Ledger(rows)
    assert ledger.per_agent() == {"a": TokenCounts(51, 12, 5), "b": TokenCounts(20, 0, 3)}
    assert ledger.per_round() == {0: TokenCounts(41, 0, 6), 1: TokenCounts(30, 12, 2)}
    assert ledger.per_episode()[1] == TokenCounts(11, 0, 1)
    assert ledger.per_edge() == {("a", "b"): 5, ("b", "a"): 6}
    assert ledger.total().total == 79
    paid = Ledger([make_row(3, 0, 0, "a", "m", TokenPrice(Decimal("0.5")), 4, 0, 0, {})])
    assert paid.cost_per_episode() == {3: Decimal("2.0")}
    t = ledger.to_tensors([0, 1], rounds=2, agents=["a", "b"])
    assert t["prompt"].shape == (2, 2, 2)
    assert t["prompt"][0, 1, 0] == 30 and t["cached"][0, 1, 0] == 12
    assert int(t["completion"].sum()) == 8


def test_run_ledger_matches_summary_costs():
    team = load_team(ROOT / "scenarios" / "relay_custom.yaml")  # price override + penalty
    result = run(team, 5, seed=0, policy="scripted")
    pred = predict_team(team, backend="scripted")
    assert result.ledger.cost() == 5 * pred.cost
    assert team.prices["coder"].input == Decimal("2.0e-7")
    first = result.episodes[0]
    assert first["token_penalty"] == pytest.approx(0.02 * first["tokens"] / 1000)
