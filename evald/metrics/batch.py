"""Batch: many ranked lists as padded numpy matrices, the only input the kernels read.

Building a batch is the one place that touches Python lists; everything after it is
vectorised over the (n, depth) matrix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, methodcaller

import numpy as np


@dataclass(frozen=True)
class Batch:
    """Padded grade matrices for ``n`` ranked lists.

    ``grades[i, r]`` is the grade of the item served at rank ``r + 1`` of list ``i`` (0 when it is
    unjudged or the rank is padding); ``judged`` says which of those are judgments. ``ideal`` holds,
    per list, every judged grade > 0 (served or not) sorted descending and 0-padded: it gives both
    the ideal DCG and the number of relevant items at any threshold. ``lengths`` is the served
    length; it may exceed ``depth`` when the batch was cut to what the measures need.
    ``judged_count`` is the number of judged items per list, served or not, whatever their grade
    (bpref's non-relevant pool); None means every judged item was served, as in the streaming
    path, where it equals ``lengths``.
    """

    grades: np.ndarray
    lengths: np.ndarray
    ideal: np.ndarray
    judged: np.ndarray
    judged_count: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.grades.shape[0]
        if self.grades.ndim != 2 or self.judged.shape != self.grades.shape:
            raise ValueError("grades and judged must be (n, depth) matrices of the same shape")
        if self.lengths.shape != (n,) or self.ideal.ndim != 2 or self.ideal.shape[0] != n:
            raise ValueError("lengths must be (n,) and ideal (n, m)")
        if self.judged_count is not None and self.judged_count.shape != (n,):
            raise ValueError("judged_count must be (n,)")

    @property
    def judged_total(self) -> np.ndarray:
        """Judged items per list, served or not (the served length when not given)."""
        return self.lengths if self.judged_count is None else self.judged_count

    @property
    def n(self) -> int:
        return int(self.grades.shape[0])

    @property
    def depth(self) -> int:
        return int(self.grades.shape[1])

    @property
    def truncated(self) -> bool:
        """True if some served list is longer than the stored depth."""
        return bool(self.n and int(self.lengths.max(initial=0)) > self.depth)

    @classmethod
    def from_lists(
        cls,
        rankings: Sequence[Sequence[str]],
        qrels: Sequence[Mapping[str, float]],
        depth: int | None = None,
    ) -> Batch:
        """Batch from served item ids and per-list judgments (``evald score``).

        An item absent from its list's qrels is unjudged (grade 0). A repeated item counts once,
        at its first rank; later copies are unjudged padding-like ranks (grade 0). Negative grades
        mean judged non-relevant (as in trec_eval); NaN or infinite grades raise ValueError.
        """
        if len(rankings) != len(qrels):
            raise ValueError(f"{len(rankings)} rankings but {len(qrels)} qrels")
        n = len(rankings)
        lengths = np.fromiter(map(len, rankings), dtype=np.int64, count=n)
        total = int(lengths.sum())
        if sum(map(len, map(set, rankings))) != total:  # some list repeats an item
            items: Sequence[Sequence[object]] = [
                r if len(set(r)) == len(r) else _first_copies(r) for r in rankings
            ]
        else:
            items = rankings
        # Every per-item step below is a C-level iterator (map / chain / fromiter): this is the
        # one place a batch touches Python objects.
        lookups = map(map, map(_getter, qrels), items, repeat(_UNJUDGED))
        served = np.fromiter(chain.from_iterable(lookups), dtype=np.float64, count=total)
        counts = np.fromiter(map(len, qrels), dtype=np.int64, count=n)
        values = chain.from_iterable(map(_values, qrels))
        judgments = np.fromiter(values, dtype=np.float64, count=int(counts.sum()))
        return cls.from_flat(lengths, served, counts, judgments, depth)

    @classmethod
    def from_flat(
        cls,
        lengths: np.ndarray,
        served: np.ndarray,
        counts: np.ndarray,
        judgments: np.ndarray,
        depth: int | None = None,
    ) -> Batch:
        """``from_lists`` on lists already turned into numbers: ``served`` holds each list's
        grades in served order, concatenated (NaN where the item is unjudged), ``lengths`` the
        served length of each list; ``judgments`` each list's judged grades (served or not),
        concatenated, ``counts`` how many per list. A reader can so look grades up while its
        objects are fresh and drop them before the batch is built."""
        full = _pad(served, lengths, _width(lengths, depth), fill=math.nan)  # NaN: unjudged
        padded = _pad(judgments, counts)
        _check_finite(padded)  # every served grade is one of these
        judged = ~np.isnan(full)
        grades = np.where(judged, full, 0.0)
        np.maximum(grades, 0.0, out=grades)
        # the ideal keeps grades > 0 only: negatives and zeros sort to the zero padding, which
        # is then cut to the widest list's count of positive grades
        ideal = _sorted_desc(np.maximum(padded, 0.0, out=padded))
        positive = int(np.count_nonzero(ideal, axis=1).max(initial=0))
        ideal = np.ascontiguousarray(ideal[:, : max(positive, 1)])
        return cls(grades, lengths, ideal, judged, np.asarray(counts, dtype=np.int64))

    @classmethod
    def from_served_grades(
        cls, grades: Sequence[Sequence[float]] | np.ndarray, depth: int | None = None
    ) -> Batch:
        """Batch where every served item is judged (streaming: grades from feedback).

        The ideal ranking is the served grades sorted, so unserved items never count.
        """
        if isinstance(grades, np.ndarray) and grades.ndim == 2:
            full = np.asarray(grades, dtype=np.float64)
            lengths = np.full(full.shape[0], full.shape[1], dtype=np.int64)
        else:
            lengths = np.fromiter(map(len, grades), dtype=np.int64, count=len(grades))
            full = _pad(list(chain.from_iterable(grades)), lengths, None)
        _check_finite(full)
        full = np.maximum(full, 0.0)
        ideal = _sorted_desc(full)
        width = _width(lengths, depth)
        cut = np.ascontiguousarray(full[:, :width]) if width < full.shape[1] else full
        judged = np.arange(width) < lengths[:, None]
        return cls(cut, lengths, ideal, judged)


_REPEATED = object()  # stands in for a repeated item id: never a qrels key
_UNJUDGED = repeat(math.nan)  # the default of every qrels lookup (one shared endless iterator)
_getter = attrgetter("get")
_values = methodcaller("values")


def _first_copies(ranking: Sequence[str]) -> list[object]:
    """The ranking with every repeat of an item replaced by a marker no judgment matches."""
    seen: set[str] = set()
    out: list[object] = []
    for item in ranking:
        out.append(_REPEATED if item in seen else item)
        seen.add(item)
    return out


def _width(lengths: np.ndarray, depth: int | None) -> int:
    """Stored depth: the requested one, never deeper than the longest list (ranks past every
    list's end are non-relevant to the kernels anyway), at least 1."""
    longest = max(int(lengths.max(initial=0)), 1)
    if depth is None:
        return longest
    if depth < 1:
        raise ValueError("depth must be >= 1")
    return min(depth, longest)


def _pad(
    flat: Sequence[float] | np.ndarray,
    lengths: np.ndarray,
    width: int | None = None,
    fill: float = 0.0,
) -> np.ndarray:
    """Left-aligned float64 (n, width) matrix from concatenated rows, cut at width.

    A cut row's tail is dropped from ``flat`` before the copy, so the full-width matrix of a
    batch cut to the measures' depth is never built.
    """
    longest = max(int(lengths.max(initial=0)), 1)
    values = np.asarray(flat, dtype=np.float64)
    if width is not None and width < longest:
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        values = values[np.arange(values.shape[0]) - starts < width]
        longest = width
    out = np.full((lengths.shape[0], longest), fill, dtype=np.float64)
    if values.shape[0]:
        out[np.arange(longest) < lengths[:, None]] = values
    return out


def _sorted_desc(matrix: np.ndarray) -> np.ndarray:
    """Row-wise descending sort; zero padding stays at the end."""
    return -np.sort(-matrix, axis=1) if matrix.shape[1] > 1 else matrix.copy()


def _check_finite(*arrays: np.ndarray) -> None:
    for array in arrays:
        if not np.isfinite(array).all():
            raise ValueError("grades must be finite numbers (got NaN or infinity)")
