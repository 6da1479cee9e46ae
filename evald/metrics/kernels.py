"""One vectorised, pure function per measure family.

Every kernel reads (n, depth) matrices and returns float64 values of shape (n,); none loops
over lists in Python. ``k`` is a cutoff or None for the whole stored list; ranks past a list's
end are zero-grade padding, so "k beyond the list length counts as non-relevant" needs no
special case. Divisions by a zero count give 0: a list with nothing relevant scores 0.

Sums over ranks run in rank order, one rank after the other (:func:`_rank_sum`), as trec_eval's
loops do: a list's value is then the same to the last bit whatever batch it is scored in. A
matrix product or numpy's pairwise ``sum`` groups the additions by the batch's padded width,
so the same list scored beside a longer one could differ in the last digit.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

#: pairwise kernels (Kendall tau) process at most this many (list, pair) cells at once
_PAIR_CELLS = 4_000_000


@lru_cache(maxsize=64)
def _ranks(width: int) -> np.ndarray:
    ranks = np.arange(1, width + 1, dtype=np.float64)
    ranks.setflags(write=False)
    return ranks


@lru_cache(maxsize=64)
def _log2_discount(width: int) -> np.ndarray:
    disc = 1.0 / np.log2(np.arange(2, width + 2, dtype=np.float64))
    disc.setflags(write=False)
    return disc


@lru_cache(maxsize=64)
def _geometric(p: float, width: int) -> np.ndarray:
    weights = (1.0 - p) * np.power(p, np.arange(width, dtype=np.float64))
    weights.setflags(write=False)
    return weights


def _rank_sum(matrix: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Per row, the sum over ranks of matrix (times weights) added in rank order; padding
    columns of zeros add exactly nothing, so the width of the batch cannot show."""
    terms = matrix if weights is None else matrix * weights
    if terms.shape[1] == 0:
        return np.zeros(terms.shape[0], dtype=np.float64)
    return np.cumsum(terms, axis=1, dtype=np.float64)[:, -1]


def _top(matrix: np.ndarray, k: int | None) -> np.ndarray:
    return matrix if k is None or k >= matrix.shape[1] else matrix[:, :k]


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def relevant_count(ideal: np.ndarray, rel: float) -> np.ndarray:
    """R: judged items with grade >= rel, served or not."""
    return np.count_nonzero(ideal >= rel, axis=1)


def hits(grades: np.ndarray, rel: float, k: int | None) -> np.ndarray:
    """Relevant items served in the top k."""
    return np.count_nonzero(_top(grades, k) >= rel, axis=1)


def precision(grades: np.ndarray, rel: float, k: int) -> np.ndarray:
    """P@k: relevant in the top k over k (missing ranks count as non-relevant)."""
    return hits(grades, rel, k) / float(k)


def recall(grades: np.ndarray, ideal: np.ndarray, rel: float, k: int | None) -> np.ndarray:
    """R@k: relevant in the top k over all judged relevant R."""
    return _ratio(hits(grades, rel, k), relevant_count(ideal, rel))


def f1(grades: np.ndarray, ideal: np.ndarray, rel: float, k: int) -> np.ndarray:
    """Harmonic mean of P@k and R@k; 0 when both are 0."""
    p = precision(grades, rel, k)
    r = recall(grades, ideal, rel, k)
    return _ratio(2.0 * p * r, p + r)


def _gain(grades: np.ndarray, exponential: bool) -> np.ndarray:
    return np.expm1(grades * np.log(2.0)) if exponential else grades


def cg(grades: np.ndarray, k: int | None) -> np.ndarray:
    """CG@k: sum of the grades in the top k."""
    return _rank_sum(_top(grades, k))


def dcg(grades: np.ndarray, k: int | None, exponential: bool = False) -> np.ndarray:
    """DCG@k with discount 1/log2(rank+1); gain = grade, or 2^grade - 1 if exponential."""
    top = _top(grades, k)
    return _rank_sum(_gain(top, exponential), _log2_discount(top.shape[1]))


def ndcg(
    grades: np.ndarray, ideal: np.ndarray, k: int | None, exponential: bool = False
) -> np.ndarray:
    """DCG@k over the DCG@k of all judged grades sorted (trec_eval ndcg / ndcg_cut_k)."""
    return _ratio(dcg(grades, k, exponential), dcg(ideal, k, exponential))


def average_precision(
    grades: np.ndarray, ideal: np.ndarray, rel: float, k: int | None, min_denominator: bool
) -> np.ndarray:
    """AP@k: sum of precision at each relevant rank <= k, over R (trec_eval) or min(k, R)."""
    relevant = _top(grades, k) >= rel
    found = np.cumsum(relevant, axis=1, dtype=np.int32)  # int cumsum: ~2x faster than float
    precision_sum = _rank_sum(found * relevant, 1.0 / _ranks(relevant.shape[1]))
    denominator = relevant_count(ideal, rel)
    if min_denominator and k is not None:
        denominator = np.minimum(denominator, k)
    return _ratio(precision_sum, denominator)


def reciprocal_rank(grades: np.ndarray, rel: float, k: int | None) -> np.ndarray:
    """1 / rank of the first relevant item within the top k, 0 if none."""
    relevant = _top(grades, k) >= rel
    first = relevant.argmax(axis=1)
    return np.where(relevant.any(axis=1), 1.0 / (first + 1.0), 0.0)


def success(grades: np.ndarray, rel: float, k: int) -> np.ndarray:
    """1 if any relevant item is in the top k."""
    return (_top(grades, k) >= rel).any(axis=1).astype(np.float64)


def rbp(
    grades: np.ndarray, ideal: np.ndarray, p: float, rel: float | None, k: int | None
) -> np.ndarray:
    """Rank-biased precision (1-p) sum p^(r-1) gain_r over the top k.

    gain is 1 for grade >= rel (binary, Moffat & Zobel 2008) or, when rel is None,
    grade / the list's highest judged grade (graded, bounded by 1).
    """
    top = _top(grades, k)
    if rel is None:
        gains = np.minimum(_ratio(top, ideal[:, :1]), 1.0)
    else:
        gains = (top >= rel).astype(np.float64)
    return _rank_sum(gains, _geometric(p, top.shape[1]))


def rbp_residual(
    judged: np.ndarray,
    lengths: np.ndarray,
    ideal: np.ndarray,
    p: float,
    k: int | None,
) -> np.ndarray:
    """Largest amount RBP could still grow: unjudged served ranks plus everything past the end.

    The evaluated depth is k with a cutoff (ranks past the served end inside k are known to be
    empty), else the served length. Lists with no judged-relevant item score 0, like every measure.
    """
    width = judged.shape[1] if k is None else min(k, judged.shape[1])
    served = np.arange(width) < lengths[:, None]
    unjudged = served & ~judged[:, :width]
    depth = lengths.astype(np.float64) if k is None else np.full(lengths.shape, float(k))
    residual = _rank_sum(unjudged, _geometric(p, width)) + np.power(p, depth)
    return np.where(ideal[:, 0] > 0, residual, 0.0) if ideal.shape[1] else residual * 0.0


def err(grades: np.ndarray, gmax: int, k: int | None) -> np.ndarray:
    """Expected reciprocal rank (Chapelle et al. 2009), R(g) = (2^g - 1) / 2^gmax.

    Grades above gmax are capped at gmax so every stop probability stays below 1.
    """
    top = np.minimum(_top(grades, k), float(gmax))
    stop = np.expm1(top * np.log(2.0)) / 2.0**gmax
    reach = np.cumprod(1.0 - stop, axis=1)
    reach = np.concatenate([np.ones((top.shape[0], 1)), reach[:, :-1]], axis=1)
    return _rank_sum(reach * stop, 1.0 / _ranks(top.shape[1]))


def auc(grades: np.ndarray, judged: np.ndarray, rel: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-list AUC over judged served items and the GAUC weight of each list.

    AUC = share of (relevant, judged non-relevant) pairs where the relevant item is served
    first; 0 when the list lacks either class. The weight is the number of judged served items
    for lists that have both classes, else 0 (such lists carry no ranking signal).
    """
    positive = judged & (grades >= rel)
    negative = judged & (grades < rel)
    negatives_below = np.cumsum(negative[:, ::-1], axis=1)[:, ::-1] - negative
    correct = np.where(positive, negatives_below, 0).sum(axis=1)
    pairs = np.count_nonzero(positive, axis=1) * np.count_nonzero(negative, axis=1)
    weights = np.where(pairs > 0, np.count_nonzero(judged, axis=1), 0).astype(np.float64)
    return _ratio(correct, pairs), weights


def kendall_tau_b(grades: np.ndarray, judged: np.ndarray) -> np.ndarray:
    """Kendall tau-b between served order (earlier = preferred) and grades, judged items only.

    Served ranks never tie, so tau-b = (C - D) / sqrt(n0 * (n0 - T)) with n0 the pairs and T the
    pairs of equal grade. Fewer than 2 judged items or all grades equal give 0.
    """
    n, width = grades.shape
    out = np.zeros(n, dtype=np.float64)
    if width < 2:
        return out
    first, second = np.triu_indices(width, 1)
    step = max(1, _PAIR_CELLS // first.size)
    for start in range(0, n, step):
        g = grades[start : start + step]
        j = judged[start : start + step]
        both = j[:, first] & j[:, second]
        diff = g[:, first] - g[:, second]
        score = np.where(both, np.sign(diff), 0.0).sum(axis=1)
        ties = np.count_nonzero(both & (diff == 0), axis=1)
        m = np.count_nonzero(j, axis=1).astype(np.float64)
        n0 = m * (m - 1) / 2.0
        out[start : start + step] = _ratio(score, np.sqrt(n0 * (n0 - ties)))
    return out
