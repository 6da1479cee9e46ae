"""The slices of a comparison's drop, from the window sums and the query summaries, for
``attribution.explain``: the treatment arm now against the control arm as the baseline, over
the comparison's windows still in retention (docs/drilldown.md, "Drop attribution")."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from evald.config import ComparisonConfig
from evald.drilldown.attribution import Explanation, Slice, explain
from evald.drilldown.report import Scope
from evald.drilldown.summary import Summary

__all__ = ["attribute", "flags_drop"]

#: the dimension of the queries (a label key cannot be named so: it is not a label)
QUERY = "query"


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
    m = scope.measures.index(measure)
    starts = [
        s
        for w, s in scope.windows.windows()
        if w == width
        and s >= max(comparison.start, since or 0)
        and (complete_before is None or s + w <= complete_before)
    ]
    per_segment: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(2))
    arms: dict[str, list[Summary]] = {comparison.control: [], treatment: []}
    for start in starts:
        for seg, sums in scope.sums(width, start).items():
            per_segment[seg] += sums[m]
        for seg, summary in scope.windows.merged(width, start).items():
            arm = _arm(scope.labels_of(seg), comparison.label, segment)
            if arm in arms:
                arms[arm].append(summary)
    sides: dict[str, dict[str, dict[str, np.ndarray]]] = {}  # arm -> key -> value -> (n, s)
    for seg, pair in per_segment.items():
        labels = scope.labels_of(seg)
        arm = _arm(labels, comparison.label, segment)
        if arm not in arms:
            continue
        for key, value in [("", ""), *labels.items()]:
            if key != comparison.label:
                by_value = sides.setdefault(arm, {}).setdefault(key, {})
                by_value[value] = by_value.get(value, np.zeros(2)) + pair
    now, base = sides.get(treatment, {}), sides.get(comparison.control, {})
    if "" not in now or "" not in base:
        return []
    dimensions = {
        key: [_slice(v, now[key][v], base.get(key, {}).get(v)) for v in sorted(now[key])]
        for key in now
        if key and len(set(now[key]) | set(base.get(key, {}))) > 1
    }
    dimensions[QUERY] = _query_slices(arms[treatment], arms[comparison.control], m, scope)
    total = _slice("", now[""][""], base[""][""])
    return explain(dimensions, total, **thresholds)


def _arm(labels: Mapping[str, str], key: str, segment: Mapping[str, str]) -> str | None:
    """The segment's arm, if it belongs to the comparison segment ``segment``."""
    if any(labels.get(k) != v for k, v in segment.items()):
        return None
    return labels.get(key)


def _slice(value: str, now: np.ndarray, base: np.ndarray | None) -> Slice:
    n0, s0 = (0.0, 0.0) if base is None else (float(base[0]), float(base[1]))
    return Slice(value, float(now[0]), float(now[1]), n0, s0)


def _query_slices(now: list[Summary], base: list[Summary], m: int, scope: Scope) -> list[Slice]:
    merged_now = Summary(scope.windows.capacity, len(scope.measures))
    merged_base = Summary(scope.windows.capacity, len(scope.measures))
    for part in now:
        merged_now.merge(part)
    for part in base:
        merged_base.merge(part)
    out = []
    for entry in merged_now.entries():
        before = merged_base.entry(entry.query)
        n0, s0 = (0.0, 0.0) if before is None else (float(before.finite[m]), float(before.sums[m]))
        out.append(Slice(entry.query, float(entry.finite[m]), float(entry.sums[m]), n0, s0))
    return out
