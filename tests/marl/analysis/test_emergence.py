import math
import subprocess
import sys

import numpy as np
import pytest

from marl.analysis.emergence import (
    bosdis,
    causal_influence,
    counterfactual_importance,
    edit_distance,
    entropy,
    message_statistics,
    mutual_information,
    normalized_mutual_information,
    posdis,
    speaker_consistency,
    spearman,
    topographic_similarity,
)

MEANINGS = [(a0, a1) for a0 in range(4) for a1 in range(4)]
COMPOSITIONAL = ["abcd"[a0] + "efgh"[a1] for a0, a1 in MEANINGS]
SWAPPED = ["efgh"[a1] + "abcd"[a0] for a0, a1 in MEANINGS]
# The same 16 distinct two-letter messages, assigned to meanings at random.
HOLISTIC = [COMPOSITIONAL[i] for i in np.random.default_rng(0).permutation(16)]


def test_no_torch_import():
    code = "import sys, marl.analysis.emergence; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_entropy_hand_values():
    assert entropy(["a", "b", "c", "d"]) == pytest.approx(2.0)
    assert entropy(["ab", "ab", "cd", "ef"]) == pytest.approx(1.5)
    assert entropy(["x"] * 5) == 0.0
    with pytest.raises(ValueError, match="empty"):
        entropy([])


def test_mutual_information_hand_values_and_errors():
    x = [0, 1, 2, 3] * 5
    assert mutual_information(x, x, correction="none") == pytest.approx(2.0)
    assert normalized_mutual_information([0, 0, 1, 1], [0, 1, 2, 3]) == pytest.approx(0.5)
    assert normalized_mutual_information([0, 1], [7, 7]) == 0.0
    assert speaker_consistency(["a", "b", "c", "d"], [3, 2, 1, 0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="3 values on one side but 2"):
        mutual_information([0, 1, 2], [0, 1])
    with pytest.raises(ValueError, match="miller_madow"):
        mutual_information([0, 1], [0, 1], correction="jackknife")


def test_miller_madow_reduces_upward_bias_of_independent_variables():
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 8, 2000).tolist(), rng.integers(0, 8, 2000).tolist()
    plugin = mutual_information(x, y, correction="none")
    corrected = mutual_information(x, y)
    assert plugin > 0.005
    assert 0.0 <= corrected < plugin
    assert corrected < 0.01


@pytest.mark.parametrize("a, b, d", [("kitten", "sitting", 3), ("", "", 0), ("", "abc", 3),
                                     ("abc", "abc", 0), ("ab", "ba", 2), ("flaw", "lawn", 2)])
def test_edit_distance(a, b, d):
    assert edit_distance(a, b) == d
    assert edit_distance(b, a) == d


def test_spearman_with_ties():
    x, y = [1, 2, 2, 3], [1, 2, 3, 4]
    assert spearman(x, y) == pytest.approx(math.sqrt(0.9))  # ranks (1, 2.5, 2.5, 4)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(1)
    u, v = rng.integers(0, 4, 30).astype(float), rng.integers(0, 5, 30).astype(float)
    # Pearson on pandas' average ranks (its method="spearman" needs scipy, not installed).
    expected = pd.Series(u).rank().corr(pd.Series(v).rank())
    assert spearman(u.tolist(), v.tolist()) == pytest.approx(expected, abs=1e-12)


def test_spearman_nan_on_constant_and_errors():
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5]))
    with pytest.raises(ValueError, match="empty"):
        spearman([], [])
    with pytest.raises(ValueError, match="NaN"):
        spearman([1.0, float("nan")], [1.0, 2.0])


def test_compositional_code_scores_one():
    assert topographic_similarity(MEANINGS, COMPOSITIONAL) == pytest.approx(1.0, abs=1e-9)
    assert posdis(MEANINGS, COMPOSITIONAL) == pytest.approx(1.0)
    assert bosdis(MEANINGS, COMPOSITIONAL) == pytest.approx(1.0)
    assert posdis(MEANINGS, SWAPPED) == pytest.approx(1.0)


def test_holistic_code_scores_low():
    assert abs(topographic_similarity(MEANINGS, HOLISTIC)) < 0.3
    assert posdis(MEANINGS, HOLISTIC) < 0.5


def test_disentanglement_edge_cases():
    meanings = [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert posdis(meanings, ["z", "z", "z", "z"]) == 0.0  # no informative position
    # "a"/"b" carries attribute 0; the padded second position carries attribute 1.
    assert posdis(meanings, ["a", "ac", "b", "bc"]) == pytest.approx(1.0)
    assert bosdis(meanings, ["a", "ac", "b", "bc"]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 2 attributes"):
        posdis([(0,), (1,)], ["a", "b"])
    with pytest.raises(ValueError, match="different numbers of attributes"):
        bosdis([(0, 1), (1,)], ["a", "b"])


def test_topographic_similarity_errors_and_empty_messages():
    with pytest.raises(ValueError, match="3 values on one side but 2"):
        topographic_similarity([(0,), (1,), (2,)], ["a", "b"])
    with pytest.raises(ValueError, match="at least 2 items"):
        topographic_similarity([(0,)], ["a"])
    # Two empty messages are at distance 0, like equal meanings.
    rho = topographic_similarity([(0, 0), (0, 0), (1, 1)], ["", "", "ab"])
    assert rho == pytest.approx(1.0)


def test_causal_influence_known_values():
    rows = np.array([0.2, 0.3, 0.5])
    ignoring = np.tile(rows, (5, 4, 1))
    assert causal_influence([0.25] * 4, ignoring) == 0.0
    assert causal_influence([0.7, 0.1, 0.15, 0.05], ignoring) == 0.0
    bijective = np.eye(4)[None].repeat(3, axis=0)
    assert causal_influence([0.25] * 4, bijective) == pytest.approx(2.0)
    # Mean over contexts: one context copies the message, the other ignores it.
    mixed = np.stack([np.eye(2), np.full((2, 2), 0.5)])
    assert causal_influence([0.5, 0.5], mixed) == pytest.approx(0.5)


def test_causal_influence_errors():
    with pytest.raises(ValueError, match="p_message does not sum to 1"):
        causal_influence([0.5, 0.4], np.full((1, 2, 2), 0.5))
    with pytest.raises(ValueError, match="negative"):
        causal_influence([1.5, -0.5], np.full((1, 2, 2), 0.5))
    with pytest.raises(ValueError, match=r"shape \(E, C=2, A\)"):
        causal_influence([0.5, 0.5], np.full((1, 3, 2), 0.5))
    with pytest.raises(ValueError, match=r"shape \(C,\)"):
        causal_influence([[0.5, 0.5]], np.full((1, 2, 2), 0.5))
    with pytest.raises(ValueError, match="p_answer .* does not sum to 1"):
        causal_influence([0.5, 0.5], np.full((1, 2, 2), 0.4))


def test_counterfactual_importance():
    changed = [[True, False, False], [True, True, False], [False, True, False],
               [True, False, False]]
    np.testing.assert_allclose(counterfactual_importance(changed), [0.75, 0.5, 0.0])
    with pytest.raises(ValueError, match="E = 0"):
        counterfactual_importance(np.zeros((0, 3), dtype=bool))
    with pytest.raises(ValueError, match="shape"):
        counterfactual_importance([True, False])


def test_message_statistics():
    stats = message_statistics(["ab", "ab", "c", "d"])
    assert stats == {"entropy": pytest.approx(1.5), "distinct": 3, "mean_length": 1.5}
