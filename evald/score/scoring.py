"""Scoring queries in batches and keeping the running means, in constant memory.

Queries arrive one at a time from a reader; :class:`BatchScorer` collects them into batches
(10k by default) so the numpy kernels work on big matrices while memory stays bounded however
long the input is. Means are kept as mergeable sums (``Σ w·v``, ``Σ w``), so an aggregate such as
GAUC, whose weight per list is not 1, averages the same way across batches as within one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from evald.metrics import Batch, Measure, evaluate, required_depth, weights_of
from evald.score.output import MeanRow
from evald.score.records import Qid, Query

#: Families that only make sense over many lists: left out of per-query rows, kept in the mean.
AGGREGATE_ONLY = frozenset({"GAUC"})


def per_query(measures: Sequence[Measure]) -> list[Measure]:
    """The measures that get a value in each per-query row."""
    return [m for m in measures if m.family not in AGGREGATE_ONLY]


@dataclass
class MeanAccumulator:
    """Weighted running mean of one measure; batch partial sums are added with ``math.fsum``."""

    weighted: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    n: int = 0

    def add(self, values: np.ndarray, weights: np.ndarray) -> None:
        """Add one batch's values with their weights (lists of weight 0 do not count in n)."""
        self.weighted.append(float(np.dot(weights, values)))
        self.weights.append(float(weights.sum()))
        self.n += int(np.count_nonzero(weights))

    def mean(self) -> float | None:
        """None when nothing was added with a positive weight."""
        total = math.fsum(self.weights)
        return math.fsum(self.weighted) / total if total > 0 else None


Sink = Callable[[Sequence[Qid], Sequence[np.ndarray]], None]
"""Receives each scored batch: qids and one values column per per-query measure."""


#: Matrix cells (lists x width) one batch may hold: a batch is padded to its widest list, so a
#: few very long lists would otherwise blow a 10k-list batch up to gigabytes.
CELL_BUDGET = 4_000_000


class BatchScorer:
    """Collects queries, scores them a batch at a time, hands rows to ``sink``, keeps means.

    A batch is scored when it reaches ``batch_size`` lists or when adding the next list would
    take its padded matrices past ``cell_budget`` cells, whichever comes first; a single list
    longer than the budget is scored on its own. Rows always come out in input order.
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
        self._pending: list[Query] = []
        self._width = 0  # widest matrix row the pending batch needs
        self._means = {m: MeanAccumulator() for m in self.measures}
        self.scored = 0

    def add(self, query: Query) -> None:
        served = len(query.ranking) if self._depth is None else min(len(query.ranking), self._depth)
        width = max(served, len(query.qrels), 1)  # the ideal matrix is as wide as the judgments
        if self._pending and max(self._width, width) * (len(self._pending) + 1) > self._cell_budget:
            self.flush()
        self._pending.append(query)
        self._width = max(self._width, width)
        if len(self._pending) >= self._batch_size:
            self.flush()

    def flush(self) -> None:
        """Score what is pending (the caller calls it once more at end of input)."""
        if not self._pending:
            return
        queries, self._pending, self._width = self._pending, [], 0
        batch = Batch.from_lists(
            [q.ranking for q in queries], [q.qrels for q in queries], depth=self._depth
        )
        values = evaluate(self.measures, batch)
        for measure, column in values.items():
            self._means[measure].add(column, weights_of(measure, batch))
        self._sink([q.qid for q in queries], [values[m] for m in self.row_measures])
        self.scored += len(queries)

    def means(self) -> list[MeanRow]:
        """One row per measure, in the order the user gave them."""
        return [MeanRow(str(m), self._means[m].mean(), self._means[m].n) for m in self.measures]
