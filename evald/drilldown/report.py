"""The drill-down's answers, read from the summaries: per segment and window the queries with
the most traffic and, per measure, the queries whose mean fell most against the window before
(or the other arm), each with its contribution (traffic share x change of mean).

Pure reading: a JSON-ready document built from ``QueryWindows`` and the window sums, for
``evald replay --format json`` and ``GET /queries`` (docs/drilldown.md, "Reading it").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from evald.drilldown.summary import Summary
from evald.drilldown.windows import QueryWindows
from evald.durations import format_duration
from evald.events import format_timestamp

if TYPE_CHECKING:
    from evald.aggregate import Aggregates

__all__ = ["Scope", "changes", "query_report", "top"]


def _num(x: float) -> float | None:
    return None if x != x else x


def top(summary: Summary, measures: Sequence[str], k: int) -> list[dict[str, Any]]:
    """The ``k`` queries with the most lists, with their bounds and means."""
    return [
        {
            "query": e.query,
            "lists": e.lists,
            "lists_upper": e.lists_upper,
            "means": {name: _num(e.mean(m)) for m, name in enumerate(measures)},
        }
        for e in summary.entries()[:k]
    ]


def changes(
    current: Summary,
    baseline: Summary,
    measure: int,
    lists: float,
    overall_change: float | None,
    k: int,
) -> list[dict[str, Any]]:
    """Queries held in both, most negative contribution first: ``contribution`` = (the query's
    lists / ``lists``, the segment's lists with a value of the measure, those without a query
    too: the window sums') x (its mean - its baseline mean), the amount it moved the segment's
    mean at its current traffic; ``share`` = contribution / the segment's change of mean
    (None when that is 0 or unknown)."""
    n = lists
    rows = []
    for entry in current.entries():
        base = baseline.entry(entry.query)
        if base is None or not n:
            continue
        mean, before = entry.mean(measure), base.mean(measure)
        if mean != mean or before != before:
            continue
        change = mean - before
        contribution = int(entry.finite[measure]) / n * change
        share = contribution / overall_change if overall_change else None
        rows.append(
            {
                "query": entry.query,
                "lists": entry.lists,
                "mean": mean,
                "baseline_lists": base.lists,
                "baseline_mean": before,
                "change": change,
                "contribution": contribution,
                "share": share,
            }
        )
    rows.sort(key=lambda r: (r["contribution"], r["query"]))
    return rows[:k]


class Scope:
    """What a report reads: the summaries, the segments' labels, the measures, and each
    window's exact (count, sum) per segment and measure from the window sums."""

    def __init__(self, aggregates: Aggregates) -> None:
        if aggregates.queries is None:
            raise ValueError("no query summaries are kept (drilldown.capacity is 0)")
        self.windows: QueryWindows = aggregates.queries
        #: the summaries of the non-segment label pairs (None: not kept)
        self.labels: QueryWindows | None = aggregates.labels
        self.labels_of = aggregates.segments.labels_of
        self.measures = aggregates.measures
        self._aggregates = aggregates

    def starts(self, width: int) -> list[int]:
        """The windows of ``width`` holding lists (the window sums: with a query or not)."""
        return self._aggregates.window_starts(width)

    def sums(self, width: int, start: int) -> dict[int, list[tuple[float, float]]]:
        """segment -> per measure (count, sum) of the window, exact (the window sums)."""
        arr = self._aggregates.window_sums(start, start + width)
        return {
            seg: [(float(c), float(t)) for c, t in arr[seg, :, :2].tolist()]
            for seg in range(arr.shape[0])
            if arr[seg, :, 0].any()
        }


def _mean(sums: dict[int, list[tuple[float, float]]], seg: int, m: int) -> float:
    count, total = sums[seg][m] if seg in sums else (0.0, 0.0)
    return total / count if count else float("nan")


def query_report(
    scope: Scope,
    complete_before: int | None,
    *,
    final: bool = False,
    last_only: bool = True,
    k: int = 10,
    measure: str | None = None,
    width: int | None = None,
    segment: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Per width (or ``width``) its last complete window (ending by ``complete_before``; None:
    none is complete, unless ``final``: then the last holding data), per segment (matching
    ``segment``'s labels): ``top`` and, per measure (or ``measure``), ``fallen`` against the
    window before. ``last_only=False``: every such window still held, in time order."""
    if complete_before is None and not final:
        return []
    held = scope.windows.windows()
    out = []
    for w in sorted({w for w, _ in held}):
        if width is not None and w != width:
            continue
        starts = [
            s for ww, s in held if ww == w and (complete_before is None or s + w <= complete_before)
        ]
        if not starts:
            continue
        for start in [max(starts)] if last_only else sorted(starts):
            out += _window_rows(scope, w, start, k, measure, segment)
    return out


def _window_rows(
    scope: Scope,
    w: int,
    start: int,
    k: int,
    measure: str | None,
    segment: dict[str, str] | None,
) -> list[dict[str, Any]]:
    """The report's rows of one window: one per segment (matching ``segment``)."""
    out = []
    now, before = scope.windows.merged(w, start), scope.windows.merged(w, start - w)
    sums_now, sums_before = scope.sums(w, start), scope.sums(w, start - w)
    for seg, summary in sorted(now.items()):
        labels = scope.labels_of(seg)
        if segment and any(labels.get(key) != value for key, value in segment.items()):
            continue
        fallen: dict[str, list[dict[str, Any]]] = {}
        base = before.get(seg)
        for m, name in enumerate(scope.measures):
            if (measure is not None and name != measure) or base is None:
                continue
            overall = _mean(sums_now, seg, m) - _mean(sums_before, seg, m)
            lists = sums_now[seg][m][0] if seg in sums_now else 0.0
            fallen[name] = changes(summary, base, m, lists, _num(overall), k)
        out.append(
            {
                "window": format_duration(w),
                "start": format_timestamp(start),
                "end": format_timestamp(start + w),
                "labels": labels,
                "lists": summary.total,
                "offset": summary.offset,
                "top": top(summary, scope.measures, k),
                "fallen": fallen,
            }
        )
    return out
