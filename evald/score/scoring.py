"""Scoring queries in batches and keeping the running means, in constant memory.

Queries arrive from a reader a chunk at a time (or one at a time); :class:`BatchScorer` turns
each chunk into numbers at once and collects them into batches (10k by default), so the numpy
kernels work on big matrices while memory stays bounded however long the input is. Means are
kept as mergeable sums (``Σ w·v``, ``Σ w``), so an aggregate such as GAUC, whose weight per list
is not 1, averages the same way across batches as within one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from evald.metrics import (
    FAMILIES,
    Measure,
    evaluate,
    from_mean,
    mean_terms,
    required_depth,
    value_range,
    weights_of,
)
from evald.score.batching import Lists, build_batch, concat, cut_lists, lists_from, widths
from evald.score.output import MeanRow
from evald.score.records import Qid, Query

if TYPE_CHECKING:
    from evald.score.records import Chunk

#: Families that only make sense over many lists: left out of per-query rows, kept in the mean
#: (trec_eval prints gm_map only in its ``all`` line too). Not what the config refuses (what
#: the engine's sums cannot hold, GMAP): a list's GAUC is its AUC, and only the mean is GAUC.
NO_PER_QUERY_VALUE = frozenset(name for name, f in FAMILIES.items() if f.aggregate_of)


def per_query(measures: Sequence[Measure]) -> list[Measure]:
    """The measures that get a value in each per-query row."""
    return [m for m in measures if m.family not in NO_PER_QUERY_VALUE]


class MeanAccumulator:
    """Weighted running mean of one measure; batch partial sums are added with ``math.fsum``.

    A plain class, not a dataclass: building one costs about 0.3 ms of start-up."""

    def __init__(self, span: tuple[float, float] | None = (0.0, 1.0)) -> None:
        #: the values' range (None: unbounded), for an interval that stays inside it
        self.span = span
        #: values strictly inside ``span``: none means every value sits at a bound (binary)
        self.interior = 0
        self.weighted: list[float] = []
        self.weights: list[float] = []
        self.n = 0
        # the unweighted spread, merged batch by batch (Chan et al.): count, mean, Σ(v − mean)²
        self._count = 0
        self._mean = 0.0
        self._m2 = 0.0
        self._unweighted = True

    def add(self, values: np.ndarray, weights: np.ndarray) -> None:
        """Add one batch's values with their weights (lists of weight 0 do not count in n)."""
        self.weighted.append(float(np.dot(weights, values)))
        self.weights.append(float(weights.sum()))
        self.n += int(np.count_nonzero(weights))
        if not bool((weights == 1).all()):
            self._unweighted = False
        if values.shape[0]:
            if self.span is not None:
                low, high = self.span
                self.interior += int(np.count_nonzero((values != low) & (values != high)))
            count, mean = values.shape[0], float(values.mean())
            m2 = float(np.square(values - mean).sum())
            total = self._count + count
            delta = mean - self._mean
            self._m2 += m2 + delta * delta * self._count * count / total
            self._mean += delta * count / total
            self._count = total

    def interval(self, measure: Measure, level: float = 0.95) -> tuple[float, float] | None:
        """The 95% interval of the mean over lists, inside the measure's range
        (evald.score.intervals; GMAP: of the mean log, then exponentiated); None for fewer
        than 2 lists or a weighted aggregate (GAUC)."""
        if not self._unweighted or self._count < 2:
            return None
        from evald.score.intervals import mean_interval

        found = mean_interval(
            self._count, self._mean, self._m2, span=self.span, interior=self.interior, level=level
        )
        if found is None:
            return None
        return from_mean(measure, found[0]), from_mean(measure, found[1])

    def mean(self) -> float | None:
        """None when nothing was added with a positive weight."""
        total = math.fsum(self.weights)
        return math.fsum(self.weighted) / total if total > 0 else None

    def reported(self, measure: Measure) -> float | None:
        """The mean as reported: for GMAP the exponential of the mean of the logs."""
        mean = self.mean()
        return None if mean is None else from_mean(measure, mean)


Sink = Callable[[Sequence[Qid], Sequence[np.ndarray]], None]
"""Receives each scored batch: qids and one values column per per-query measure."""


#: Matrix cells (lists x width) one batch may hold: a batch is padded to its widest list, so a
#: few very long lists would otherwise blow a 10k-list batch up to gigabytes.
CELL_BUDGET = 4_000_000


def _fitting(widths: np.ndarray, budget: int) -> int:
    """How many of the lists, from the first, one batch takes: as many as fit ``budget`` cells
    padded to the widest of them, and always at least one."""
    cells = np.maximum.accumulate(widths) * np.arange(1, widths.shape[0] + 1)
    over = np.flatnonzero(cells[1:] > budget)
    return int(over[0]) + 1 if over.shape[0] else int(widths.shape[0])


class BatchScorer:
    """Collects queries, scores them a batch at a time, hands rows to ``sink``, keeps means.

    Every ``batch_size`` lists (and at the final :meth:`flush`) the pending lists are scored in
    input order, cut into batches that stay within ``cell_budget`` padded matrix cells; a single
    list wider than the budget is scored on its own. Queries are turned into numbers
    (:class:`Lists`) as they are added, a chunk at a time, while their objects are fresh in the
    CPU cache; a batch is then padded from those numbers alone.
    """

    def __init__(
        self,
        measures: Sequence[Measure],
        sink: Sink,
        *,
        batch_size: int = 10_000,
        cell_budget: int = CELL_BUDGET,
    ) -> None:
        if batch_size < 1 or cell_budget < 1:
            raise ValueError("batch_size and cell_budget must be ≥ 1")
        self.measures = list(measures)
        self.row_measures = per_query(self.measures)
        self._sink = sink
        self._batch_size = batch_size
        self._cell_budget = cell_budget
        self._depth = required_depth(self.measures)
        self._pending: list[Lists] = []
        self._pending_n = 0
        self._means = {m: MeanAccumulator(value_range(m)) for m in self.measures}
        self.scored = 0

    def add(self, query: Query) -> None:
        """Queue one query; a full batch is scored (the cell budget is applied when scoring)."""
        self.add_many([query.qid], [query.ranking], [query.qrels])

    def add_many(
        self,
        qids: Sequence[Qid],
        rankings: Sequence[list[str]],
        qrels: Sequence[dict[str, float]],
    ) -> None:
        """Queue queries given as columns; every full batch is scored as it fills.

        Each ranking must hold distinct docids, as both readers ensure. Batches hold exactly
        ``batch_size`` consecutive lists whatever the chunks handed in, so the output does not
        depend on how the input was read.
        """
        self.add_lists(lists_from(qids, rankings, qrels))

    def add_lists(self, lists: Lists) -> None:
        """Queue queries already turned into numbers; every full batch is scored as it fills."""
        start = 0
        while start < len(lists):
            stop = min(len(lists), start + self._batch_size - self._pending_n)
            part = lists if start == 0 and stop == len(lists) else lists.slice(start, stop)
            self._pending.append(part)
            self._pending_n += len(part)
            start = stop
            if self._pending_n >= self._batch_size:
                self.flush()

    def add_chunk(self, chunk: Chunk, max_docs: int | None, judged_only: bool) -> None:
        """Queue a reader's chunk, cut by trec_eval's -M and -J (``cut_rankings``)."""
        if chunk.qids:
            rankings = cut_rankings(chunk.rankings, chunk.qrels, max_docs, judged_only)
            self.add_many(chunk.qids, rankings, chunk.qrels)
        if chunk.lists is not None:
            self.add_lists(cut_lists(chunk.lists, max_docs, judged_only))

    def flush(self) -> None:
        """Score what is pending (the caller calls it once more at end of input)."""
        if not self._pending:
            return
        lists = concat(self._pending)
        self._pending, self._pending_n = [], 0
        needed = widths(lists, self._depth)
        start = 0
        while start < len(lists):
            stop = start + _fitting(needed[start:], self._cell_budget)
            self._score(lists if start == 0 and stop == len(lists) else lists.slice(start, stop))
            start = stop

    def _score(self, lists: Lists) -> None:
        batch = build_batch(lists, self._depth)
        values = evaluate(self.measures, batch)
        for measure, column in values.items():
            self._means[measure].add(mean_terms(measure, column), weights_of(measure, batch))
        self._sink(lists.qids, [values[m] for m in self.row_measures])
        self.scored += len(lists)

    def means(self, *, intervals: bool = True) -> list[MeanRow]:
        """One row per measure, in the order the user gave them; ``intervals=False`` leaves
        out the 95% intervals (and the import of scipy they need)."""
        return [
            MeanRow(
                str(m),
                self._means[m].reported(m),
                self._means[m].n,
                self._means[m].interval(m) if intervals else None,
            )
            for m in self.measures
        ]


def cut_rankings(
    rankings: list[list[str]],
    qrels: Sequence[dict[str, float]],
    max_docs: int | None,
    judged_only: bool,
) -> list[list[str]]:
    """trec_eval's -M (the first M documents) then -J (judged documents only), in that order."""
    if max_docs is not None:
        rankings = [r[:max_docs] if len(r) > max_docs else r for r in rankings]
    if judged_only:
        rankings = [[d for d in r if d in q] for r, q in zip(rankings, qrels, strict=True)]
    return rankings
