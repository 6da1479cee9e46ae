"""Ranked lists as flat numeric columns, turned into the metric engine's :class:`Batch`.

``Batch.from_lists`` looks every served docid up in its list's qrels when a whole batch (10 000
lists) is scored; by then the lists' Python objects have left the CPU cache, and that look-up
measured about twice as slow as the same look-up done on a chunk of a few hundred lists just
read. So the command does the look-ups per chunk, while the objects are fresh, keeps only
numbers (:class:`Lists`), and lets the Python objects go. :func:`build_batch` then hands the
numbers to ``Batch.from_flat``, the second half of ``Batch.from_lists`` (a property test checks
the two batches are equal, array for array), so every value is unchanged.
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


def cut_lists(lists: Lists, max_docs: int | None, judged_only: bool) -> Lists:
    """``cut_rankings`` on lists already looked up: the first ``max_docs`` served of each
    (trec_eval -M), then only the judged ones (-J: a NaN grade is an unjudged docid)."""
    if max_docs is None and not judged_only:
        return lists
    keep = np.ones(lists.served.shape[0], dtype=bool)
    owner = np.repeat(np.arange(len(lists)), lists.lengths)
    if max_docs is not None:
        starts = np.cumsum(lists.lengths) - lists.lengths
        keep &= np.arange(keep.shape[0]) - starts[owner] < max_docs
    if judged_only:
        keep &= ~np.isnan(lists.served)
    lengths = np.bincount(owner[keep], minlength=len(lists)).astype(np.int64)
    return Lists(lists.qids, lengths, lists.served[keep], lists.counts, lists.judgments)


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
    return Batch.from_flat(lists.lengths, lists.served, lists.counts, lists.judgments, depth)
