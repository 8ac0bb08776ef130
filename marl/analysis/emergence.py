"""Emergent-communication metrics: how much the messages say, how compositional they are,
and how much they change what the listener does.

Plain functions over Python sequences and numpy arrays; numpy only, no torch, no scipy.
Messages are strings (one character a symbol), meanings are tuples of attribute values.
Every information quantity (entropy, mutual information, causal influence) is in BITS
(log base 2).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from itertools import combinations, zip_longest

import numpy as np

CORRECTIONS = ("miller_madow", "none")
_PAD = None  # filler for short messages in posdis; never a character of a str


def _plugin_entropy(counts: Counter) -> float:
    """Plug-in entropy in bits of the distribution given by ``counts``."""
    n = sum(counts.values())
    h = -sum(c / n * math.log2(c / n) for c in counts.values())
    return h if h > 0.0 else 0.0  # not -0.0, nor rounding below zero


def _check_pairs(x: Sequence, y: Sequence, what: str) -> None:
    if len(x) != len(y):
        raise ValueError(f"{what}: {len(x)} values on one side but {len(y)} on the other.")
    if len(x) == 0:
        raise ValueError(f"{what}: no values (both sequences are empty).")


def entropy(symbols: Sequence[Hashable]) -> float:
    """Plug-in Shannon entropy H(M) = -sum_m p(m) log2 p(m) of the empirical distribution of
    whole messages (or any hashable symbols), in bits (Shannon 1948).

    >>> entropy(["ab", "ab", "cd", "ef"])  # p = (1/2, 1/4, 1/4)
    1.5
    >>> entropy(["a", "a"])
    0.0
    """
    if len(symbols) == 0:
        raise ValueError("entropy of no symbols is undefined (the sequence is empty).")
    return _plugin_entropy(Counter(symbols))


def mutual_information(x: Sequence[Hashable], y: Sequence[Hashable],
                       correction: str = "miller_madow") -> float:
    """Mutual information I(X;Y) = H(X) + H(Y) - H(X,Y) in bits, from the joint empirical
    distribution of the pairs (x[i], y[i]).

    The plug-in estimate is biased upward: for independent X and Y it is about
    (|X|-1)(|Y|-1) / (2 N ln 2) bits rather than 0 (Miller 1955; Paninski 2003).
    ``correction="miller_madow"`` (the default) adds the Miller-Madow term (m-1)/(2 N ln 2)
    to each of the three entropies, m being the number of distinct values observed, which
    removes most of that bias, then clips the result at 0 (the corrected value can go
    slightly negative, mutual information cannot). The correction can also lift a value a
    little above the plug-in one. ``correction="none"`` gives the plug-in estimate.

    >>> mutual_information([0, 0, 1, 1], [0, 0, 1, 1], correction="none")
    1.0
    >>> round(mutual_information([0, 0, 1, 1], [0, 0, 1, 1]), 4)  # 1 + 1 / (8 ln 2)
    1.1803
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"Unknown correction {correction!r}; valid ones are {CORRECTIONS}.")
    _check_pairs(x, y, "mutual_information")
    cx, cy, cxy = Counter(x), Counter(y), Counter(zip(x, y, strict=True))
    mi = _plugin_entropy(cx) + _plugin_entropy(cy) - _plugin_entropy(cxy)
    if correction == "none":
        return max(mi, 0.0)
    bias = (len(cx) - 1 + len(cy) - 1 - (len(cxy) - 1)) / (2 * len(x) * math.log(2))
    return max(mi + bias, 0.0)


def normalized_mutual_information(x: Sequence[Hashable], y: Sequence[Hashable]) -> float:
    """I(X;Y) / H(Y) with plug-in estimates: the share of Y's information that X carries,
    in [0, 1]; 0.0 when H(Y) = 0. With x the messages and y the sender's private input it
    measures speaker consistency (see :func:`speaker_consistency`).

    >>> normalized_mutual_information([0, 0, 1, 1], [0, 1, 2, 3])  # I = 1 bit, H(Y) = 2
    0.5
    """
    _check_pairs(x, y, "normalized_mutual_information")
    h_y = entropy(y)
    if h_y == 0.0:
        return 0.0
    return mutual_information(x, y, correction="none") / h_y


def speaker_consistency(messages: Sequence[Hashable], inputs: Sequence[Hashable]) -> float:
    """Positive signalling: I(M; X) / H(X), the share of the speaker's private input X
    that its messages M carry (plug-in estimates), as in Lowe et al. 2019, "On the pitfalls
    of measuring emergent communication". 1.0 when the input can be read off the message.

    >>> speaker_consistency(["a", "b", "a", "b"], [0, 1, 0, 1])
    1.0
    """
    return normalized_mutual_information(messages, inputs)


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest single-symbol insertions, deletions and
    substitutions turning ``a`` into ``b`` (Levenshtein 1966).

    >>> edit_distance("kitten", "sitting")
    3
    >>> edit_distance("", "abc")
    3
    """
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, tied values sharing the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]  # one past each tie group
    group_rank = (starts + ends + 1) / 2  # mean of ranks starts+1 .. ends
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(group_rank, ends - starts)
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation rho: the Pearson correlation of the ranks of x and of y,
    tied values getting the average of the ranks they span (Spearman 1904).

    NaN when either side is constant (its ranks have no variance; a single pair included).
    Raises ValueError on empty input, unequal lengths or NaN values.

    >>> spearman([1, 2, 3, 4], [1, 3, 2, 4])  # 1 - 6 * 2 / (4 * 15)
    0.8
    >>> round(spearman([1, 2, 2, 3], [1, 2, 3, 4]), 4)  # ties: sqrt(0.9)
    0.9487
    """
    _check_pairs(x, y, "spearman")
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if np.isnan(xa).any() or np.isnan(ya).any():
        raise ValueError("spearman: NaN among the values; drop those pairs first.")
    dx, dy = _average_ranks(xa), _average_ranks(ya)
    dx, dy = dx - dx.mean(), dy - dy.mean()
    sxx, syy = float(dx @ dx), float(dy @ dy)
    if sxx == 0.0 or syy == 0.0:
        return float("nan")
    return float(np.clip(dx @ dy / math.sqrt(sxx * syy), -1.0, 1.0))


def _check_items(meanings: Sequence[Sequence[Hashable]], messages: Sequence[str],
                 what: str) -> list[tuple]:
    """The meanings as tuples, after checking they match the messages and share a length."""
    _check_pairs(meanings, messages, what)
    tuples = [tuple(m) for m in meanings]
    lengths = sorted({len(m) for m in tuples})
    if len(lengths) > 1:
        raise ValueError(f"{what}: meanings have different numbers of attributes {lengths}.")
    return tuples


def _message_distance(a: str, b: str) -> float:
    """Edit distance over the mean length of the two messages (0 for two empty ones)."""
    mean_length = (len(a) + len(b)) / 2
    return edit_distance(a, b) / mean_length if mean_length else 0.0


def topographic_similarity(meanings: Sequence[Sequence[Hashable]],
                           messages: Sequence[str]) -> float:
    """Topographic similarity: Spearman's rho between the pairwise meaning distances
    (Hamming distance between attribute vectors) and the pairwise message distances (edit
    distance over the mean length of the two messages, as EGG computes it), over all
    unordered pairs i < j of the items given (Brighton & Kirby 2006; Lazaridou et al. 2018).

    It uses exactly the items given: pass distinct (meaning, message) items, or every
    episode (repeats then add zero-distance pairs and weigh frequent meanings more).
    NaN when either set of distances is constant (see :func:`spearman`).

    >>> topographic_similarity([(0, 0), (0, 1), (1, 0), (1, 1)], ["ac", "ad", "bc", "bd"])
    1.0
    """
    tuples = _check_items(meanings, messages, "topographic_similarity")
    if len(tuples) < 2:
        raise ValueError(f"topographic_similarity needs at least 2 items, got {len(tuples)}.")
    pairs = list(combinations(range(len(tuples)), 2))
    meaning_d = [sum(u != v for u, v in zip(tuples[i], tuples[j], strict=True)) for i, j in pairs]
    message_d = [_message_distance(messages[i], messages[j]) for i, j in pairs]
    return spearman(meaning_d, message_d)


def _information_gap(attributes: list[tuple], representation: Sequence[Hashable]) -> float:
    """(top I(r; a_k) - second I(r; a_k)) / H(r) in plug-in bits; NaN when H(r) = 0."""
    h = entropy(representation)
    if h == 0.0:
        return float("nan")
    mi = sorted((mutual_information(a, representation, correction="none")
                 for a in attributes), reverse=True)
    return (mi[0] - mi[1]) / h


def _mean_gap(meanings: Sequence[Sequence[Hashable]], messages: Sequence[str], what: str,
              representations: list[Sequence[Hashable]]) -> float:
    """Average information gap over the representations whose entropy is positive."""
    tuples = _check_items(meanings, messages, what)
    if len(tuples[0]) < 2:
        raise ValueError(f"{what} needs at least 2 attributes, got {len(tuples[0])}.")
    attributes = list(zip(*tuples, strict=True))
    gaps = [_information_gap(attributes, r) for r in representations]
    gaps = [g for g in gaps if not math.isnan(g)]
    return sum(gaps) / len(gaps) if gaps else 0.0


def posdis(meanings: Sequence[Sequence[Hashable]], messages: Sequence[str]) -> float:
    """Positional disentanglement (Chaabouni et al. 2020, "Compositionality and
    generalization in emergent languages"): for each message position j, the gap between
    the highest and second-highest I(m_j; a_k) over attributes k, divided by H(m_j);
    averaged over the positions with H(m_j) > 0 (0.0 when there are none).

    Plug-in mutual information and entropy, as in the paper. Messages shorter than the
    longest are padded with a filler symbol (None) that is in no message. Needs at least
    2 attributes.

    >>> posdis([(0, 0), (0, 1), (1, 0), (1, 1)], ["ac", "ad", "bc", "bd"])
    1.0
    """
    positions = list(zip_longest(*messages, fillvalue=_PAD))
    return _mean_gap(meanings, messages, "posdis", positions)


def bosdis(meanings: Sequence[Sequence[Hashable]], messages: Sequence[str]) -> float:
    """Bag-of-symbols disentanglement (Chaabouni et al. 2020): for each symbol s observed in
    the messages, n_s = how many times s occurs in a message; the gap between the highest
    and second-highest I(n_s; a_k) over attributes k, divided by H(n_s); averaged over the
    symbols with H(n_s) > 0 (0.0 when there are none). Plug-in estimates; needs at least
    2 attributes.

    >>> bosdis([(0, 0), (0, 1), (1, 0), (1, 1)], ["ac", "ad", "bc", "bd"])
    1.0
    """
    vocabulary = sorted(set().union(*messages))
    counts = [[m.count(s) for m in messages] for s in vocabulary]
    return _mean_gap(meanings, messages, "bosdis", counts)


def _check_distribution(p: np.ndarray, axis: int, what: str) -> None:
    if (p < 0).any() or np.isnan(p).any():
        raise ValueError(f"{what} has negative or NaN probabilities.")
    worst = float(np.abs(p.sum(axis=axis) - 1.0).max())
    if worst > 1e-6:
        raise ValueError(f"{what} does not sum to 1 (off by up to {worst:.3g}).")


def causal_influence(p_message: Sequence[float], p_answer: np.ndarray) -> float:
    """Causal influence of communication (Jaques et al. 2019; Lowe et al. 2019), in bits.

    ``p_message`` (C,) is the probability of each intervention message c; ``p_answer``
    (E, C, A) the listener's answer distribution in each of E contexts under do(message=c).
    Per context, p_e(a) = sum_c p(c) p_e(a|do(c)) and
    CIC_e = sum_c p(c) sum_a p_e(a|do(c)) log2(p_e(a|do(c)) / p_e(a)), with 0 log 0 = 0:
    the mutual information between intervened message and answer. Returns the mean over
    contexts. A listener that ignores messages scores exactly 0.

    It is a SUM over messages weighted by p(c), not a mean: one public implementation
    averages over messages to form p_e(a), which divides it by |C|, adds log2|C| to every
    term and scores a listener that ignores messages log2|C| instead of 0.

    >>> causal_influence([0.5, 0.5], np.eye(2)[None])  # answer = message
    1.0
    >>> causal_influence([0.5, 0.5], np.full((3, 2, 2), 0.5))
    0.0
    """
    p_c = np.asarray(p_message, dtype=float)
    p_ac = np.asarray(p_answer, dtype=float)
    if p_c.ndim != 1 or len(p_c) == 0:
        raise ValueError(f"p_message must have shape (C,) with C >= 1, got {p_c.shape}.")
    if p_ac.ndim != 3 or p_ac.shape[0] == 0 or p_ac.shape[1] != len(p_c):
        raise ValueError(f"p_answer must have shape (E, C={len(p_c)}, A) with E >= 1, "
                         f"got {p_ac.shape}.")
    _check_distribution(p_c, 0, "p_message")
    _check_distribution(p_ac, 2, "p_answer (a row over answers)")
    p_c = p_c / p_c.sum()
    # sum_c p(c) p(a|c) taken relative to the first row, so identical rows give it exactly
    first = p_ac[:, :1, :]
    marginal = first + np.einsum("c,eca->ea", p_c, p_ac - first)[:, None, :]
    marginal = np.maximum(marginal, (p_c[:, None] * p_ac).max(axis=1, keepdims=True))
    used = (p_ac > 0) & (p_c[None, :, None] > 0)
    ratio = np.where(used, p_ac, 1.0) / np.where(used, marginal, 1.0)
    terms = np.where(used, p_ac * np.log2(ratio), 0.0)
    per_context = np.einsum("c,eca->e", p_c, terms)
    return float(max(per_context.mean(), 0.0))


def counterfactual_importance(changed: np.ndarray | Sequence[Sequence[bool]]) -> np.ndarray:
    """Per-agent counterfactual effect, in the style of Jaques et al. 2019: ``changed[e, n]``
    says whether replacing agent n's output in episode e changed the team's answer; the
    result (N,) is the share of the E episodes in which it did, for each agent.

    >>> counterfactual_importance([[True, False], [True, True]])
    array([1. , 0.5])
    """
    arr = np.asarray(changed)
    if arr.ndim != 2:
        raise ValueError(f"changed must be an (episodes, agents) array, got shape {arr.shape}.")
    if arr.shape[0] == 0:
        raise ValueError("changed has no episodes (E = 0); the share is undefined.")
    if arr.dtype != bool and not np.isin(arr, (0, 1)).all():
        raise ValueError("changed must hold booleans (or 0/1), got other values.")
    return arr.astype(float).mean(axis=0)


def message_statistics(messages: Sequence[str]) -> dict[str, float]:
    """Summary of a batch of messages for the report: plug-in entropy of whole messages
    (bits), the number of distinct messages and the mean length in symbols.

    >>> message_statistics(["ab", "ab", "c", "d"])
    {'entropy': 1.5, 'distinct': 3, 'mean_length': 1.5}
    """
    return {"entropy": entropy(messages), "distinct": len(set(messages)),
            "mean_length": sum(len(m) for m in messages) / len(messages)}
