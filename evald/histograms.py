"""The engine's measure histograms as a value, and what a process's commits held of them and
of the counters.

``/metrics`` shows the histograms (per segment: each measure's buckets, sum and sum of squares;
the abandoned impressions; the overflow count) and the counters as Prometheus counters.
`evald replay` and the demo show what their engine counts as it counts. `evald run` shows
:class:`Committed`: what its commits held, so that a series never holds a count that a kill -9
loses and the restart makes again (docs/design.md, "Output by output").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evald.aggregate import Aggregates
from evald.clicks.totals import ClickTotals
from evald.stats import Stats

__all__ = ["Committed", "Histograms", "empty_like"]


@dataclass(frozen=True)
class Histograms:
    """Per segment (``segments``, label values in key order): ``counts[s, m, b]`` the values
    of measure m in bucket b (not cumulative, the last bucket +Inf), ``sums`` and ``squares``
    their sum and sum of squares, ``abandoned`` the impressions without positive feedback;
    ``overflow`` the impressions scored into the overflow segment."""

    segments: tuple[tuple[str, ...], ...]
    counts: np.ndarray
    sums: np.ndarray
    squares: np.ndarray
    abandoned: np.ndarray
    overflow: int

    @classmethod
    def of(cls, aggregates: Aggregates, segments: list[tuple[str, ...]]) -> Histograms:
        """The aggregates' histograms now, each array read once (a growth between two reads
        could leave them of different lengths: they are replaced one after another). The
        arrays are the aggregates' own: copy them to keep them."""
        counts, sums = aggregates.hist_counts, aggregates.hist_sum
        squares, abandoned = aggregates.hist_squares, aggregates.abandoned
        n = min(len(segments), counts.shape[0], sums.shape[0], abandoned.shape[0], len(squares))
        return cls(
            tuple(segments[:n]),
            counts[:n],
            sums[:n],
            squares[:n],
            abandoned[:n],
            int(aggregates.overflow),
        )

    def copy(self) -> Histograms:
        return Histograms(
            self.segments,
            self.counts.copy(),
            self.sums.copy(),
            self.squares.copy(),
            self.abandoned.copy(),
            self.overflow,
        )

    def plus(self, other: Histograms) -> Histograms:
        """The sum, segment by segment: matched by label values, as two engines number their
        segments in the order each met them."""
        index = {segment: i for i, segment in enumerate(self.segments)}
        extra = [s for s in other.segments if s not in index]
        for segment in extra:
            index[segment] = len(index)
        grow = len(extra)

        def padded(a: np.ndarray) -> np.ndarray:
            return np.concatenate([a, np.zeros((grow, *a.shape[1:]), a.dtype)])

        counts, sums = padded(self.counts), padded(self.sums)
        squares, abandoned = padded(self.squares), padded(self.abandoned)
        rows = np.array([index[s] for s in other.segments], dtype=np.int64)
        if len(rows):
            counts[rows] += other.counts
            sums[rows] += other.sums
            squares[rows] += other.squares
            abandoned[rows] += other.abandoned
        overflow = self.overflow + other.overflow
        return Histograms((*self.segments, *extra), counts, sums, squares, abandoned, overflow)


def empty_like(histograms: Histograms) -> Histograms:
    """No segment yet, the measures and buckets of ``histograms``."""
    m, b = histograms.counts.shape[1:]
    return Histograms(
        (),
        np.zeros((0, m, b), np.int64),
        np.zeros((0, m)),
        np.zeros((0, m)),
        np.zeros(0, np.int64),
        0,
    )


class Committed:
    """What a process's commits held: the engine counters (``counted``, each commit adding
    what its checkpoints count beyond the last ones, ``Ledger.committed``), and the measure
    histograms, finalization lag and click counters (IPS and debiased sums) of every session,
    each as of its last commit.

    Every session starts a fresh engine that scores only what it emits; a commit covers all
    of it. So the process's histograms after a commit are those at the session's start plus
    a copy of the engine's; a session that ends without a commit leaves nothing of its tail.
    The click counters likewise (``StreamClicks.scored``: what the engine's click model
    scored, not the checkpointed histories it loaded).
    """

    def __init__(self) -> None:
        self.counted = Stats()
        #: None until the first commit
        self.histograms: Histograms | None = None
        self._base: Histograms | None = None
        self._base_lag = (list(self.counted.lag_counts), 0.0, 0)
        #: None until the first commit with the click model on
        self.clicks: ClickTotals | None = None
        self._base_clicks: ClickTotals | None = None

    def session_started(self) -> None:
        """A new engine: from now on its commits add to what the process committed so far."""
        self._base = self.histograms
        self._base_clicks = self.clicks
        counted = self.counted
        self._base_lag = (list(counted.lag_counts), counted.lag_sum, counted.lag_count)

    def commit(
        self,
        histograms: Histograms,
        lag: Stats,
        deltas: list[dict[str, int]],
        clicks: ClickTotals | None = None,
    ) -> None:
        """A transaction committed: ``histograms``, ``lag`` and ``clicks`` (None without the
        click model) are the engine's now (all it scored since the session started),
        ``deltas`` what its checkpoints counted beyond the last ones."""
        for delta in deltas:
            self.counted.add(delta)
        own = histograms.copy()
        self.histograms = own if self._base is None else self._base.plus(own)
        if clicks is not None:
            base = self._base_clicks
            self.clicks = clicks.copy() if base is None else base.plus(clicks)
        counts, total, n = self._base_lag
        counted = self.counted
        counted.lag_counts = [a + b for a, b in zip(counts, lag.lag_counts, strict=True)]
        counted.lag_sum = total + lag.lag_sum
        counted.lag_count = n + lag.lag_count
