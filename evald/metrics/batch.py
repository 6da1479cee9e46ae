"""Batch: many ranked lists as padded numpy matrices, the only input the kernels read.

Building a batch is the one place that touches Python lists; everything after it is
vectorised over the (n, depth) matrix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np


@dataclass(frozen=True)
class Batch:
    """Padded grade matrices for ``n`` ranked lists.

    ``grades[i, r]`` is the grade of the item served at rank ``r + 1`` of list ``i`` (0 when it is
    unjudged or the rank is padding); ``judged`` says which of those are judgments. ``ideal`` holds,
    per list, every judged grade > 0 (served or not) sorted descending and 0-padded: it gives both
    the ideal DCG and the number of relevant items at any threshold. ``lengths`` is the served
    length; it may exceed ``depth`` when the batch was cut to what the measures need.
    """

    grades: np.ndarray
    lengths: np.ndarray
    ideal: np.ndarray
    judged: np.ndarray

    def __post_init__(self) -> None:
        n = self.grades.shape[0]
        if self.grades.ndim != 2 or self.judged.shape != self.grades.shape:
            raise ValueError("grades and judged must be (n, depth) matrices of the same shape")
        if self.lengths.shape != (n,) or self.ideal.ndim != 2 or self.ideal.shape[0] != n:
            raise ValueError("lengths must be (n,) and ideal (n, m)")

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
        served: list[list[float]] = []
        flags: list[list[bool]] = []
        positives: list[list[float]] = []
        for ranking, judgments in zip(rankings, qrels, strict=True):
            if len(set(ranking)) != len(ranking):
                seen: set[str] = set()
                ranking = [_first_or_none(item, seen) for item in ranking]
            got = [judgments.get(item) if item is not None else None for item in ranking]
            served.append([0.0 if g is None else g for g in got])
            flags.append([g is not None for g in got])
            # `not g <= 0` keeps NaN so that _check_finite rejects it
            positives.append([g for g in judgments.values() if not g <= 0])
        lengths = np.fromiter((len(r) for r in rankings), dtype=np.int64, count=n)
        width = _width(lengths, depth)
        grades = _pad(served, lengths, width, np.float64)
        judged = _pad(flags, lengths, width, np.bool_)
        ideal = _sorted_desc(_pad(positives, None, None, np.float64))
        _check_finite(grades, ideal)
        np.maximum(grades, 0.0, out=grades)
        return cls(grades, lengths, ideal, judged)

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
            lengths = np.fromiter((len(g) for g in grades), dtype=np.int64, count=len(grades))
            full = _pad(grades, lengths, None, np.float64)
        _check_finite(full, full)
        full = np.maximum(full, 0.0)
        ideal = _sorted_desc(full)
        width = _width(lengths, depth)
        cut = full[:, :width] if width <= full.shape[1] else _widen(full, width)
        judged = np.arange(width) < lengths[:, None]
        return cls(np.ascontiguousarray(cut), lengths, ideal, judged)


def _first_or_none(item: str, seen: set[str]) -> str | None:
    if item in seen:
        return None
    seen.add(item)
    return item


def _width(lengths: np.ndarray, depth: int | None) -> int:
    if depth is not None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        return depth
    return max(int(lengths.max(initial=0)), 1)


def _pad(
    rows: Sequence[Sequence[float]] | Sequence[Sequence[bool]],
    lengths: np.ndarray | None,
    width: int | None,
    dtype: type,
) -> np.ndarray:
    """Left-aligned (n, width) matrix from ragged rows, truncating rows longer than width."""
    if lengths is None:
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    full_width = max(int(lengths.max(initial=0)), 1)
    out = np.zeros((len(rows), full_width), dtype=dtype)
    total = int(lengths.sum())
    if total:
        flat = np.fromiter(chain.from_iterable(rows), dtype=dtype, count=total)
        out[np.arange(full_width) < lengths[:, None]] = flat
    if width is None or width == full_width:
        return out
    return out[:, :width].copy() if width < full_width else _widen(out, width)


def _widen(matrix: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros((matrix.shape[0], width), dtype=matrix.dtype)
    out[:, : matrix.shape[1]] = matrix
    return out


def _sorted_desc(matrix: np.ndarray) -> np.ndarray:
    """Row-wise descending sort; zero padding stays at the end."""
    return -np.sort(-matrix, axis=1) if matrix.shape[1] > 1 else matrix.copy()


def _check_finite(*arrays: np.ndarray) -> None:
    for array in arrays:
        if not np.isfinite(array).all():
            raise ValueError("grades must be finite numbers (got NaN or infinity)")
