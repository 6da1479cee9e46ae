"""What `evald top` shows, computed from one or two scrapes of an evald's ``/metrics``.

Pure functions of the exposition text: :func:`parse` turns it into a :class:`Scrape` (the
samples `evald top` reads, keyed by name and labels), :func:`build_view` turns the latest scrape
(and the one before it, for rates) into a :class:`View` that :mod:`evald.top.render` draws.

Intervals come from the exported window sums (``evald_window_count``, ``_sum``,
``_sum_squares``), merged per display group by addition, exactly as
docs/metrics-reference.md does it in PromQL; per-segment means or half-widths are never averaged.

Two kinds of marks, never mixed up: the **verdicts** (▲/▼) come from the comparison evald folds
since the declared start (``evald_comparison_*``: the always-valid band, which holds however
often it is watched), one per comparison segment and measure; the treatment − control
difference of the shown window against its own 95% interval is **descriptive** (``*``): read
every few seconds, such a mark shows up on identical arms in about one window in twenty per
measure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from evald.stats import Z95, mean_ci95
from evald.top import interleaving, zerofeedback

__all__ = [
    "Comparison",
    "Estimate",
    "GroupRow",
    "Scrape",
    "Verdict",
    "View",
    "build_view",
    "compare",
    "parse",
]

LabelKey = tuple[tuple[str, str], ...]

#: the series `evald top` reads; everything else in the exposition is skipped while parsing
READ = frozenset(
    {
        "evald_window_count",
        "evald_window_sum",
        "evald_window_sum_squares",
        "evald_window_end_timestamp_seconds",
        "evald_events_total",
        "evald_rejected_total",
        "evald_feedback_unattributed_total",
        "evald_impressions_finalized_total",
        "evald_results_produced_total",
        "evald_pending_impressions",
        "evald_pending_feedback",
        "evald_watermark_timestamp_seconds",
        "evald_consumer_lag",
        "evald_ready",
        "evald_comparison_difference",
        "evald_comparison_lower",
        "evald_comparison_upper",
        "evald_comparison_lists",
        "evald_comparison_alpha",
        "evald_comparison_clustered",
        "evald_attribution_window_seconds",
        "evald_oldest_open_impression_timestamp_seconds",
        *interleaving.READ,
        *zerofeedback.READ,
    }
)
#: labels of the comparison series that are not segment labels
_COMPARISON_LABELS = frozenset({"comparison", "measure"})


@dataclass(frozen=True)
class Scrape:
    """The samples of one scrape that `evald top` reads, and the wall time it was taken."""

    at: float  # wall clock, seconds since the epoch
    samples: dict[str, dict[LabelKey, float]]

    def series(self, name: str) -> dict[LabelKey, float]:
        return self.samples.get(name, {})

    def total(self, name: str, **match: str) -> float | None:
        """Sum of ``name`` over the samples whose labels include ``match``; None if absent."""
        found = [
            value
            for labels, value in self.series(name).items()
            if all(dict(labels).get(k) == v for k, v in match.items())
        ]
        return sum(found) if found else None


def parse(text: str, at: float) -> Scrape:
    """Parse Prometheus text exposition (0.0.4) into a :class:`Scrape`.

    Raises ``ValueError`` on text that is not an exposition (e.g. an HTML error page).
    """
    samples: dict[str, dict[LabelKey, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in READ:
                key = tuple(sorted(sample.labels.items()))
                samples.setdefault(sample.name, {})[key] = float(sample.value)
    return Scrape(at, samples)


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95% half-width (NaN when n < 2) over ``n`` impressions."""

    mean: float
    half: float
    n: int


@dataclass(frozen=True)
class Comparison:
    """Treatment minus control in one window with the 95% bound of the difference
    (independent samples): descriptive, since a fixed interval watched window after window
    flags identical arms again and again."""

    delta: float
    bound: float

    @property
    def outside(self) -> bool:
        """The difference is outside its own 95% interval (a descriptive mark)."""
        return math.isfinite(self.bound) and abs(self.delta) > self.bound


@dataclass(frozen=True)
class Verdict:
    """The comparison since its declared start for one comparison segment and measure: the
    always-valid band on treatment − control (the latest look's, the one the alerts read)."""

    comparison: str
    segment: str  # ``surface=web`` (``all`` when the comparison has no other label)
    measure: str
    difference: float
    lower: float  # NaN without a band (too few lists or users, or no variance)
    upper: float
    clustered: bool | None  # variance clustered by user; None: not exported

    @property
    def mark(self) -> str:
        """``up`` / ``down`` once the band excludes 0 (a verdict), else ``""``."""
        if self.lower > 0:
            return "up"
        if self.upper < 0:
            return "down"
        return ""


@dataclass(frozen=True)
class GroupRow:
    """One display group (e.g. an arm): its estimate per measure."""

    name: str
    estimates: dict[str, Estimate]

    @property
    def n(self) -> int:
        return max((e.n for e in self.estimates.values()), default=0)


@dataclass(frozen=True)
class Progress:
    """How far event time has come towards the next complete window: the attribution window
    (s), the oldest impression waiting for it and the slowest partition's watermark (s since
    the epoch, event time), and how fast that watermark moved (event s per wall s)."""

    attribution_s: float | None = None
    oldest_open: float | None = None
    watermark: float | None = None
    watermark_pace: float | None = None
    #: the windows that are complete, when the shown one is not: a window not among the
    #: evald's ``windows`` never is, which only this tells apart from one still to come
    complete: tuple[str, ...] = ()


@dataclass(frozen=True)
class View:
    """Everything one frame of `evald top` shows.

    Long because: a flat record of the frame's values, one per thing shown; the renderer reads
    each once and groups them its own way.
    """

    source: str
    at: float
    ready: bool | None
    window: str
    window_end: float | None  # seconds since the epoch, end (exclusive) of the shown window
    measures: list[str]
    groups: list[GroupRow]
    comparison: dict[str, Comparison] | None  # treatment − control per measure, when both exist
    arms: tuple[str, str]  # the (control, treatment) group names compared
    events_per_s: float | None
    rejected_per_s: float | None
    scored_per_s: float | None
    results_per_s: float | None  # daemon only
    pending_impressions: float | None
    pending_feedback: float | None
    watermark_delay_s: float | None  # wall time minus the slowest partition's watermark
    consumer_lag: float | None  # daemon only: records behind, all partitions
    rejects: list[tuple[str, float]]  # reason, total since start; non-zero only, largest first
    unattributed: list[tuple[str, float]] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)  # since the start, always-valid
    #: interleaving: each pair's preference since the start and its verdict
    preferences: list[interleaving.Preference] = field(default_factory=list)
    #: what says when the first window will be complete, while none is
    progress: Progress = field(default_factory=lambda: Progress())
    #: per display group, the window's zero-feedback values (none: the signals are off)
    zero_feedback: list[zerofeedback.ZeroLine] = field(default_factory=list)
    #: the measures the window holds, when ``measures`` (--measures) names one it does not
    #: (a misspelt name showed as a row of dashes with n 0, as if nothing was scored)
    exported: list[str] = field(default_factory=list)


def verdicts(scrape: Scrape, arms: tuple[str, str]) -> list[Verdict]:
    """The always-valid comparisons of ``arms`` (control, treatment) evald exports: the
    sequences whose arm label holds the treatment in a comparison whose control is ``arms[0]``
    (its ``evald_comparison_lists`` carry the control's name), per segment and measure."""
    control, treatment = arms
    controls = {
        (labels.get("comparison"), key)
        for labels in map(dict, scrape.series("evald_comparison_lists"))
        for key, value in labels.items()
        if value == control and key not in _COMPARISON_LABELS
    }
    out = []
    for key, difference in scrape.series("evald_comparison_difference").items():
        labels = dict(key)
        name = labels.get("comparison", "")
        arm = next((k for k, v in labels.items() if v == treatment and (name, k) in controls), None)
        if arm is None:
            continue
        segment = ",".join(
            f"{k}={v}"
            for k, v in sorted(labels.items())
            if v and k not in {*_COMPARISON_LABELS, arm}
        )
        clustered = scrape.series("evald_comparison_clustered").get(key)
        out.append(
            Verdict(
                name,
                segment or "all",
                labels.get("measure", ""),
                difference,
                scrape.series("evald_comparison_lower").get(key, math.nan),
                scrape.series("evald_comparison_upper").get(key, math.nan),
                None if clustered is None else clustered >= 1,
            )
        )
    return sorted(out, key=lambda v: (v.comparison, v.segment))


def compare(treatment: Estimate, control: Estimate) -> Comparison:
    """Difference of two independent means and its 95% bound ``1.96·sqrt(se_t² + se_c²)``."""
    se_t, se_c = treatment.half / Z95, control.half / Z95
    return Comparison(treatment.mean - control.mean, Z95 * math.hypot(se_t, se_c))


def _group_sums(
    scrape: Scrape, window: str, group_by: Sequence[str]
) -> dict[str, dict[str, list[float]]]:
    """group name -> measure -> [count, sum, sum of squares], merged over the other labels."""
    sums: dict[str, dict[str, list[float]]] = {}
    for position, name in enumerate(
        ("evald_window_count", "evald_window_sum", "evald_window_sum_squares")
    ):
        for key, value in scrape.series(name).items():
            labels = dict(key)
            if labels.get("window") != window or "measure" not in labels:
                continue
            group = " · ".join(labels.get(k, "__none__") for k in group_by)
            acc = sums.setdefault(group, {}).setdefault(labels["measure"], [0.0, 0.0, 0.0])
            acc[position] += value
    return sums


def _measures(scrape: Scrape, window: str) -> list[str]:
    """Measures in the order the exposition lists them (the engine's configured order)."""
    seen: dict[str, None] = {}
    for key in scrape.series("evald_window_count"):
        labels = dict(key)
        if labels.get("window") == window and "measure" in labels:
            seen.setdefault(labels["measure"], None)
    return list(seen)


def _rate(cur: Scrape, prev: Scrape | None, name: str, **match: str) -> float | None:
    if prev is None or cur.at <= prev.at:
        return None
    now, then = cur.total(name, **match), prev.total(name, **match)
    if now is None or then is None:
        return None
    if now < then:  # the process restarted between the scrapes: counters began again
        return None
    return (now - then) / (cur.at - prev.at)


def _nonzero(series: Mapping[LabelKey, float], label: str) -> list[tuple[str, float]]:
    totals: dict[str, float] = {}
    for key, value in series.items():
        name = dict(key).get(label, "")
        totals[name] = totals.get(name, 0.0) + value
    return sorted(((k, v) for k, v in totals.items() if v > 0), key=lambda kv: (-kv[1], kv[0]))


def build_view(
    source: str,
    cur: Scrape,
    prev: Scrape | None = None,
    *,
    window: str = "5m",
    group_by: Sequence[str] = ("arm",),
    measures: Iterable[str] | None = None,
    arms: tuple[str, str] = ("control", "treatment"),
) -> View:
    """The frame for ``cur``; rates need ``prev``, the scrape before it (else they are None).

    ``arms`` names the (control, treatment) groups compared when both are shown."""
    exported = _measures(cur, window)
    shown = list(measures) if measures is not None else exported
    sums = _group_sums(cur, window, group_by)
    groups = []
    for name in sorted(sums):
        estimates = {}
        for measure in shown:
            count, total, squares = sums[name].get(measure, (0.0, 0.0, 0.0))
            if count > 0:
                mean, half = mean_ci95(count, total, squares)
                estimates[measure] = Estimate(mean, half, int(count))
        groups.append(GroupRow(name, estimates))
    by_name = {g.name: g for g in groups}
    comparison = None
    control, treatment = arms
    if treatment in by_name and control in by_name:
        t, c = by_name[treatment].estimates, by_name[control].estimates
        comparison = {m: compare(t[m], c[m]) for m in shown if m in t and m in c}

    end = cur.total("evald_window_end_timestamp_seconds", window=window)
    ready = cur.total("evald_ready")
    marks = list(cur.series("evald_watermark_timestamp_seconds").values())
    return View(
        source=source,
        at=cur.at,
        ready=None if ready is None else ready >= 1,
        window=window,
        window_end=end,
        measures=shown,
        groups=groups,
        comparison=comparison,
        arms=arms,
        events_per_s=_rate(cur, prev, "evald_events_total"),
        rejected_per_s=_rate(cur, prev, "evald_events_total", outcome="rejected"),
        scored_per_s=_rate(cur, prev, "evald_impressions_finalized_total"),
        results_per_s=_rate(cur, prev, "evald_results_produced_total"),
        pending_impressions=cur.total("evald_pending_impressions"),
        pending_feedback=cur.total("evald_pending_feedback"),
        watermark_delay_s=cur.at - min(marks) if marks else None,
        consumer_lag=cur.total("evald_consumer_lag"),
        rejects=_nonzero(cur.series("evald_rejected_total"), "reason"),
        unattributed=_nonzero(cur.series("evald_feedback_unattributed_total"), "reason"),
        verdicts=[v for v in verdicts(cur, arms) if v.measure in shown],
        preferences=interleaving.preferences(cur.samples),
        progress=Progress(
            attribution_s=cur.total("evald_attribution_window_seconds"),
            oldest_open=cur.total("evald_oldest_open_impression_timestamp_seconds"),
            watermark=min(marks) if marks else None,
            watermark_pace=_pace(cur, prev),
            complete=() if end is not None else _complete_windows(cur),
        ),
        zero_feedback=zerofeedback.zero_lines(cur.samples, window, group_by),
        exported=exported if exported and not set(shown) <= set(exported) else [],
    )


def _complete_windows(scrape: Scrape) -> tuple[str, ...]:
    ends = scrape.series("evald_window_end_timestamp_seconds")
    return tuple(sorted({dict(key).get("window", "") for key in ends} - {""}))


def _pace(cur: Scrape, prev: Scrape | None) -> float | None:
    """Event seconds the slowest partition's watermark moved per wall second between scrapes."""
    if prev is None or cur.at <= prev.at:
        return None
    now = list(cur.series("evald_watermark_timestamp_seconds").values())
    then = list(prev.series("evald_watermark_timestamp_seconds").values())
    if not now or not then:
        return None
    return max(0.0, (min(now) - min(then)) / (cur.at - prev.at))
