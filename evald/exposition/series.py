"""The engine's series as a table: one :class:`Series` entry per exposed family.

Why a table: the collector (rendering), ``describe()`` (duplicate checks at register), the series
budget (:class:`~evald.exposition.budget.SeriesShape`) and the docs test all read this one list,
so a new series is one entry here plus its row in docs/metrics-reference.md (a test fails
without it).

Each entry says how to read the engine in two steps: ``source`` copies engine state while the
caller's lock is held (entries that name the same ``source`` function share one call per
scrape), ``rows`` turns that copy into ``(label values, value)`` pairs outside the lock. In
``labels``, :data:`SEGMENT` stands for the configured segment label keys. A histogram's value is
``(cumulative bucket counts ending with +Inf, sum)`` and ``bounds`` gives its finite bucket
bounds from the same copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from evald.decode import REASONS
from evald.interleaving.exported import PARTS as INTERLEAVING_PARTS
from evald.interleaving.exported import WINS as INTERLEAVING_WINS
from evald.interleaving.exported import part_rows as interleaving_rows
from evald.interleaving.exported import win_rows as interleaving_wins
from evald.stats import (
    EVENT_KINDS,
    EVENT_OUTCOMES,
    FINALIZE_REASONS,
    LAG_BOUNDS,
    MAX_SKIPPED_ACTIONS,
    OTHER,
    UNATTRIBUTED_REASONS,
)

if TYPE_CHECKING:
    from evald.config import EngineConfig
    from evald.engine import Engine

__all__ = ["ENGINE_FAMILIES", "SEGMENT", "SERIES", "SERIES_AGE", "WINDOW_SERIES", "Series"]

#: Placeholder in :attr:`Series.labels` for the configured segment label keys.
SEGMENT = "<segment>"

#: ``(label values, value)``; a histogram's value is ``(cumulative counts, sum)``.
Row = tuple[tuple[str, ...], Any]


def _none(config: EngineConfig) -> int:
    return 0


@dataclass(frozen=True, slots=True)
class Series:
    """One exposed family: what it is called and means, and how it is read from the engine.

    ``per_segment`` / ``fixed``: how many series it adds at worst, per segment and in total,
    for the given settings (the series budget is the sum over the table). ``kind`` is the
    OpenMetrics family type (``unknown`` is written ``untyped`` in text format 0.0.4).
    """

    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    source: Callable[[Engine], Any]
    rows: Callable[[Any], Iterable[Row]]
    per_segment: Callable[[EngineConfig], int] = _none
    fixed: Callable[[EngineConfig], int] = _none
    bounds: Callable[[Any], Sequence[float]] | None = None


# ------------------------------------------------------------------------------ engine reads
# Called under the caller's lock: copy, do not render.


class _Segments:
    """Per-segment aggregates, each array read once: without the lock, a growth between two
    reads could leave them of different lengths (the arrays are replaced one after another)."""

    __slots__ = (
        "abandoned",
        "bounds",
        "hist_counts",
        "hist_squares",
        "hist_sum",
        "measures",
        "overflow",
        "segs",
    )

    def __init__(self, engine: Engine) -> None:
        aggregates = engine.aggregates
        self.measures: list[str] = list(aggregates.measures)
        self.bounds: list[float] = aggregates.bounds.tolist()
        shown = engine.histograms()
        self.segs: list[tuple[str, ...]] = list(shown.segments)
        # Cumulative per bucket: the +Inf bucket is also _count, so they always agree.
        self.hist_counts: list[list[list[int]]] = np.cumsum(shown.counts, axis=2).tolist()
        self.hist_sum: list[list[float]] = shown.sums.tolist()
        self.hist_squares: list[list[float]] = shown.squares.tolist()
        self.abandoned: list[int] = shown.abandoned.tolist()
        self.overflow = shown.overflow


def _windows(engine: Engine) -> list[tuple[tuple[str, ...], Any]]:
    """The last complete window rows, each with its label values (segment, measure, window)."""
    return [((*row.labels.values(), row.measure, row.window), row) for row in engine.window_rows()]


def _attribution_window(engine: Engine) -> float:
    config: EngineConfig = engine.config
    return config.window / 1000


def _lag(engine: Engine) -> tuple[list[float], list[int], float]:
    stats = engine.counters
    return list(stats.lag_bounds), list(stats.lag_counts), float(stats.lag_sum)


# ------------------------------------------------------------------------------ rows


def _measure_rows(state: _Segments) -> Iterable[Row]:
    for segment, cumulative, sums in zip(
        state.segs, state.hist_counts, state.hist_sum, strict=True
    ):
        for measure, buckets, total in zip(state.measures, cumulative, sums, strict=True):
            yield (measure, *segment), (buckets, total)


def _squares_rows(state: _Segments) -> Iterable[Row]:
    for segment, squares in zip(state.segs, state.hist_squares, strict=True):
        for measure, total in zip(state.measures, squares, strict=True):
            yield (measure, *segment), total


def _window_part(part: str) -> Callable[[list[tuple[tuple[str, ...], Any]]], Iterable[Row]]:
    if part not in _WINDOW_MAYBE_NAN:
        return lambda state: [(values, getattr(row, part)) for values, row in state]

    def rows(state: list[tuple[tuple[str, ...], Any]]) -> Iterable[Row]:
        for values, row in state:
            value = getattr(row, part)
            if value == value:  # NaN (no finite value) is left out, not exported
                yield values, value

    return rows


def _window_ends(state: list[tuple[tuple[str, ...], Any]]) -> Iterable[Row]:
    ends: dict[str, int] = {}
    for _values, row in state:
        ends[row.window] = max(ends.get(row.window, row.end_ms), row.end_ms)
    return [((window,), end_ms / 1000) for window, end_ms in ends.items()]


def _lag_rows(state: tuple[list[float], list[int], float]) -> Iterable[Row]:
    _bounds, counts, total = state
    cumulative: list[int] = []
    running = 0
    for n in counts:
        running += n
        cumulative.append(running)
    return [((), (cumulative, total))]


def _by_reason(counts: dict[str, int]) -> Iterable[Row]:
    return [((reason,), n) for reason, n in counts.items()]


def _one(value: float) -> Iterable[Row]:
    return [((), value)]


#: Values of the ``window`` label come from the configured widths (default ``5m`` and ``1h``).
WINDOW_SERIES: tuple[str, ...] = (
    "mean",
    "count",
    "sum",
    "sum_squares",
    "ci95_halfwidth",
    "ci95_clustered_halfwidth",
)

_WINDOW_HELP = {
    "mean": "Mean measure value over the last complete event-time window.",
    "count": "Impressions in the last complete event-time window with a finite measure value "
    "(merge across instances: sum).",
    "sum": "Sum of measure values over the last complete event-time window (merge: sum).",
    "sum_squares": "Sum of squared measure values over the last complete event-time window "
    "(merge: sum; with sum and count it gives the variance).",
    "ci95_halfwidth": "95% confidence half-width of the window mean: 1.96 * s / sqrt(n) with the "
    "sample standard deviation s; absent when n < 2.",
    "ci95_clustered_halfwidth": "95% confidence half-width of the window mean clustered by user "
    "(hashed Poisson bootstrap, docs/statistics.md); absent below 30 lists, when a few users "
    "hold most of them, or with no replicates configured.",
}
# NaN when the window has no finite value (mean) or too few for an interval.
_WINDOW_MAYBE_NAN = frozenset({"mean", "ci95_halfwidth", "ci95_clustered_halfwidth"})
# A gauge named *_sum or *_count fails promtool's lint ("non-histogram and non-summary metrics
# should not have _sum suffix"); the lint skips untyped metrics and PromQL treats both alike, so
# these two keep their contract names and are exposed untyped.
_WINDOW_TYPE = {
    "mean": "gauge",
    "count": "unknown",
    "sum": "unknown",
    "sum_squares": "gauge",
    "ci95_halfwidth": "gauge",
    "ci95_clustered_halfwidth": "gauge",
}


def _window_series(part: str) -> Series:
    return Series(
        f"evald_window_{part}",
        _WINDOW_TYPE[part],
        _WINDOW_HELP[part],
        (SEGMENT, "measure", "window"),
        _windows,
        _window_part(part),
        per_segment=lambda c: len(c.measures) * len(c.windows),
    )


#: Every family the engine collector yields, in exposition order.
SERIES: tuple[Series, ...] = (
    Series(
        "evald_measure",
        "histogram",
        "Value of each finalized impression's measure, per measure and segment; observed when "
        "the impression is scored (mean over time: rate(_sum) / rate(_count)).",
        ("measure", SEGMENT),
        _Segments,
        _measure_rows,
        # per measure: one _bucket per bound plus +Inf, _sum, _count
        per_segment=lambda c: len(c.measures) * (len(c.histogram_bounds) + 1 + 2),
        bounds=lambda state: state.bounds,
    ),
    Series(
        "evald_measure_sum_squares",
        "counter",
        "Sum of squared measure values of finalized impressions, per measure and segment: with "
        "evald_measure_sum and evald_measure_count the variance over any range, across instances.",
        ("measure", SEGMENT),
        _Segments,
        _squares_rows,
        per_segment=lambda c: len(c.measures),
    ),
    *(_window_series(part) for part in WINDOW_SERIES),
    Series(
        "evald_window_end_timestamp_seconds",
        "gauge",
        "End (exclusive, event time) of the last complete window the evald_window_* series "
        "describe; absent until a complete window holds data.",
        ("window",),
        _windows,
        _window_ends,
        fixed=lambda c: len(c.windows),
    ),
    Series(
        "evald_events",
        "counter",
        "Input events by kind and what the engine did with them.",
        ("kind", "outcome"),
        lambda engine: dict(engine.counters.events),
        lambda events: events.items(),
        fixed=lambda c: len(EVENT_KINDS) * len(EVENT_OUTCOMES),
    ),
    Series(
        "evald_rejected",
        "counter",
        "Rejected input records by reason (kept in the rejected file / dead-letter topic).",
        ("reason",),
        lambda engine: dict(engine.counters.rejected),
        _by_reason,
        fixed=lambda c: len(REASONS),
    ),
    Series(
        "evald_feedback_unattributed",
        "counter",
        "Accepted feedback that counted towards no impression, by reason.",
        ("reason",),
        lambda engine: dict(engine.counters.unattributed),
        _by_reason,
        fixed=lambda c: len(UNATTRIBUTED_REASONS),
    ),
    Series(
        "evald_feedback_skipped",
        "counter",
        "Feedback an input mapping skipped (an action it does not grade), by action; the "
        f"first {MAX_SKIPPED_ACTIONS} actions by name, the rest as {OTHER}.",
        ("action",),
        lambda engine: dict(engine.counters.skipped),
        _by_reason,
        fixed=lambda c: MAX_SKIPPED_ACTIONS + 1,
    ),
    Series(
        "evald_impressions_finalized",
        "counter",
        "Impressions scored, by what closed them (window; late: it had closed before the "
        "impression arrived; pending cap; drain).",
        ("reason",),
        lambda engine: dict(engine.counters.finalized),
        _by_reason,
        fixed=lambda c: len(FINALIZE_REASONS),
    ),
    Series(
        "evald_impressions_abandoned",
        "counter",
        "Finalized impressions with no positive feedback (they score 0), per segment.",
        (SEGMENT,),
        _Segments,
        lambda state: zip(state.segs, state.abandoned, strict=True),
        per_segment=lambda c: 1,
    ),
    Series(
        "evald_segments_overflow",
        "counter",
        "Finalized impressions scored into the overflow segment (every segment label "
        "__other__): mostly label combinations that came after max_segments were kept.",
        (),
        _Segments,
        lambda state: _one(state.overflow),
        fixed=lambda c: 1,
    ),
    Series(
        "evald_pending_impressions",
        "gauge",
        "Impressions held in memory, waiting for their attribution window to close.",
        (),
        lambda engine: engine.pending(),
        _one,
        fixed=lambda c: 1,
    ),
    Series(
        "evald_pending_feedback",
        "gauge",
        "Feedback held because its impression has not arrived (yet).",
        (),
        lambda engine: engine.pending_feedback(),
        _one,
        fixed=lambda c: 1,
    ),
    Series(
        "evald_attribution_window_seconds",
        "gauge",
        "The attribution window (engine.window): an impression is scored once the watermark "
        "passes its event time plus this.",
        (),
        _attribution_window,
        _one,
        fixed=lambda c: 1,
    ),
    Series(
        "evald_oldest_open_impression_timestamp_seconds",
        "gauge",
        "Event time of the oldest impression still waiting for its attribution window to "
        "close; absent when none waits.",
        (),
        lambda engine: engine.oldest_open(),
        lambda ms: [] if ms is None else _one(ms / 1000),
        fixed=lambda c: 1,
    ),
    Series(
        "evald_watermark_timestamp_seconds",
        "gauge",
        "Event-time watermark per input partition (confirmed event time minus the allowed "
        "lateness, or advanced by the idle fallback).",
        ("partition",),
        lambda engine: engine.watermarks(),
        # one per input partition the process owns: bounded by the topics, not by the data,
        # so not counted in the budget
        lambda marks: [((str(p),), mark / 1000) for p, mark in marks.items() if mark is not None],
    ),
    Series(
        "evald_watermark_outliers",
        "counter",
        "Accepted events whose time was still more than the lateness ahead of their partition's "
        "confirmed event time a whole block of events later: they did not move the watermark "
        "(a record or a producer clock ahead).",
        (),
        lambda engine: engine.counters.watermark_outliers,
        _one,
        fixed=lambda c: 1,
    ),
    Series(
        "evald_finalize_lag_seconds",
        "histogram",
        "Wall time from an attribution window closing (by the watermark) to its impressions "
        "being scored.",
        (),
        _lag,
        _lag_rows,
        fixed=lambda c: len(LAG_BOUNDS) + 1 + 2,  # buckets with +Inf, _count, _sum
        bounds=lambda state: state[0],
    ),
)


# ------------------------------------------------------------------------------ comparisons
# The folded statistics of the configured comparisons (evald.statistics.live). The segment
# labels carry the comparison segment: the arm label holds the treatment (or, for per-arm
# series, the arm) and the arm-scoped labels are empty, i.e. absent.


class _Comparisons:
    """The comparisons' folded states (immutable: read outside the lock) and the settings."""

    __slots__ = ("keys", "settings", "views")

    def __init__(self, engine: Engine) -> None:
        live = engine.statistics
        self.keys: list[str] = list(engine.config.label_keys)
        self.settings = engine.config.statistics
        self.views = [] if live is None else live.views()

    def labels(self, comparison: Any, arm: str, rest: tuple[tuple[str, str], ...]) -> list[str]:
        values = dict(rest)
        values[comparison.label] = arm
        return [values.get(key, "") for key in self.keys]


def _sequence_part(part: str) -> Callable[[_Comparisons], Iterable[Row]]:
    def rows(state: _Comparisons) -> Iterable[Row]:
        for view in state.views:
            comp, folded = view.config, view.state
            for (treatment, rest, measure), seq in folded.sequences.items():
                bound = folded.bounds[(treatment, rest, measure)]
                value = {
                    "difference": bound.difference,
                    "lower": bound.low,
                    "upper": bound.high,
                    # absent before the first published look (infinite) and once empty
                    "intersection_lower": math.nan if seq.empty else seq.low,
                    "intersection_upper": math.nan if seq.empty else seq.high,
                    "intersection_empty": float(seq.empty),
                    "p_value": seq.p_value,
                    "alpha": folded.alpha(state.settings),
                    "clustered": float(bound.clustered),
                    "cusum_vs_control": folded.vs_control[(treatment, rest, measure)].statistic,
                }[part]
                if math.isfinite(value):
                    labels = (comp.name, measure, *state.labels(comp, treatment, rest))
                    yield labels, value

    return rows


def _arm_rows(state: _Comparisons) -> Iterable[Row]:
    """Lists per arm since the start (the control's once per comparison segment)."""
    for view in state.views:
        comp, folded = view.config, view.state
        seen: set[tuple[str, ...]] = set()
        for (treatment, rest, measure), seq in folded.sequences.items():
            for arm, n in ((comp.control, seq.control.n), (treatment, seq.treatment.n)):
                labels = (comp.name, measure, *state.labels(comp, arm, rest))
                if labels not in seen:
                    seen.add(labels)
                    yield labels, n


def _baseline_rows(state: _Comparisons) -> Iterable[Row]:
    for view in state.views:
        comp = view.config
        for (arm, rest, measure), cusum in view.state.vs_baseline.items():
            yield (comp.name, measure, *state.labels(comp, arm, rest)), cusum.statistic


def _srm_rows(state: _Comparisons) -> Iterable[Row]:
    for view in state.views:
        comp = view.config
        for rest, p_value in view.state.srm_p_values().items():
            yield (comp.name, *state.labels(comp, "", rest)), p_value


def _min_effect_rows(state: _Comparisons) -> Iterable[Row]:
    for view in state.views:
        for measure, effect in view.config.min_effect.items():
            yield (view.config.name, measure), effect


def _per_comparison(part: str) -> Callable[[_Comparisons], Iterable[Row]]:
    def rows(state: _Comparisons) -> Iterable[Row]:
        for view in state.views:
            value = {
                "start": view.config.start / 1000,
                "end": None if view.last_end_ms is None else view.last_end_ms / 1000,
                "threshold": state.settings.cusum_h,
            }[part]
            if value is not None:
                yield (view.config.name,), value

    return rows


def _pairs(config: EngineConfig) -> int:
    """Sequences per comparison segment over every comparison: treatments x measures."""
    return sum(len(c.treatments) for c in config.statistics.comparisons) * len(config.measures)


def _arms(config: EngineConfig) -> int:
    """Per-arm series per comparison segment: arms x measures."""
    arms = sum(1 + len(c.treatments) for c in config.statistics.comparisons)
    return arms * len(config.measures)


_SEQUENCE_HELP = {
    "difference": "Treatment mean minus control mean since the comparison start, per measure "
    "and comparison segment (the arm label holds the treatment).",
    "lower": "Lower bound of the always-valid confidence sequence on the difference (at the "
    "family rate split over the family: evald_comparison_alpha); absent below statistics.min_n "
    "lists an arm, lists worth too few users (a few holding them) or no variance.",
    "upper": "Upper bound of the always-valid confidence sequence on the difference (the "
    "latest look's band); treatment-below-control alerts fire when it is below "
    "-evald_comparison_min_effect.",
    "intersection_lower": "Lower bound of the running intersection of every look's band since "
    "the comparison start (never wider than before; valid only while the difference is "
    "constant); absent until the first band and while the intersection is empty.",
    "intersection_upper": "Upper bound of the running intersection of every look's band; "
    "absent until the first band and while the intersection is empty.",
    "intersection_empty": "1 once the running intersection of the bands is empty (the data "
    "contradict every constant difference: the difference changed), else 0.",
    "p_value": "Always-valid p-value of no difference (running minimum of 1/e-value).",
    "alpha": "Level each sequence of the comparison runs at: statistics.alpha / family size.",
    "clustered": "1 when the sequence's variance is clustered by user (some list had a user id), "
    "0 when it is the list-level one (no user ids: every list its own cluster).",
    "cusum_vs_control": "Lower CUSUM statistic of treatment minus control standardized window "
    "means; a drop alarm when above evald_cusum_threshold.",
}
_SEQUENCE_NAME = {
    "difference": "evald_comparison_difference",
    "lower": "evald_comparison_lower",
    "upper": "evald_comparison_upper",
    "intersection_lower": "evald_comparison_intersection_lower",
    "intersection_upper": "evald_comparison_intersection_upper",
    "intersection_empty": "evald_comparison_intersection_empty",
    "p_value": "evald_comparison_p_value",
    "alpha": "evald_comparison_alpha",
    "clustered": "evald_comparison_clustered",
    "cusum_vs_control": "evald_cusum_vs_control",
}

COMPARISON_SERIES: tuple[Series, ...] = (
    *(
        Series(
            _SEQUENCE_NAME[part],
            "gauge",
            _SEQUENCE_HELP[part],
            ("comparison", "measure", SEGMENT),
            _Comparisons,
            _sequence_part(part),
            per_segment=_pairs,
        )
        for part in _SEQUENCE_NAME
    ),
    Series(
        "evald_comparison_lists",
        "gauge",
        "Lists with a finite measure value per arm since the comparison start (the arm label "
        "holds the arm).",
        ("comparison", "measure", SEGMENT),
        _Comparisons,
        _arm_rows,
        per_segment=_arms,
    ),
    Series(
        "evald_cusum_vs_baseline",
        "gauge",
        "Lower CUSUM statistic of each arm's window mean against its own trailing baseline "
        "(statistics.baseline_windows); a drop alarm when above evald_cusum_threshold.",
        ("comparison", "measure", SEGMENT),
        _Comparisons,
        _baseline_rows,
        per_segment=_arms,
    ),
    Series(
        "evald_comparison_srm_p_value",
        "gauge",
        "Always-valid p-value of the sample-ratio guards on the arm counts (configured split) "
        "of a comparison segment: its own and the one pooled over every segment, family-wise "
        "(Bonferroni); a comparison is not trusted while it is below statistics.srm_alpha.",
        ("comparison", SEGMENT),
        _Comparisons,
        _srm_rows,
        per_segment=lambda c: len(c.statistics.comparisons),
    ),
    Series(
        "evald_comparison_min_effect",
        "gauge",
        "Configured minimum effect per measure: the drop (treatment below control) worth an alert.",
        ("comparison", "measure"),
        _Comparisons,
        _min_effect_rows,
        fixed=lambda c: sum(len(x.min_effect) for x in c.statistics.comparisons),
    ),
    Series(
        "evald_comparison_start_timestamp_seconds",
        "gauge",
        "Declared start of the comparison (statistics.comparisons[].start).",
        ("comparison",),
        _Comparisons,
        _per_comparison("start"),
        fixed=lambda c: len(c.statistics.comparisons),
    ),
    Series(
        "evald_comparison_end_timestamp_seconds",
        "gauge",
        "End (exclusive, event time) of the last window folded into the comparison.",
        ("comparison",),
        _Comparisons,
        _per_comparison("end"),
        fixed=lambda c: len(c.statistics.comparisons),
    ),
    Series(
        "evald_cusum_threshold",
        "gauge",
        "The CUSUM decision threshold h (statistics.cusum_h), per comparison.",
        ("comparison",),
        _Comparisons,
        _per_comparison("threshold"),
        fixed=lambda c: len(c.statistics.comparisons),
    ),
)

SERIES = SERIES + COMPARISON_SERIES


def _interleaving(engine: Engine) -> tuple[list[str], list[dict[str, Any]]]:
    """The label keys and the interleaving test's records (plain data: read outside the lock)."""
    return list(engine.config.label_keys), engine.interleaving.records()


def _team_pairs(config: EngineConfig) -> int:
    """Pairs of teams per segment at worst: the declared teams choose 2."""
    return math.comb(len(config.interleaving.teams), 2)


INTERLEAVING_SERIES: tuple[Series, ...] = (
    *(
        Series(
            name,
            "gauge",
            text,
            (SEGMENT, "team_a", "team_b"),
            _interleaving,
            interleaving_rows(part),
            per_segment=_team_pairs,
        )
        for part, (name, text) in INTERLEAVING_PARTS.items()
    ),
    Series(
        INTERLEAVING_WINS[0],
        "gauge",
        INTERLEAVING_WINS[1],
        (SEGMENT, "team_a", "team_b", "team"),
        _interleaving,
        interleaving_wins,
        per_segment=lambda c: 2 * _team_pairs(c),
    ),
)

SERIES = SERIES + INTERLEAVING_SERIES


def _zero_feedback(engine: Engine) -> list[tuple[tuple[str, ...], Any]]:
    """The last complete window's zero-feedback rows, with their label values."""
    return [
        ((*row.labels.values(), row.quantity, row.window), row)
        for row in engine.zero_feedback_rows()
    ]


def _zero_means(state: list[tuple[tuple[str, ...], Any]]) -> Iterable[Row]:
    return [(values, row.mean) for values, row in state if row.count]


def _zero_counts(state: list[tuple[tuple[str, ...], Any]]) -> Iterable[Row]:
    return [(values, row.count) for values, row in state]


def _zero_per_segment(config: EngineConfig) -> int:
    """One series per quantity (empty, unjudged, rbo) and window width, with the signals on."""
    return 3 * len(config.windows) if config.zero_feedback.depth else 0


ZERO_FEEDBACK_SERIES: tuple[Series, ...] = (
    Series(
        "evald_zero_feedback_mean",
        "gauge",
        "Zero-feedback signal of the served lists over the last complete event-time window, "
        "needing no feedback: quantity=empty (share of empty lists), unjudged (share of the "
        "first zero_feedback.depth items never judged for the query), rbo (mean rank-biased "
        "overlap with the reference arm's list for the same query); absent when no list "
        "defined it.",
        (SEGMENT, "quantity", "window"),
        _zero_feedback,
        _zero_means,
        per_segment=_zero_per_segment,
    ),
    Series(
        "evald_zero_feedback_lists",
        "gauge",
        "Lists of the last complete event-time window that defined the zero-feedback quantity "
        "(empty: every list; unjudged: lists with a query and items; rbo: lists of another arm "
        "whose query the reference arm served within the retention).",
        (SEGMENT, "quantity", "window"),
        _zero_feedback,
        _zero_counts,
        per_segment=_zero_per_segment,
    ),
)

SERIES = SERIES + ZERO_FEEDBACK_SERIES


def _clicks(engine: Engine) -> list[tuple[tuple[str, ...], Any, Any]]:
    """The merged click model's rows (copies): label values, curve, lists shown per rank."""
    clicks = engine.clicks
    return [] if clicks is None else clicks.rows()


def _examination_rows(state: list[tuple[tuple[str, ...], Any, Any]]) -> Iterable[Row]:
    for labels, curve, shown in state:
        for rank, (value, lists) in enumerate(zip(curve.tolist(), shown.tolist(), strict=True)):
            if lists > 0 and value == value:  # a rank never shown has no estimate
                yield (*labels, str(rank + 1)), value


def _click_lists_rows(state: list[tuple[tuple[str, ...], Any, Any]]) -> Iterable[Row]:
    return [(labels, float(shown[0])) for labels, _curve, shown in state if shown[0] > 0]


def _click_depth(config: EngineConfig) -> int:
    return config.click_model.depth if config.click_model.model is not None else 0


CLICK_SERIES: tuple[Series, ...] = (
    Series(
        "evald_click_examination",
        "gauge",
        "Examination probability per rank of the click model fitted on the stream "
        "(engine.click_model), the most examined rank 1; docs/click-models.md.",
        (SEGMENT, "rank"),
        _clicks,
        _examination_rows,
        per_segment=_click_depth,
    ),
    Series(
        "evald_click_model_lists",
        "gauge",
        "Lists the click model's fit read (rank 1 shown), over the partitions this process "
        "owns and since each partition's first list.",
        (SEGMENT,),
        _clicks,
        _click_lists_rows,
        per_segment=lambda c: int(c.click_model.model is not None),
    ),
)


def _ips(engine: Engine) -> list[tuple[tuple[str, ...], float, float, float]]:
    """The IPS sums per segment the process scored (``Engine.click_totals``, copies): clicks,
    expected weight, ranks."""
    totals = engine.click_totals()
    return [] if totals is None else totals.ips_rows()


def _ips_column(i: int) -> Callable[[list[tuple[tuple[str, ...], float, float, float]]], Any]:
    return lambda state: [(row[0], row[1 + i]) for row in state]


def _ips_series(name: str, i: int, help: str) -> Series:
    return Series(
        name,
        "counter",
        help + ' (engine.click_model; docs/click-models.md, "IPS in evald run").',
        (SEGMENT,),
        _ips,
        _ips_column(i),
        per_segment=lambda c: int(c.click_model.model is not None),
    )


IPS_SERIES: tuple[Series, ...] = (
    _ips_series(
        "evald_click_ips_clicks",
        0,
        "Clicks of modelled lists each weighed by min(1/examination of its rank, 10): over "
        "evald_click_ips_expected the self-normalised IPS click rate (SNIPS-CTR)",
    ),
    _ips_series(
        "evald_click_ips_expected",
        1,
        "Sum over the ranks shown of min(1/examination, 10) x examination: the SNIPS "
        "denominator, equal to the ranks shown where no weight is clipped",
    ),
    _ips_series(
        "evald_click_ips_ranks",
        2,
        "Ranks shown in the lists the IPS sums count: over it, evald_click_ips_clicks is "
        "the IPS click rate (IPS-CTR@depth)",
    ),
)


def _debiased(engine: Engine) -> list[tuple[tuple[str, ...], str, float, float, int]]:
    """The debiased measure sums per segment and measure the process scored (copies)."""
    totals = engine.click_totals()
    return [] if totals is None else totals.debiased_rows()


def _relevance(engine: Engine) -> str:
    clicks = engine.clicks
    return "" if clicks is None else clicks.settings.model


def _debiased_state(
    engine: Engine,
) -> tuple[str, list[tuple[tuple[str, ...], str, float, float, int]]]:
    return _relevance(engine), _debiased(engine)


def _debiased_rows(
    state: tuple[str, list[tuple[tuple[str, ...], str, float, float, int]]],
) -> Iterable[Row]:
    relevance, rows = state
    for labels, measure, total, _squares, n in rows:
        yield (measure, *labels, relevance), ([n], total)


def _debiased_squares(
    state: tuple[str, list[tuple[tuple[str, ...], str, float, float, int]]],
) -> Iterable[Row]:
    relevance, rows = state
    for labels, measure, _total, squares, _n in rows:
        yield (measure, *labels, relevance), squares


def _debiased_per_segment(config: EngineConfig) -> int:
    return len(config.measures) if config.click_model.model is not None else 0


#: the configured measures scored on the click model's relevance: families of their own, so
#: that the raw evald_measure keeps its label set (docs/click-models.md)
DEBIASED_SERIES: tuple[Series, ...] = (
    Series(
        "evald_click_measure",
        "histogram",
        "Value of each finalized impression's measure scored on the click model's relevance "
        "(relevance label: the model) instead of the user's actions, per measure and segment; "
        "mean over time: rate(_sum) / rate(_count) (engine.click_model; docs/click-models.md).",
        ("measure", SEGMENT, "relevance"),
        _debiased_state,
        _debiased_rows,
        # per measure: the +Inf _bucket, _sum, _count
        per_segment=lambda c: 3 * _debiased_per_segment(c),
        bounds=lambda state: (),
    ),
    Series(
        "evald_click_measure_sum_squares",
        "counter",
        "Sum of squared evald_click_measure values, per measure and segment: with its _sum and "
        "_count the variance over any range, across instances.",
        ("measure", SEGMENT, "relevance"),
        _debiased_state,
        _debiased_squares,
        per_segment=_debiased_per_segment,
    ),
)

SERIES = SERIES + CLICK_SERIES + IPS_SERIES + DEBIASED_SERIES


def _drop_contributors() -> tuple[Series, ...]:
    # imported here: the drill-down's outputs read the engine, which imports this table
    from evald.drilldown import contributors as top

    return (
        Series(
            "evald_drop_contributor",
            "gauge",
            "The top three contributors (rank 1 to 3, best first) of each drop a comparison "
            "flags, from the drop attribution of GET /queries: against is control (a treatment "
            "against the control) or baseline (an arm against its own trailing baseline), "
            "dimension is query or a label key, value the query text or label value, the value "
            "its share of the drop (explanatory power); absent while no drop is flagged.",
            ("comparison", "measure", "against", SEGMENT, "rank", "dimension", "value"),
            top.contributors,
            top.contributor_rows,
            per_segment=top.per_segment,
        ),
    )


SERIES = SERIES + _drop_contributors()

#: the collector's own family beside the table: how old the engine series of a scrape are
#: (the last complete page served again while the loop holds the engine: collector.py)
SERIES_AGE = "evald_engine_series_age_seconds"


#: (name, type) of every family the engine collector can yield, for ``describe()``.
ENGINE_FAMILIES: tuple[tuple[str, str], ...] = (
    *((s.name, s.kind) for s in SERIES),
    (SERIES_AGE, "gauge"),
)
