"""Rank-biased overlap (Webber, Moffat & Zobel 2010), the extrapolated variant RBO_ext.

Why RBO_ext: the lists compared are prefixes (the first ``depth`` items served), and RBO_ext
is the point estimate for such prefixes that assumes the agreement seen at the deepest rank
goes on below it (eq. 32 of the paper, for lists of unequal length as well). It is 1 for
identical prefixes and 0 for disjoint ones, where the minimum RBO_min (the lower bound) would
be below 1 for identical prefixes of a short depth. Pure: one function of two key sequences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["rbo_ext", "rbo_ext_rows"]


def rbo_ext(first: Sequence[int], second: Sequence[int], p: float) -> float:
    """RBO_ext of two ranked prefixes with persistence ``p`` (0 < p < 1).

    An item repeated within a list counts once (the overlap at depth d is that of the two
    prefixes' sets). One list empty: 0 (nothing in common); both empty: NaN (undefined)."""
    if len(first) == len(second) and first:
        return _rbo_ext_equal(first, second, p)
    return _rbo_ext_any(first, second, p)


def _rbo_ext_equal(first: Sequence[int], second: Sequence[int], p: float) -> float:
    """``_rbo_ext_any`` for two prefixes of one length, a third cheaper (the served lists'
    usual case, the signals' hot path): the same operations in the same order, so the same
    bits, without the unequal lengths' terms (then ``overlap_at_s`` is the final overlap)."""
    seen_first: set[int] = set()
    seen_second: set[int] = set()
    overlap = d = 0
    weighted = 0.0
    weight = 1.0
    for a, b in zip(first, second, strict=True):
        d += 1
        weight *= p
        if a not in seen_first:
            seen_first.add(a)
            if a in seen_second:
                overlap += 1
        if b not in seen_second:
            seen_second.add(b)
            if b in seen_first:
                overlap += 1
        weighted += overlap / d * weight
    return (1 - p) / p * weighted + overlap / d * weight


def rbo_ext_rows(first: np.ndarray, second: np.ndarray, p: float) -> np.ndarray:
    """``rbo_ext`` of each row pair of two (m, c) int arrays (c >= 1), bit for bit.

    Many lists' RBO at once in numpy, the same float operations in the same order as
    ``_rbo_ext_equal``: the overlaps are integers (an item shared by both prefixes, each
    counted once, joins the overlap at the deeper of its first ranks in the two, which is
    where the one-rank-at-a-time loop counts it), the weights the same running product, each
    rank's term ``overlap / d * weight`` and the weighted sum added one rank at a time, left
    to right (``np.add.accumulate`` is that sequential sum, unlike ``np.sum``)."""
    m, c = first.shape
    ranks = np.arange(c)
    across = first[:, :, None] == second[:, None, :]  # [row, rank in first, rank in second]
    in_second = across.argmax(axis=2)  # the first rank in second holding it (0: none)
    # an item of first's that second holds, at its first rank in first (argmax and a gather
    # of second at it: two .any over the short last axis cost twice as much)
    shared = second[np.arange(m)[:, None], in_second] == first
    shared &= (first[:, :, None] == first[:, None, :]).argmax(axis=2) == ranks
    joins = np.maximum(ranks, in_second)  # the deeper first rank
    rows, at = np.nonzero(shared)
    joined_at = np.bincount(rows * c + joins[rows, at], minlength=m * c).reshape(m, c)
    overlap = np.cumsum(joined_at, axis=1)  # integers: any summation order is exact
    weights = []
    weight = 1.0
    for _ in range(c):
        weight *= p
        weights.append(weight)
    terms = overlap / np.arange(1, c + 1) * np.asarray(weights)
    weighted = np.add.accumulate(terms, axis=1)[:, -1]
    return (1 - p) / p * weighted + overlap[:, c - 1] / c * weight


def _rbo_ext_any(first: Sequence[int], second: Sequence[int], p: float) -> float:
    if len(first) > len(second):
        first, second = second, first
    s, l = len(first), len(second)  # noqa: E741 (the paper's names)
    if l == 0:
        return math.nan
    if s == 0:
        return 0.0
    seen_short: set[int] = set()
    seen_long: set[int] = set()
    overlap = 0
    weighted = 0.0
    weight = 1.0
    overlap_at_s = 0
    for d in range(1, l + 1):
        weight *= p
        if d <= s:
            a = first[d - 1]
            if a not in seen_short:
                seen_short.add(a)
                if a in seen_long:
                    overlap += 1
        b = second[d - 1]
        if b not in seen_long:
            seen_long.add(b)
            if b in seen_short:
                overlap += 1
        if d == s:
            overlap_at_s = overlap
        weighted += overlap / d * weight
        if d > s:
            weighted += overlap_at_s * (d - s) / (s * d) * weight
    tail = ((overlap - overlap_at_s) / l + overlap_at_s / s) * weight
    return (1 - p) / p * weighted + tail
