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
    return np.asarray((_top(grades, k) >= rel).any(axis=1), dtype=np.float64)


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
    negatives_below: np.ndarray = np.cumsum(negative[:, ::-1], axis=1)[:, ::-1] - negative
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


# --- trec_eval's whole-list and set measures ---------------------------------------------------
# Each follows the C function of trec_eval named in its docstring, loop for loop where the
# order of floating-point operations could show.


def _served(lengths: np.ndarray, width: int) -> np.ndarray:
    return np.arange(width) < lengths[:, None]


def relevant_retrieved(grades: np.ndarray, rel: float) -> np.ndarray:
    """trec_eval ``num_rel_ret``: relevant items anywhere in the served list."""
    return np.count_nonzero(grades >= rel, axis=1).astype(np.float64)


def r_precision(grades: np.ndarray, ideal: np.ndarray, rel: float) -> np.ndarray:
    """trec_eval ``Rprec``: relevant items in the top R over R (0 when R = 0)."""
    r = relevant_count(ideal, rel)
    within = np.arange(grades.shape[1]) < r[:, None]
    return _ratio(np.count_nonzero((grades >= rel) & within, axis=1), r)


def set_precision(grades: np.ndarray, lengths: np.ndarray, rel: float) -> np.ndarray:
    """trec_eval ``set_P``: relevant served over served (0 for an empty list)."""
    return _ratio(relevant_retrieved(grades, rel), lengths)


def set_recall(grades: np.ndarray, ideal: np.ndarray, rel: float) -> np.ndarray:
    """trec_eval ``set_recall``: relevant served over R."""
    return _ratio(relevant_retrieved(grades, rel), relevant_count(ideal, rel))


def set_f(
    grades: np.ndarray, lengths: np.ndarray, ideal: np.ndarray, rel: float, beta: float
) -> np.ndarray:
    """trec_eval ``set_F.x``: (x + 1)·P·R / (x·P + R) over the whole served set, 0 when no
    relevant item is served. x is trec_eval's parameter as given (ir_measures' ``beta``)."""
    p = set_precision(grades, lengths, rel)
    r = set_recall(grades, ideal, rel)
    return _ratio((beta + 1.0) * p * r, beta * p + r)


def bpref(
    grades: np.ndarray, judged: np.ndarray, ideal: np.ndarray, judged_count: np.ndarray, rel: float
) -> np.ndarray:
    """trec_eval ``bpref``: per judged relevant served item, 1 − min(n, R) / min(N, R) with n the
    judged non-relevant items served above it and N all judged non-relevant items; over R."""
    r = relevant_count(ideal, rel)
    relevant = judged & (grades >= rel)
    nonrel = judged & (grades < rel)
    above: np.ndarray = np.cumsum(nonrel, axis=1) - nonrel
    r_col = r[:, None].astype(np.float64)
    cap = np.minimum(judged_count - r, r)[:, None].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        lost = np.minimum(above, r_col) / cap
    terms = np.where(relevant, np.where(above > 0, 1.0 - lost, 1.0), 0.0)
    return _ratio(_rank_sum(terms), r)


INFAP_EPSILON = 0.00001


def inferred_ap(
    grades: np.ndarray, judged: np.ndarray, ideal: np.ndarray, rel: float
) -> np.ndarray:
    """trec_eval ``infAP`` (Yilmaz & Aslam 2006) with every judgment known: unjudged served items
    count as outside the pool (skipped, but they move the ranks), none as pooled-but-unjudged."""
    relevant = judged & (grades >= rel)
    nonrel = judged & (grades < rel)
    rel_before: np.ndarray = (np.cumsum(relevant, axis=1) - relevant).astype(np.float64)
    nonrel_before = (np.cumsum(nonrel, axis=1) - nonrel).astype(np.float64)
    j = np.arange(grades.shape[1], dtype=np.float64)
    safe_j = np.where(j == 0, 1.0, j)
    with np.errstate(divide="ignore", invalid="ignore"):
        later = 1.0 / (j + 1.0) + (j / (j + 1.0)) * ((rel_before + nonrel_before) / safe_j) * (
            (rel_before + INFAP_EPSILON) / (rel_before + nonrel_before + 2 * INFAP_EPSILON)
        )
    terms = np.where(relevant, np.where(j == 0, 1.0, later), 0.0)
    return _ratio(_rank_sum(terms), relevant_count(ideal, rel))


def judged_at(judged: np.ndarray, k: int) -> np.ndarray:
    """Judged@k: judged items in the top k over k (missing ranks count as unjudged)."""
    return np.count_nonzero(_top(judged, k), axis=1) / float(k)


def interpolated_precision(
    grades: np.ndarray,
    lengths: np.ndarray,
    ideal: np.ndarray,
    rel: float,
    levels: tuple[float, ...],
) -> np.ndarray:
    """trec_eval ``iprec_at_recall``: per level, the highest precision at any rank at or after
    the one where recall reaches the level; shape (len(levels), n).

    The level becomes a count of relevant items as trec_eval 9.0.x (and pytrec_eval) do,
    ``(long)(level·R + 0.9)``; 10.0 rounds instead (``lround``), which can ask for one relevant
    item fewer (level 0.4 of R = 3: 2 items here, 1 in 10.0). A level beyond what the list
    reaches gives 0.
    """
    n, width = grades.shape
    relevant = (grades >= rel) & _served(lengths, width)
    found = np.cumsum(relevant, axis=1)
    precision_at = np.where(_served(lengths, width), found / _ranks(width), 0.0)
    best_after = np.maximum.accumulate(precision_at[:, ::-1], axis=1)[:, ::-1]
    r = relevant_count(ideal, rel).astype(np.float64)
    total = found[:, -1] if width else np.zeros(n, dtype=np.int64)
    out = np.zeros((len(levels), n), dtype=np.float64)
    if width == 0:
        return out
    rows = np.arange(n)
    for i, level in enumerate(levels):
        need = np.floor(level * r + 0.9).astype(np.int64)
        # rank index of the need-th relevant item (need 0: the first rank)
        at = np.argmax(found >= np.maximum(need, 1)[:, None], axis=1)
        value = best_after[rows, at]
        ok = (need <= total) & (lengths > 0)
        out[i] = np.where(ok, value, 0.0)
    return out


ELEVEN_POINTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def eleven_point_average(
    grades: np.ndarray, lengths: np.ndarray, ideal: np.ndarray, rel: float
) -> np.ndarray:
    """trec_eval ``11pt_avg``: interpolated precision averaged over recall 0, 0.1, ..., 1."""
    values = interpolated_precision(grades, lengths, ideal, rel, ELEVEN_POINTS)
    total = np.zeros(values.shape[1], dtype=np.float64)
    for row in values[::-1]:  # added in trec_eval's order, from the highest level down
        total = total + row
    return total / float(len(ELEVEN_POINTS))


MIN_GEO_MEAN = 0.00001


def geometric_terms(values: np.ndarray) -> np.ndarray:
    """trec_eval ``gm_map``'s per-query term: log(max(AP, 0.00001)); the mean is exp(mean)."""
    return np.log(np.maximum(values, MIN_GEO_MEAN))


def gain_dcg(
    grades: np.ndarray,
    judged: np.ndarray,
    ideal: np.ndarray,
    judged_count: np.ndarray,
    gains: dict[int, float],
    k: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """DCG@k and ideal DCG@k with trec_eval's gain map (``ndcg.1=3,2=9``): an integer grade in
    the map gets its gain, any other grade is its own gain, unjudged items gain 0; the ideal
    holds every judged item's gain > 0 (grade-0 items too, when the map gives 0 a gain)."""
    top = _top(grades, k)
    served_gain = np.where(_top(judged, k), _mapped(top, gains), 0.0)
    found = _rank_sum(served_gain, _log2_discount(top.shape[1]))
    positive = np.count_nonzero(ideal > 0, axis=1)
    zeros = judged_count - positive  # judged items of grade 0 (the ideal matrix omits them)
    zero_gain = float(gains.get(0, 0.0))
    columns = [np.where(ideal > 0, _mapped(ideal, gains), 0.0)]
    if zero_gain > 0 and ideal.shape[0]:
        width = int(zeros.max(initial=0))
        columns.append(np.where(np.arange(width) < zeros[:, None], zero_gain, 0.0))
    pool = np.concatenate(columns, axis=1)
    pool = np.where(pool > 0, pool, 0.0)
    best = _top(-np.sort(-pool, axis=1), k)
    return found, _rank_sum(best, _log2_discount(best.shape[1]))


def _mapped(grades: np.ndarray, gains: dict[int, float]) -> np.ndarray:
    out = grades.copy()
    for level, gain in gains.items():
        out[grades == level] = gain
    return out
