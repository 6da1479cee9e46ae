"""Per-segment count, sum and sum of squares of every measure, accumulated from results.

Why not the engine's aggregates: their window sums are kept only for the retention period
(hours), and the histograms have no sum of squares, so neither gives a 95% interval over a
whole replay of days. This sees each finalized result once (the engine's ``on_result``), buffers
a block and adds it with numpy, and merges segments exactly (sums add).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from evald.stats import mean_ci95

if TYPE_CHECKING:
    from evald.engine import Result
    from evald.segments import SegmentIndex

__all__ = ["Interval", "SegmentMoments", "SegmentRow"]

_BLOCK = 8192


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% half-width (NaN when n < 2), over ``n`` finite values."""

    mean: float
    half: float
    n: int

    def to_json(self) -> dict[str, float | int | None]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"mean": num(self.mean), "ci95_halfwidth": num(self.half), "n": self.n}


@dataclass(frozen=True)
class SegmentRow:
    """One segment's labels and its interval per measure."""

    labels: dict[str, str]
    n: int  # results (finalized impressions) of the segment
    measures: dict[str, Interval]

    def to_json(self) -> dict[str, object]:
        return {
            "labels": self.labels,
            "n": self.n,
            "measures": {name: est.to_json() for name, est in self.measures.items()},
        }


class SegmentMoments:
    """Accumulates results into (segment, measure) -> [count, sum, sum of squares]."""

    def __init__(self, measures: Sequence[str], segments: SegmentIndex) -> None:
        self.measures = list(measures)
        self.segments = segments
        self._sums = np.zeros((0, len(self.measures), 3))
        self._results = np.zeros(0, dtype=np.int64)
        self._seg: list[int] = []
        self._rows: list[list[float]] = []

    def add(self, result: Result) -> None:
        """The engine's ``on_result`` callback."""
        self._seg.append(self.segments.segment_of(result.labels))
        values = result.measures
        self._rows.append([values.get(name, math.nan) for name in self.measures])
        if len(self._seg) >= _BLOCK:
            self._flush()

    def _flush(self) -> None:
        if not self._seg:
            return
        seg = np.asarray(self._seg, dtype=np.int64)
        values = np.asarray(self._rows, dtype=np.float64)
        self._seg.clear()
        self._rows.clear()
        grow = int(seg.max()) + 1 - self._sums.shape[0]
        if grow > 0:
            self._sums = np.concatenate([self._sums, np.zeros((grow, *self._sums.shape[1:]))])
            self._results = np.concatenate([self._results, np.zeros(grow, dtype=np.int64)])
        finite = np.isfinite(values)
        clean = np.where(finite, values, 0.0)
        np.add.at(self._results, seg, 1)
        np.add.at(self._sums[:, :, 0], seg, finite.astype(np.float64))
        np.add.at(self._sums[:, :, 1], seg, clean)
        np.add.at(self._sums[:, :, 2], seg, clean * clean)

    def rows(self) -> list[SegmentRow]:
        """Every segment with a result, in label order."""
        self._flush()
        out = []
        for seg_id in range(self._sums.shape[0]):
            if self._results[seg_id]:
                labels = self.segments.labels_of(seg_id)
                out.append(SegmentRow(labels, int(self._results[seg_id]), self._intervals(seg_id)))
        return sorted(out, key=lambda row: sorted(row.labels.items()))

    def overall(self) -> dict[str, Interval]:
        """Every segment merged (sums add, so this is exact)."""
        self._flush()
        total = self._sums.sum(axis=0)
        return self._estimates(total)

    def _intervals(self, seg_id: int) -> dict[str, Interval]:
        return self._estimates(self._sums[seg_id])

    def _estimates(self, sums: np.ndarray) -> dict[str, Interval]:
        out = {}
        for m, name in enumerate(self.measures):
            count, total, squares = sums[m].tolist() if sums.size else (0.0, 0.0, 0.0)
            if count > 0:
                mean, half = mean_ci95(count, total, squares)
                out[name] = Interval(mean, half, int(count))
        return out
