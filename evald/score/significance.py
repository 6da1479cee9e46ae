"""Paired significance tests between two runs' per-query values, and multiple-testing corrections.

Pure functions over float arrays, defined as scipy defines them so their values can be checked
against it: the paired t-test is ``scipy.stats.ttest_rel``; the randomization test is
``scipy.stats.permutation_test`` with ``permutation_type='samples'`` on the mean difference
(Fisher's randomization test, Smucker et al. 2007: under the null hypothesis each query's two
values are exchangeable, so each difference's sign is a coin flip). With at most
``permutations`` sign patterns in all (2^n ≤ permutations) every pattern is enumerated and the
p-value is exact, equal to scipy's; otherwise ``permutations`` patterns are drawn with numpy's
PCG64 generator from ``seed`` and the p-value is (hits + 1) / (permutations + 1) per tail, as
scipy computes it (it never reports 0). Two-sided p = 2 · min(tail p-values), at most 1.

Drawing costs O(queries × permutations) and memory at most :data:`_BLOCK` signs at a time,
whatever the number of queries: one random bit per sign, or, when the differences take few
distinct values (RR, P@k, binary measures), one binomial draw per distinct value: k equal
differences of which Binomial(k, ½) flip have the same null distribution as k coin flips.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

#: sign patterns enumerated per matrix product (exact test: at most 62 queries)
_CHUNK = 1_000
#: random signs drawn at once (patterns × queries): ~10 bytes each while they are summed, so
#: about 40 MB for 10 million queries as for 1 000
_BLOCK = 1 << 22
#: distinct differences per query below which they are drawn per value (binomially)
_GROUPED = 1 / 32


@dataclass(frozen=True)
class Randomization:
    """A randomization test's two-sided p-value and how it was obtained."""

    p: float
    permutations: int  # sign patterns evaluated (2^n when exact)
    exact: bool


def paired_t(baseline: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    """Two-sided paired t-test of ``other - baseline``: (t, p); NaN for fewer than 2 pairs or
    when every difference is 0 (scipy gives NaN there too); ±inf and p = 0 when the differences
    are all equal and not 0."""
    from scipy.special import stdtr  # Student t CDF; scipy.stats costs ~1 s to import

    d = np.asarray(other, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    n = d.shape[0]
    if n < 2:
        return math.nan, math.nan
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        if mean == 0.0:
            return math.nan, math.nan
        return math.copysign(math.inf, mean), 0.0
    t = mean / (sd / math.sqrt(n))
    return t, float(min(1.0, 2.0 * stdtr(n - 1, -abs(t))))


def randomization(
    baseline: np.ndarray, other: np.ndarray, *, permutations: int, seed: int
) -> Randomization:
    """Two-sided paired randomization test of the mean difference ``other - baseline``."""
    if permutations < 1:
        raise ValueError("permutations must be ≥ 1")
    d = np.asarray(other, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    n = d.shape[0]
    if n == 0:
        return Randomization(math.nan, 0, True)
    observed = float(d.mean())
    # Two sign patterns whose sums are equal in exact arithmetic can differ by rounding, by up to
    # a few ulps of the differences' scale: within 100 ulps of it, a null value counts as a tie.
    # scipy scales this tolerance by |observed| alone, so where patterns tie exactly (grades
    # such as 0.5 make that common) and the observed mean is near 0, its count can depend on
    # rounding; elsewhere the two agree (tests/score/test_significance.py).
    gamma = np.finfo(np.float64).eps * 100 * max(abs(observed), float(np.abs(d).mean()))
    exact = n < 63 and 2**n <= permutations
    less = greater = 0
    count = 2**n if exact else permutations
    for null in _exact_nulls(d) if exact else _sampled_nulls(d, count, seed):
        less += int(np.count_nonzero(null <= observed + gamma))
        greater += int(np.count_nonzero(null >= observed - gamma))
    if exact:
        p_less, p_greater = less / count, greater / count
    else:
        p_less, p_greater = (less + 1) / (count + 1), (greater + 1) / (count + 1)
    return Randomization(min(1.0, 2.0 * min(p_less, p_greater)), count, exact)


def _exact_nulls(d: np.ndarray) -> Iterator[np.ndarray]:
    """The mean of every sign pattern of ``d``, in blocks (pattern i flips the bits of i)."""
    n = d.shape[0]
    for start in range(0, 2**n, _CHUNK):
        rows = min(_CHUNK, 2**n - start)
        codes = np.arange(start, start + rows, dtype=np.int64)[:, None]
        signs = np.where((codes >> np.arange(n)) & 1, -1.0, 1.0)
        yield (signs * d).mean(axis=1)


def _sampled_nulls(d: np.ndarray, count: int, seed: int) -> Iterator[np.ndarray]:
    """The means of ``count`` random sign patterns of ``d``, in blocks: the sum of the
    differences less twice the sum of those flipped."""
    n = d.shape[0]
    total = float(d.sum())
    rng = np.random.default_rng(seed)
    values, sizes = np.unique(d[d != 0.0], return_counts=True)  # a 0 flipped stays 0
    if values.shape[0] <= n * _GROUPED:  # X_j ~ Binomial(k_j, 1/2) of the k_j equal d flip
        rows = max(1, _BLOCK // max(1, values.shape[0]))
        for start in range(0, count, rows):
            flipped = rng.binomial(sizes, 0.5, size=(min(rows, count - start), values.shape[0]))
            yield (total - 2.0 * (flipped @ values)) / n
        return
    rows, cols = max(1, _BLOCK // n), min(n, _BLOCK)
    for start in range(0, count, rows):
        flipped = np.zeros(min(rows, count - start))
        for low in range(0, n, cols):  # more queries than a block: columns in parts
            part = d[low : low + cols]
            size = flipped.shape[0] * ((part.shape[0] + 7) // 8)
            bits = np.frombuffer(rng.bytes(size), dtype=np.uint8).reshape(flipped.shape[0], -1)
            flipped += np.unpackbits(bits, axis=1, count=part.shape[0]) @ part
        yield (total - 2.0 * flipped) / n


def bonferroni(pvalues: list[float]) -> list[float]:
    """Each p-value times the number of tests, at most 1 (NaN stays NaN and is not counted)."""
    m = sum(1 for p in pvalues if not math.isnan(p))
    return [p if math.isnan(p) else min(1.0, p * m) for p in pvalues]


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment: the i-th smallest p-value (from 1) times (m − i + 1), made
    non-decreasing in that order, at most 1 (NaN stays NaN and is not counted)."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m = len(order)
    out = list(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


CORRECTIONS: dict[str, Callable[[list[float]], list[float]]] = {
    "holm": holm,
    "bonferroni": bonferroni,
    "none": list,
}
