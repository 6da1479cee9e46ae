"""Prometheus exposition: a custom collector over an Engine, a private registry, a fast encoder.

Why a custom collector: the engine keeps plain counters and numpy arrays; building metric
families from them at scrape time costs nothing on the event hot path (no per-event
``.labels()`` lookups, no locks taken per event).

Why an own encoder: prometheus_client's encoders re-sort and re-escape every label set of every
sample on every scrape, which at 10k series is most of a 100 ms budget. :class:`Encoder` writes
the same bytes (text 0.0.4 and OpenMetrics 1.0.0, checked byte for byte in the tests) but caches
each series' rendered name-and-labels prefix across scrapes; anything it does not handle
(exemplars, native histograms, UTF-8 names, other escapings) falls back to prometheus_client.

Why shared renderings: scrapes that arrive while a rendering of the same output is under way
wait for it and get its bytes (:class:`SingleFlight`), so a burst of scrapers costs one
rendering, not one each, and never holds several bodies in memory.

Why the series count is bounded: segments are capped (``max_segments`` plus one overflow
segment, see evald.segments) and :class:`SeriesShape` derives the worst case from the settings,
which EngineConfig checks against ``max_series``.

Composition: :func:`build_registry` puts the engine collector, ``evald_ready``, the process and
platform collectors and any ``extra`` collectors (the Kafka daemon's :class:`DaemonCollector`)
on one private ``CollectorRegistry``; ``evald.http.MetricsServer`` serves that registry.
Series names, types and labels are listed in docs/metrics-reference.md.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.exposition import generate_latest as _text_generate
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as _om
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from evald.decode import REASONS
from evald.stats import (
    EVENT_KINDS,
    EVENT_OUTCOMES,
    FINALIZE_REASONS,
    LAG_BOUNDS,
    UNATTRIBUTED_REASONS,
)

if TYPE_CHECKING:
    from evald.aggregate import WindowRow
    from evald.config import EngineConfig
    from evald.engine import Engine

log = logging.getLogger(__name__)

__all__ = [
    "ENGINE_FAMILIES",
    "Collector",
    "Encoder",
    "EngineCollector",
    "ReadyCollector",
    "SeriesShape",
    "SingleFlight",
    "build_registry",
]

T = TypeVar("T")


class Collector(Protocol):
    """Anything a CollectorRegistry can hold (prometheus_client's protocol, restated for typing)."""

    def collect(self) -> Iterable[Metric]: ...


_LEGACY_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_TEXT_TYPE = {
    "counter": "counter",
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}
_TEXT_SUFFIX = {"counter": "_total", "info": "_info"}
# Samples prometheus_client's text encoder moves into a separate gauge family after their parent.
_TEXT_SPLIT_SUFFIXES = ("_created", "_gsum", "_gcount")


class _Fallback(Exception):
    """The fast path cannot render this output identically; use prometheus_client's encoder."""


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Flight:
    __slots__ = ("done", "error", "result", "waiters")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.waiters = 0


class SingleFlight(Generic[T]):
    """At most one build per key at a time; callers arriving meanwhile share its result.

    Nothing is kept once a build finishes, so a caller that arrives after it sees fresh state:
    sharing never makes a sequential reader's answer older, it only merges concurrent ones.
    A build that raises raises in every caller that waited for it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[Hashable, _Flight] = {}

    def run(self, key: Hashable, build: Callable[[], T]) -> T:
        with self._lock:
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
            else:
                flight.waiters += 1
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.result  # type: ignore[no-any-return]
        try:
            flight.result = build()
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()
        return flight.result  # type: ignore[no-any-return]

    def waiting(self) -> int:
        """Callers currently waiting for another caller's build (for tests and debugging)."""
        with self._lock:
            return sum(flight.waiters for flight in self._flights.values())


class Encoder:
    """Render a registry like prometheus_client does, with a per-series prefix cache.

    Thread-safe for concurrent scrapes: concurrent requests for the same output (registry,
    format, ``names``) share one rendering (:class:`SingleFlight`); the prefix cache is a dict
    only ever filled with identical values, cleared when it exceeds ``max_cached`` entries, so
    label churn cannot grow it without bound.
    """

    def __init__(self, max_cached: int = 200_000) -> None:
        self.max_cached = max_cached
        self.shared: SingleFlight[bytes] = SingleFlight()
        #: renderings made (shared ones count once); for tests and benchmarks
        self.renders = 0
        # ``name{labels} `` per series; both formats write it alike. Label sets the engine
        # collector hands out as FrozenLabels are keyed by identity (the entry keeps the dict
        # alive, so its id cannot be reused); any other dict by content.
        self._by_identity: dict[tuple[str, int], tuple[FrozenLabels, str]] = {}
        self._by_content: dict[tuple, str] = {}

    def _prefix_of(self, sname: str, labels: dict[str, str]) -> str:
        if labels.__class__ is FrozenLabels:
            entry = self._by_identity.get((sname, id(labels)))
            if entry is not None and entry[0] is labels:
                return entry[1]
            prefix = _prefix(_legacy(sname), labels)
            self._by_identity[(sname, id(labels))] = (labels, prefix)  # type: ignore[assignment]
            return prefix
        key = (sname, *labels.items())
        prefix = self._by_content.get(key)
        if prefix is None:
            prefix = self._by_content[key] = _prefix(_legacy(sname), labels)
        return prefix

    def _trim(self) -> None:
        if len(self._by_identity) + len(self._by_content) > self.max_cached:
            self._by_identity.clear()
            self._by_content.clear()

    def encode(
        self,
        registry: Collector,
        accept: str | None = None,
        *,
        names: Sequence[str] | None = None,
    ) -> tuple[bytes, str]:
        """Body and Content-Type for a scrape with this ``Accept`` header.

        ``names`` restricts the output to those sample names (Prometheus' ``name[]`` query
        parameter), as prometheus_client's own handler does.
        """
        library_encoder, content_type = choose_encoder(accept or "")
        key = (registry, content_type, tuple(names or ()))
        body = self.shared.run(key, lambda: self._render(registry, library_encoder, names))
        return body, content_type

    def _render(
        self,
        registry: Collector,
        library_encoder: Callable[[Any], bytes],
        names: Sequence[str] | None,
    ) -> bytes:
        self.renders += 1
        if names:
            registry = registry.restricted_registry(names)  # type: ignore[attr-defined]
        families = list(registry.collect())
        fixed = _Fixed(families)
        try:
            if library_encoder is _text_generate or _is_partial(
                library_encoder, _text_generate, escaping=_om.UNDERSCORES
            ):
                return self.text(families)
            if _is_partial(
                library_encoder, _om.generate_latest, escaping=_om.UNDERSCORES, version="1.0.0"
            ):
                return self.openmetrics(families)
        except _Fallback:
            pass
        return library_encoder(fixed)

    def text(self, families: Iterable[Metric]) -> bytes:
        """Prometheus text format 0.0.4, byte-identical to ``prometheus_client.generate_latest``."""
        self._trim()
        prefix_of = self._prefix_of
        out: list[str] = []
        append = out.append
        for metric in families:
            name = _legacy(metric.name)
            kind = metric.type
            exposed = name + _TEXT_SUFFIX.get(kind, "")
            doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            append(f"# HELP {exposed} {doc}\n# TYPE {exposed} {_TEXT_TYPE.get(kind, kind)}\n")
            split: dict[str, list[str]] = {}
            for sample in metric.samples:
                sname, labels, value, timestamp, _exemplar, native = sample
                if native is not None:
                    raise _Fallback
                line = prefix_of(sname, labels) + _go_float(value)
                if timestamp is not None:
                    line += f" {int(float(timestamp) * 1000):d}"
                line += "\n"
                if sname.endswith(_TEXT_SPLIT_SUFFIXES) and sname[len(name) :] in (
                    _TEXT_SPLIT_SUFFIXES
                ):
                    split.setdefault(sname[len(name) :], []).append(line)
                else:
                    append(line)
            for suffix, lines in sorted(split.items()):
                append(f"# HELP {name}{suffix} {doc}\n# TYPE {name}{suffix} gauge\n")
                out.extend(lines)
        return "".join(out).encode("utf-8")

    def openmetrics(self, families: Iterable[Metric]) -> bytes:
        """OpenMetrics 1.0.0 text, byte-identical to prometheus_client's OpenMetrics encoder."""
        self._trim()
        prefix_of = self._prefix_of
        out: list[str] = []
        append = out.append
        for metric in families:
            name = _legacy(metric.name)
            append(
                f"# HELP {name} {_escape_value(metric.documentation)}\n"
                f"# TYPE {name} {metric.type}\n"
            )
            if metric.unit:
                append(f"# UNIT {name} {metric.unit}\n")
            for sample in metric.samples:
                sname, labels, value, timestamp, exemplar, native = sample
                if native is not None or exemplar:
                    raise _Fallback
                prefix = prefix_of(sname, labels)
                line = prefix if value is None else prefix + _go_float(value)
                if timestamp is not None:
                    line += f" {timestamp}"
                append(line + "\n")
        append("# EOF\n")
        return "".join(out).encode("utf-8")


class FrozenLabels(dict):  # type: ignore[type-arg]
    """A label set that never changes after construction, so encoders may cache by identity.

    The engine collector builds one per series and reuses it across scrapes.
    """

    __slots__ = ()

    def _frozen(self, *args: object, **kwargs: object) -> None:
        raise TypeError("FrozenLabels cannot be changed")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _frozen  # type: ignore[assignment]
    __ior__ = _frozen  # type: ignore[assignment]


_INF = math.inf


def _go_float(value: float) -> str:
    """Same string as prometheus_client's ``floatToGoString``, without its work for the
    common case: a finite number below 1e6 is exactly ``repr(float(value))``."""
    cls = value.__class__
    if cls is float:
        if -_INF < value < 1e6:  # NaN fails both comparisons
            return repr(value)
    elif cls is int and -(2**53) < value < 1_000_000:
        return repr(float(value))
    return floatToGoString(value)


_KNOWN_LEGACY: set[str] = set()


def _legacy(name: str) -> str:
    """Names the fast path can write verbatim; anything else goes to the library encoder."""
    if name in _KNOWN_LEGACY:
        return name
    if _LEGACY_NAME.match(name) is None:
        raise _Fallback
    if len(_KNOWN_LEGACY) < 10_000:  # names are few; never let odd input grow it unbounded
        _KNOWN_LEGACY.add(name)
    return name


def _prefix(sample_name: str, labels: dict[str, str]) -> str:
    """``name{a="x",b="y"} `` with labels sorted and values escaped, as both formats write it."""
    if not labels:
        return sample_name + " "
    parts = []
    for key, value in sorted(labels.items()):
        parts.append(f'{_legacy(key)}="{_escape_value(value)}"')
    return sample_name + "{" + ",".join(parts) + "} "


def _is_partial(fn: object, func: object, **keywords: str) -> bool:
    return (
        isinstance(fn, partial)
        and fn.func is func
        and not fn.args
        and all(fn.keywords.get(k) == v for k, v in keywords.items())
        and set(fn.keywords) <= set(keywords)
    )


class _Fixed:
    """Already collected families, so a fallback does not scrape the collectors twice."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return iter(self._families)


# --------------------------------------------------------------------------------------------
# The engine collector
# --------------------------------------------------------------------------------------------

#: Values of the ``window`` label come from the configured widths (default ``5m`` and ``1h``).
WINDOW_SERIES: tuple[str, ...] = ("mean", "count", "sum", "sum_squares", "ci95_halfwidth")

_WINDOW_HELP = {
    "mean": "Mean measure value over the last complete event-time window.",
    "count": "Impressions in the last complete event-time window with a finite measure value "
    "(merge across instances: sum).",
    "sum": "Sum of measure values over the last complete event-time window (merge: sum).",
    "sum_squares": "Sum of squared measure values over the last complete event-time window "
    "(merge: sum; with sum and count it gives the variance).",
    "ci95_halfwidth": "95% confidence half-width of the window mean: 1.96 * s / sqrt(n) with the "
    "sample standard deviation s; absent when n < 2.",
}
# A gauge named *_sum or *_count fails promtool's lint ("non-histogram and non-summary metrics
# should not have _sum suffix"); the lint skips untyped metrics and PromQL treats both alike, so
# these two keep their contract names and are exposed untyped.
_WINDOW_TYPE = {
    "mean": "gauge",
    "count": "unknown",
    "sum": "unknown",
    "sum_squares": "gauge",
    "ci95_halfwidth": "gauge",
}

_MEASURE_HELP = (
    "Value of each finalized impression's measure, per measure and segment; observed when the "
    "impression is scored (mean over time: rate(_sum) / rate(_count))."
)

#: (name, type) of every family the engine collector can yield, for ``describe()``.
ENGINE_FAMILIES: tuple[tuple[str, str], ...] = (
    ("evald_measure", "histogram"),
    *((f"evald_window_{part}", _WINDOW_TYPE[part]) for part in WINDOW_SERIES),
    ("evald_window_end_timestamp_seconds", "gauge"),
    ("evald_events", "counter"),
    ("evald_rejected", "counter"),
    ("evald_feedback_unattributed", "counter"),
    ("evald_feedback_skipped", "counter"),
    ("evald_impressions_finalized", "counter"),
    ("evald_impressions_abandoned", "counter"),
    ("evald_segments_overflow", "counter"),
    ("evald_pending_impressions", "gauge"),
    ("evald_pending_feedback", "gauge"),
    ("evald_watermark_timestamp_seconds", "gauge"),
    ("evald_finalize_lag_seconds", "histogram"),
)


@dataclass(frozen=True, slots=True)
class SeriesShape:
    """How many series the engine collector exposes, derived from the settings.

    ``per_segment``: each measure's histogram (one ``_bucket`` per bound plus ``+Inf``, ``_sum``,
    ``_count``), each window width's five ``evald_window_*`` series per measure, and
    ``evald_impressions_abandoned_total``. ``fixed``: the pipeline-health series, which do not
    depend on the input, plus one ``evald_window_end_timestamp_seconds`` per width. Not counted:
    one ``evald_watermark_timestamp_seconds`` per input partition the process owns (bounded by
    the topics, not by the data).
    """

    per_segment: int
    fixed: int

    @classmethod
    def of(cls, config: EngineConfig) -> SeriesShape:
        measures, widths = len(config.measures), len(config.windows)
        histogram = measures * (len(config.histogram_bounds) + 1 + 2)
        windows = measures * len(WINDOW_SERIES) * widths
        fixed = (
            len(EVENT_KINDS) * len(EVENT_OUTCOMES)
            + len(REASONS)
            + len(UNATTRIBUTED_REASONS)
            + len(FINALIZE_REASONS)
            + 1  # evald_segments_overflow_total
            + 2  # evald_pending_impressions, evald_pending_feedback
            + len(LAG_BOUNDS)
            + 3  # evald_finalize_lag_seconds: buckets with +Inf, _count, _sum
            + widths  # evald_window_end_timestamp_seconds
        )
        return cls(histogram + windows + 1, fixed)

    def worst_case(self, max_segments: int) -> int:
        """Series with every kept segment and the overflow segment holding data."""
        return (max_segments + 1) * self.per_segment + self.fixed

    def segments_within(self, max_series: int) -> int:
        """The largest ``max_segments`` whose worst case fits in ``max_series`` (may be < 1)."""
        return (max_series - self.fixed) // self.per_segment - 1


class _Snapshot:
    """Engine state copied in one go (under the caller's lock), so families are built without
    holding it and every family of one scrape describes the same moment."""

    __slots__ = (
        "abandoned",
        "bounds",
        "events",
        "finalized",
        "hist_counts",
        "hist_sum",
        "label_keys",
        "lag_bounds",
        "lag_counts",
        "lag_sum",
        "measures",
        "overflow",
        "pending_feedback",
        "pending_impressions",
        "rejected",
        "segments",
        "skipped",
        "unattributed",
        "watermarks",
        "window_rows",
    )

    def __init__(self, engine: Engine) -> None:
        aggregates = engine.aggregates
        stats = engine.stats
        self.label_keys: tuple[str, ...] = tuple(engine.segments.keys)
        self.measures: list[str] = list(aggregates.measures)
        self.bounds: list[float] = aggregates.bounds.tolist()
        # each array read once: without the lock, a growth between two reads could leave
        # them of different lengths (the arrays are replaced one after another)
        counts, sums, abandoned = aggregates.hist_counts, aggregates.hist_sum, aggregates.abandoned
        segments = engine.segments.segments
        n = min(len(segments), counts.shape[0], sums.shape[0], abandoned.shape[0])
        self.segments: list[tuple[str, ...]] = segments[:n]
        # Cumulative per bucket: the +Inf bucket is also _count, so they always agree.
        self.hist_counts: list = np.cumsum(counts[:n], axis=2).tolist()
        self.hist_sum: list = sums[:n].tolist()
        self.abandoned: list[int] = abandoned[:n].tolist()
        self.overflow = int(aggregates.overflow)
        self.events = dict(stats.events)
        self.rejected = dict(stats.rejected)
        self.unattributed = dict(stats.unattributed)
        self.skipped = dict(stats.skipped)
        self.finalized = dict(stats.finalized)
        self.lag_bounds: list[float] = list(stats.lag_bounds)
        self.lag_counts: list[int] = list(stats.lag_counts)
        self.lag_sum: float = float(stats.lag_sum)
        self.pending_impressions = engine.pending()
        self.pending_feedback = engine.pending_feedback()
        self.watermarks = engine.watermarks()
        self.window_rows: list[WindowRow] = engine.window_rows()


class EngineCollector:
    """prometheus_client custom collector over an :class:`~evald.engine.Engine`.

    Reads the engine's plain state at scrape time; nothing is recorded per event. The engine is
    not thread-safe: pass the ``lock`` the processing loop holds around ``feed``/``tick``/
    ``drain`` so a scrape copies a consistent state (held only for the copy, a few ms at 10k
    series). Without a lock the copy is retried when a dict changes size under it.

    ``engine`` may be replaced (``collector.engine = new``) when the owner rebuilds its engine,
    or be None (no engine series).
    """

    def __init__(
        self,
        engine: Engine | None,
        *,
        lock: AbstractContextManager[Any] | None = None,
        retries: int = 5,
        max_cached: int = 100_000,
    ) -> None:
        self.engine = engine
        self.lock = lock
        self.retries = max(1, retries)
        self.max_cached = max_cached
        #: scrapes whose engine state could not be read (logged; engine series left out)
        self.failures = 0
        # Label dicts are rebuilt from tuples only when a series is new: keyed by series.
        self._hist_labels: dict[tuple, tuple[FrozenLabels, list[FrozenLabels]]] = {}
        self._window_labels: dict[tuple, FrozenLabels] = {}

    def describe(self) -> Iterable[Metric]:
        """Family names without samples, so a registry can refuse duplicates at register()."""
        return [Metric(name, name, kind) for name, kind in ENGINE_FAMILIES]

    def snapshot(self) -> _Snapshot | None:
        engine = self.engine
        if engine is None:
            return None
        for attempt in range(self.retries):
            try:
                if self.lock is None:
                    return _Snapshot(engine)
                with self.lock:
                    return _Snapshot(engine)
            except RuntimeError:  # "dictionary changed size during iteration", unlocked only
                if self.lock is not None or attempt == self.retries - 1:
                    raise
        return None  # unreachable

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self.snapshot()
        except Exception:
            # The registry's other collectors (evald_ready, daemon, process) must still be
            # served, above all while something is wrong: skip only the engine's families.
            self.failures += 1
            log.exception("reading the engine for /metrics failed; its series are left out")
            return
        if snap is None:
            return
        if len(self._hist_labels) + len(self._window_labels) > self.max_cached:
            self._hist_labels.clear()
            self._window_labels.clear()
        yield self._measure_histogram(snap)
        yield from self._windows(snap)
        yield from self._health(snap)

    # ---------------------------------------------------------------- measure histograms

    def _measure_histogram(self, snap: _Snapshot) -> Metric:
        family = Metric("evald_measure", _MEASURE_HELP, "histogram")
        samples = family.samples
        les = [_le(b) for b in snap.bounds] + ["+Inf"]
        cache = self._hist_labels
        keys = snap.label_keys
        for segment, cumulative, sums in zip(
            snap.segments, snap.hist_counts, snap.hist_sum, strict=True
        ):
            for measure, buckets, total in zip(snap.measures, cumulative, sums, strict=True):
                key = (measure, segment)
                cached = cache.get(key)
                if cached is None:
                    base = FrozenLabels(measure=measure, **dict(zip(keys, segment, strict=True)))
                    cached = cache[key] = (base, [FrozenLabels(base, le=le) for le in les])
                base, bucket_labels = cached
                for labels, value in zip(bucket_labels, buckets, strict=True):
                    samples.append(Sample("evald_measure_bucket", labels, value))
                samples.append(Sample("evald_measure_count", base, buckets[-1]))
                samples.append(Sample("evald_measure_sum", base, total))
        return family

    # ---------------------------------------------------------------- event-time windows

    def _windows(self, snap: _Snapshot) -> Iterator[Metric]:
        families = {
            part: Metric(f"evald_window_{part}", _WINDOW_HELP[part], _WINDOW_TYPE[part])
            for part in WINDOW_SERIES
        }
        mean, count, total, squares, half = (families[p].samples for p in WINDOW_SERIES)
        ends: dict[str, int] = {}
        cache = self._window_labels
        for row in snap.window_rows:
            ends[row.window] = max(ends.get(row.window, row.end_ms), row.end_ms)
            key = (row.window, row.measure, *row.labels.values())
            labels = cache.get(key)
            if labels is None:
                labels = cache[key] = FrozenLabels(
                    row.labels, measure=row.measure, window=row.window
                )
            if row.mean == row.mean:  # NaN (no finite value) is left out, not exported
                mean.append(Sample("evald_window_mean", labels, row.mean))
            count.append(Sample("evald_window_count", labels, row.count))
            total.append(Sample("evald_window_sum", labels, row.sum))
            squares.append(Sample("evald_window_sum_squares", labels, row.sum_squares))
            if row.ci95_halfwidth == row.ci95_halfwidth:
                half.append(Sample("evald_window_ci95_halfwidth", labels, row.ci95_halfwidth))
        yield from families.values()
        end_family = Metric(
            "evald_window_end_timestamp_seconds",
            "End (exclusive, event time) of the last complete window the evald_window_* series "
            "describe; absent until a complete window holds data.",
            "gauge",
        )
        for window, end_ms in ends.items():
            end_family.samples.append(
                Sample("evald_window_end_timestamp_seconds", {"window": window}, end_ms / 1000)
            )
        yield end_family

    # ---------------------------------------------------------------- pipeline health

    def _health(self, snap: _Snapshot) -> Iterator[Metric]:
        yield _counter(
            "evald_events",
            "Input events by kind and what the engine did with them.",
            ("kind", "outcome"),
            snap.events.items(),
        )
        yield _counter(
            "evald_rejected",
            "Rejected input records by reason (kept in the rejected file / dead-letter topic).",
            ("reason",),
            [((k,), v) for k, v in snap.rejected.items()],
        )
        yield _counter(
            "evald_feedback_unattributed",
            "Accepted feedback that counted towards no impression, by reason.",
            ("reason",),
            [((k,), v) for k, v in snap.unattributed.items()],
        )
        yield _counter(
            "evald_feedback_skipped",
            "Feedback an input mapping skipped (an action it does not grade), by action; the "
            "first 32 actions by name, the rest as (other).",
            ("action",),
            [((k,), v) for k, v in snap.skipped.items()],
        )
        yield _counter(
            "evald_impressions_finalized",
            "Impressions scored, by what closed them (window; late: it had closed before the "
            "impression arrived; pending cap; drain).",
            ("reason",),
            [((k,), v) for k, v in snap.finalized.items()],
        )
        yield _counter(
            "evald_impressions_abandoned",
            "Finalized impressions with no positive feedback (they score 0), per segment.",
            snap.label_keys,
            zip(snap.segments, snap.abandoned, strict=True),
        )
        yield _counter(
            "evald_segments_overflow",
            "Finalized impressions scored into the overflow segment (every segment label "
            "__other__): mostly label combinations that came after max_segments were kept.",
            (),
            [((), snap.overflow)],
        )
        yield _gauge(
            "evald_pending_impressions",
            "Impressions held in memory, waiting for their attribution window to close.",
            snap.pending_impressions,
        )
        yield _gauge(
            "evald_pending_feedback",
            "Feedback held because its impression has not arrived (yet).",
            snap.pending_feedback,
        )
        marks = Metric(
            "evald_watermark_timestamp_seconds",
            "Event-time watermark per input partition (max event time seen minus the allowed "
            "lateness, or advanced by the idle fallback).",
            "gauge",
        )
        for partition, mark in snap.watermarks.items():
            if mark is not None:
                marks.samples.append(
                    Sample(
                        "evald_watermark_timestamp_seconds",
                        {"partition": str(partition)},
                        mark / 1000,
                    )
                )
        yield marks
        lag = Metric(
            "evald_finalize_lag_seconds",
            "Wall time from an attribution window closing (by the watermark) to its impressions "
            "being scored.",
            "histogram",
        )
        cumulative = 0
        for bound, n in zip([*snap.lag_bounds, math.inf], snap.lag_counts, strict=True):
            cumulative += n
            lag.samples.append(
                Sample("evald_finalize_lag_seconds_bucket", {"le": _le(bound)}, cumulative)
            )
        lag.samples.append(Sample("evald_finalize_lag_seconds_count", {}, cumulative))
        lag.samples.append(Sample("evald_finalize_lag_seconds_sum", {}, snap.lag_sum))
        yield lag


def _le(bound: float) -> str:
    """Bucket bound as prometheus_client writes it (``0.5``, ``1.0``, ``+Inf``)."""
    return floatToGoString(bound)


def _counter(
    name: str,
    documentation: str,
    label_names: Sequence[str],
    rows: Iterable[tuple[Sequence[str], float]],
) -> Metric:
    family = Metric(name, documentation, "counter")
    sample_name = name + "_total"
    for values, value in rows:
        labels = dict(zip(label_names, values, strict=True))
        family.samples.append(Sample(sample_name, labels, value))
    return family


def _gauge(name: str, documentation: str, value: float) -> Metric:
    family = Metric(name, documentation, "gauge")
    family.samples.append(Sample(name, {}, value))
    return family


class ReadyCollector:
    """``evald_ready``: 1 when the owner's readiness check passes, else 0.

    For commands without a collector of their own for it (``evald demo``); the Kafka daemon
    exports ``evald_ready`` from its own collector instead.
    """

    def __init__(self, ready: Callable[[], object]) -> None:
        self.ready = ready

    def describe(self) -> Iterable[Metric]:
        return [Metric("evald_ready", "evald_ready", "gauge")]

    def collect(self) -> Iterator[Metric]:
        try:
            result = self.ready()
            ok = bool(result[0]) if isinstance(result, tuple) else bool(result)
        except Exception:  # a broken check reads as not ready, never as a failed scrape
            ok = False
        yield _gauge(
            "evald_ready",
            "1 when evald is ready to serve (inputs restored and flowing), else 0.",
            1.0 if ok else 0.0,
        )


def build_registry(
    engine: Engine | None,
    *,
    lock: AbstractContextManager[Any] | None = None,
    ready: Callable[[], object] | None = None,
    extra: Iterable[Collector] = (),
    process: bool = True,
) -> tuple[CollectorRegistry, EngineCollector]:
    """A private registry with the engine collector and the standard companions.

    ``ready`` adds ``evald_ready`` (leave it out when an ``extra`` collector exports it, as the
    Kafka daemon's does); ``extra`` collectors (the daemon's series) go on the same registry;
    ``process`` adds prometheus_client's process, platform and GC collectors. Returns the
    registry and the engine collector (to swap ``collector.engine`` later).
    """
    registry = CollectorRegistry(auto_describe=True)
    collector = EngineCollector(engine, lock=lock)
    registry.register(collector)
    if ready is not None:
        registry.register(ReadyCollector(ready))
    for item in extra:
        registry.register(item)  # type: ignore[arg-type]
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry, collector
