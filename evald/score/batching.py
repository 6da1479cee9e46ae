"""Ranked lists as flat numeric columns, turned into the metric engine's :class:`Batch`.

``Batch.from_lists`` looks every served docid up in its list's qrels when a whole batch (10 000
lists) is scored; by then the lists' Python objects have left the CPU cache, and that look-up
measured about twice as slow as the same look-up done on a chunk of a few hundred lists just
read. So the command does the look-ups per chunk, while the objects are fresh, keeps only
numbers (:class:`Lists`), and lets the Python objects go. :func:`build_batch` then pads the
numbers into exactly the matrices ``Batch.from_lists`` builds (a property test checks they are
equal, array for array), so every value is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, methodcaller

import numpy as np

from evald.metrics import Batch
from evald.score.records import Qid

_UNJUDGED = repeat(math.nan)  # the default of every qrels look-up (one shared endless iterator)
_getter = attrgetter("get")
_values = methodcaller("values")


@dataclass(frozen=True, slots=True)
class Lists:
    """``n`` ranked lists as numbers: enough to build their batch, and their qids for the rows.

    ``served`` holds each list's grades in served order, concatenated, NaN where the docid is
    unjudged; ``judgments`` each list's judged grades (served or not), concatenated.
    """

    qids: list[Qid]
    lengths: np.ndarray  # int64 (n,): served length of each list
    served: np.ndarray  # float64 (lengths.sum(),)
    counts: np.ndarray  # int64 (n,): judgments of each list
    judgments: np.ndarray  # float64 (counts.sum(),)

    def __len__(self) -> int:
        return len(self.qids)

    def slice(self, start: int, stop: int) -> Lists:
        """Lists ``start`` to ``stop`` (exclusive), as views where numpy allows."""
        lo, hi = int(self.lengths[:start].sum()), int(self.lengths[:stop].sum())
        jlo, jhi = int(self.counts[:start].sum()), int(self.counts[:stop].sum())
        return Lists(
            self.qids[start:stop],
            self.lengths[start:stop],
            self.served[lo:hi],
            self.counts[start:stop],
            self.judgments[jlo:jhi],
        )


def lists_from(
    qids: Sequence[Qid], rankings: Sequence[Sequence[str]], qrels: Sequence[Mapping[str, float]]
) -> Lists:
    """Look every served docid up in its qrels, with C-level maps only.

    Every ranking must hold distinct docids (both readers reject a repeat); grades are read as
    float64, which the readers have checked they fit.
    """
    n = len(qids)
    if not n == len(rankings) == len(qrels):
        raise ValueError("qids, rankings and qrels must be as long as each other")
    lengths = np.fromiter(map(len, rankings), dtype=np.int64, count=n)
    lookups = map(map, map(_getter, qrels), rankings, repeat(_UNJUDGED))
    served = np.fromiter(chain.from_iterable(lookups), dtype=np.float64, count=int(lengths.sum()))
    counts = np.fromiter(map(len, qrels), dtype=np.int64, count=n)
    judgments = np.fromiter(
        chain.from_iterable(map(_values, qrels)), dtype=np.float64, count=int(counts.sum())
    )
    return Lists(list(qids), lengths, served, counts, judgments)


def concat(parts: Sequence[Lists]) -> Lists:
    """One :class:`Lists` of all the parts' lists, in order."""
    if len(parts) == 1:
        return parts[0]
    return Lists(
        list(chain.from_iterable(p.qids for p in parts)),
        _cat([p.lengths for p in parts], np.int64),
        _cat([p.served for p in parts], np.float64),
        _cat([p.counts for p in parts], np.int64),
        _cat([p.judgments for p in parts], np.float64),
    )


def _cat(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def widths(lists: Lists, depth: int | None) -> np.ndarray:
    """Matrix row width each list needs: its served ranks up to ``depth``, its judgments (the
    ideal matrix is as wide as the judgments), at least 1."""
    served = lists.lengths if depth is None else np.minimum(lists.lengths, depth)
    return np.maximum(np.maximum(served, lists.counts), 1)


def build_batch(lists: Lists, depth: int | None) -> Batch:
    """The batch ``Batch.from_lists`` builds from the same lists and ``depth``, array for array.

    Raises ValueError on a NaN or infinite judgment, as ``Batch.from_lists`` does.
    """
    lengths = lists.lengths
    full = _pad(lists.served, lengths, _width(lengths, depth), fill=math.nan)  # NaN: unjudged
    judgments = _pad(lists.judgments, lists.counts)
    if not np.isfinite(judgments).all():  # every served grade is one of these
        raise ValueError("grades must be finite numbers (got NaN or infinity)")
    judged = ~np.isnan(full)
    grades = np.where(judged, full, 0.0)
    np.maximum(grades, 0.0, out=grades)
    # the ideal keeps grades > 0 only: negatives and zeros sort to the zero padding, which is
    # then cut to the widest list's count of positive grades
    np.maximum(judgments, 0.0, out=judgments)
    ideal = -np.sort(-judgments, axis=1) if judgments.shape[1] > 1 else judgments
    positive = int(np.count_nonzero(ideal, axis=1).max(initial=0))
    ideal = np.ascontiguousarray(ideal[:, : max(positive, 1)])
    return Batch(grades, lengths, ideal, judged)


def _width(lengths: np.ndarray, depth: int | None) -> int:
    """Stored depth: ``depth``, never deeper than the longest list, at least 1."""
    longest = max(int(lengths.max(initial=0)), 1)
    return longest if depth is None else min(depth, longest)


def _pad(
    flat: np.ndarray, lengths: np.ndarray, width: int | None = None, fill: float = 0.0
) -> np.ndarray:
    """Left-aligned float64 (n, width) matrix of concatenated rows, each cut at ``width``."""
    longest = max(int(lengths.max(initial=0)), 1)
    if width is not None and width < longest:
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        flat = flat[np.arange(flat.shape[0]) - starts < width]
        longest = width
    out = np.full((lengths.shape[0], longest), fill, dtype=np.float64)
    if flat.shape[0]:
        out[np.arange(longest) < lengths[:, None]] = flat
    return out
