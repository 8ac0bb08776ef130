"""Opponent sampling and ratings for self-play leagues: prioritised fictitious self-play
weights (AlphaStar) and Bayesian skill ratings from ``openskill`` (Weng-Lin
Plackett-Luce). Pure functions and a small object; Ray only schedules the matches."""

from __future__ import annotations

from typing import Literal

from openskill.models import PlackettLuce

Weighting = Literal["squared", "variance", "linear_capped", "uniform"]


def pfsp_weights(win_rates: list[float], kind: Weighting = "squared") -> list[float]:
    """Probabilities of drawing each opponent, from the learner's win rate ``x`` against
    it: ``squared`` (1 − x)² favours the hardest, ``variance`` x(1 − x) the even matches,
    ``linear_capped`` min(0.5, 1 − x) all but the beaten ones; uniform if every weight is 0.

    >>> pfsp_weights([0.0, 0.5, 1.0])
    [0.8, 0.2, 0.0]
    >>> pfsp_weights([0.0, 0.5, 1.0], "variance")
    [0.0, 1.0, 0.0]
    >>> pfsp_weights([1.0, 1.0])
    [0.5, 0.5]
    """
    if kind == "squared":
        raw = [(1 - x) ** 2 for x in win_rates]
    elif kind == "variance":
        raw = [x * (1 - x) for x in win_rates]
    elif kind == "linear_capped":
        raw = [min(0.5, 1 - x) for x in win_rates]
    else:
        raw = [1.0] * len(win_rates)
    total = sum(raw)
    if total <= 0:
        return [1 / len(win_rates)] * len(win_rates)
    return [w / total for w in raw]


class Ratings:
    """One openskill rating per player, updated game by game."""

    def __init__(self) -> None:
        self.model = PlackettLuce()
        self.players: dict[str, object] = {}

    def add(self, name: str) -> None:
        self.players.setdefault(name, self.model.rating(name=name))

    def game(self, a: str, b: str, score_a: float) -> None:
        """One game: ``score_a`` 1 (a won), 0.5 (a draw) or 0 (b won)."""
        ranks = [0, 0] if score_a == 0.5 else ([0, 1] if score_a > 0.5 else [1, 0])
        [[ra], [rb]] = self.model.rate([[self.players[a]], [self.players[b]]], ranks=ranks)
        self.players[a], self.players[b] = ra, rb

    def table(self) -> dict[str, dict[str, float]]:
        """Every player's ``mu``, ``sigma`` and ``ordinal`` (mu − 3σ, the conservative
        estimate to rank by)."""
        return {name: {"mu": r.mu, "sigma": r.sigma, "ordinal": r.ordinal()}
                for name, r in self.players.items()}
