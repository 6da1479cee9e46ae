"""The slices of a drop, from the window sums and the summaries, for ``attribution.explain``:
one arm's windows (``now``) against a baseline (``base``): the treatment against the control
over the comparison's windows still in retention, or an arm's window where its CUSUM against
its own trailing baseline crossed against the windows before it (docs/drilldown.md, "Drop
attribution")."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evald.config import ComparisonConfig
from evald.drilldown.attribution import Explanation, Slice, explain
from evald.drilldown.labels import QUERY, split
from evald.drilldown.report import Scope
from evald.drilldown.summary import Summary
from evald.drilldown.windows import QueryWindows

__all__ = ["QUERY", "Side", "attribute", "attribute_baseline", "baseline_drops", "flags_drop"]


def flags_drop(record: Mapping[str, Any]) -> bool:
    """A comparison record (``statistics.live.summary``) that says the treatment is worse: its
    band below 0, below the minimum effect, or its CUSUM against the control crossed."""
    upper = record.get("upper")
    first = record.get("first") or {}
    return bool(
        (upper is not None and upper < 0)
        or record.get("below_min_effect")
        or first.get("cusum_vs_control") is not None
    )


def baseline_drops(record: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """arm -> (end ms, windows) of the CUSUM run that first crossed against the arm's own
    trailing baseline (its windows since the statistic was last 0, the last one where it
    crossed), for each arm of a comparison record whose baseline CUSUM did."""
    first = (record.get("first") or {}).get("cusum_vs_baseline") or {}
    return {
        arm: (int(d["end_ms"]), max(1, int(d.get("run_windows") or 1)))
        for arm, d in sorted(first.items())
        if d is not None
    }


@dataclass(frozen=True)
class Side:
    """One side of a drop: an arm's segments (in the comparison segment) over some windows."""

    arm: str
    starts: Sequence[int]


def attribute(
    scope: Scope,
    comparison: ComparisonConfig,
    treatment: str,
    segment: Mapping[str, str],
    measure: str,
    width: int,
    complete_before: int | None = None,
    since: int | None = None,
    **thresholds: Any,
) -> list[Explanation]:
    """Explanations of the treatment's drop against the control, best first, over the
    comparison's windows (those ending by ``complete_before``; None: every one held; and
    starting at ``since`` or later, None: since the comparison's start)."""
    # the windows holding lists, not only those holding queries: a stream without queries
    # has its drop carried by its labels
    starts = [
        s
        for s in scope.starts(width)
        if s >= max(comparison.start, since or 0)
        and (complete_before is None or s + width <= complete_before)
    ]
    now, base = Side(treatment, starts), Side(comparison.control, starts)
    return explain_sides(scope, comparison.label, segment, measure, width, now, base, **thresholds)


def attribute_baseline(
    scope: Scope,
    comparison: ComparisonConfig,
    arm: str,
    segment: Mapping[str, str],
    measure: str,
    width: int,
    run: tuple[int, int],
    baseline_windows: int,
    **thresholds: Any,
) -> list[Explanation]:
    """Explanations of an arm's drop against its own trailing baseline: the CUSUM's run
    (``run``: its end ms and windows, the change the CUSUM saw) against the
    ``baseline_windows`` windows before the run that are still held (the baseline it had when
    the run began); the run's windows no longer held are left out."""
    end, windows = run
    held = set(scope.starts(width))
    first = end - windows * width
    now = [s for s in range(first, end, width) if s in held]
    before = [first - i * width for i in range(baseline_windows, 0, -1)]
    base = [s for s in before if s in held and s >= comparison.start]
    sides = Side(arm, now), Side(arm, base)
    return explain_sides(scope, comparison.label, segment, measure, width, *sides, **thresholds)


def explain_sides(
    scope: Scope,
    label: str,
    segment: Mapping[str, str],
    measure: str,
    width: int,
    now: Side,
    base: Side,
    **thresholds: Any,
) -> list[Explanation]:
    """The explanations of ``now``'s drop against ``base`` in the comparison segment
    ``segment`` (``label``: the key naming the arm), over every dimension: the segment keys
    other than ``label``, the other label keys (their summaries), and ``query``."""
    m = scope.measures.index(measure)
    sums_now = _label_sums(scope, label, segment, m, width, now)
    sums_base = _label_sums(scope, label, segment, m, width, base)
    if "" not in sums_now or "" not in sums_base:
        return []
    dimensions = {
        key: [_slice(v, values[v], sums_base.get(key, {}).get(v)) for v in sorted(values)]
        for key, values in sums_now.items()
        if key and len(set(values) | set(sums_base.get(key, {}))) > 1
    }
    dimensions[QUERY] = _slices(
        _merged(scope, scope.windows, label, segment, width, now),
        _merged(scope, scope.windows, label, segment, width, base),
        m,
    )
    if scope.labels is not None:
        pairs = _slices(
            _merged(scope, scope.labels, label, segment, width, now),
            _merged(scope, scope.labels, label, segment, width, base),
            m,
        )
        by_key: dict[str, list[Slice]] = defaultdict(list)
        for sl in pairs:
            key, value = split(sl.value)
            by_key[key].append(Slice(value, sl.n, sl.s, sl.n0, sl.s0))
        dimensions.update(by_key)
    total = _slice("", sums_now[""][""], sums_base[""][""])
    return explain(dimensions, total, **thresholds)


def _label_sums(
    scope: Scope, label: str, segment: Mapping[str, str], m: int, width: int, side: Side
) -> dict[str, dict[str, np.ndarray]]:
    """segment key (other than ``label``; "" the side's total) -> value -> (lists, sum) of
    measure ``m``, exact (the window sums)."""
    per_segment: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(2))
    for start in side.starts:
        for seg, sums in scope.sums(width, start).items():
            per_segment[seg] += sums[m]
    out: dict[str, dict[str, np.ndarray]] = {}
    for seg, pair in per_segment.items():
        labels = scope.labels_of(seg)
        if _arm(labels, label, segment) != side.arm:
            continue
        for key, value in [("", ""), *labels.items()]:
            if key != label:
                by_value = out.setdefault(key, {})
                by_value[value] = by_value.get(value, np.zeros(2)) + pair
    return out


def _merged(
    scope: Scope,
    windows: QueryWindows,
    label: str,
    segment: Mapping[str, str],
    width: int,
    side: Side,
) -> Summary:
    """The side's summaries (of queries, or of label pairs) merged into one."""
    out = Summary(windows.capacity, len(scope.measures))
    for start in side.starts:
        for seg, summary in windows.merged(width, start).items():
            if _arm(scope.labels_of(seg), label, segment) == side.arm:
                out.merge(summary)
    return out


def _arm(labels: Mapping[str, str], key: str, segment: Mapping[str, str]) -> str | None:
    """The segment's arm, if it belongs to the comparison segment ``segment``."""
    if any(labels.get(k) != v for k, v in segment.items()):
        return None
    return labels.get(key)


def _slice(value: str, now: np.ndarray, base: np.ndarray | None) -> Slice:
    n0, s0 = (0.0, 0.0) if base is None else (float(base[0]), float(base[1]))
    return Slice(value, float(now[0]), float(now[1]), n0, s0)


def _slices(now: Summary, base: Summary, m: int) -> list[Slice]:
    """One slice per item ``now`` holds, against ``base``'s (none there: no baseline)."""
    out = []
    for entry in now.entries():
        before = base.entry(entry.query)
        n0, s0 = (0.0, 0.0) if before is None else (float(before.finite[m]), float(before.sums[m]))
        out.append(Slice(entry.query, float(entry.finite[m]), float(entry.sums[m]), n0, s0))
    return out
