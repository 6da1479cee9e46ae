"""`evald top`'s zero-feedback lines: per display group (e.g. arm), the shown window's RBO with
the reference arm, unjudged share and empty share, read from the exported
``evald_zero_feedback_mean`` / ``_lists`` (pure). Groups merge their segments' means weighted by
lists, as the alert rules do in PromQL (docs/drilldown.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LabelKey = tuple[tuple[str, str], ...]

#: the series read (beside what model.READ lists)
READ = frozenset({"evald_zero_feedback_mean", "evald_zero_feedback_lists"})
#: the quantities, in the order a line shows them, with their words
_SHOWN = (("rbo", "RBO"), ("unjudged", "unjudged"), ("empty", "empty"))


@dataclass(frozen=True)
class ZeroLine:
    """One display group's values in the window: quantity -> (mean, lists); a mean is NaN
    when none of the group's lists defined it."""

    group: str
    values: dict[str, tuple[float, int]]


def zero_lines(
    series: Mapping[str, Mapping[LabelKey, float]], window: str, group_by: Sequence[str]
) -> list[ZeroLine]:
    """A line per display group holding lists in ``window`` (none: the signals are off)."""
    sums: dict[str, dict[str, list[float]]] = {}
    means = series.get("evald_zero_feedback_mean", {})
    for key, lists in series.get("evald_zero_feedback_lists", {}).items():
        labels = dict(key)
        if labels.get("window") != window or "quantity" not in labels:
            continue
        group = " · ".join(labels.get(k, "__none__") for k in group_by)
        acc = sums.setdefault(group, {}).setdefault(labels["quantity"], [0.0, 0.0])
        acc[0] += lists
        if lists:
            acc[1] += means.get(key, math.nan) * lists
    out = []
    for group in sorted(sums):
        values = {
            quantity: (total / lists if lists else math.nan, int(lists))
            for quantity, (lists, total) in sums[group].items()
        }
        out.append(ZeroLine(group, values))
    return out


def line(z: ZeroLine) -> str:
    """``treatment before feedback: RBO 0.412 · unjudged 0.310 · empty 0.020 (1,200)``: RBO
    with the reference arm's lists, the lists in parentheses; ``-`` where no list defined the
    value. One 80-column line for the usual arm names."""
    parts = []
    for quantity, words in _SHOWN:
        mean, _ = z.values.get(quantity, (math.nan, 0))
        parts.append(f"{words} {'-' if math.isnan(mean) else f'{mean:.3f}'}")
    lists = z.values.get("empty", (math.nan, 0))[1]
    return f"{z.group} before feedback: {' · '.join(parts)} ({lists:,})"
