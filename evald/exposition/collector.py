"""Collectors a registry holds: the engine's series (from the table) and ``evald_ready``.

Why a custom collector: the engine keeps plain counters and numpy arrays; building metric
families from them at scrape time costs nothing on the event hot path (no per-event
``.labels()`` lookups, no locks taken per event). What is exposed is the table in
:mod:`evald.exposition.series`; this module only renders it, one generic way per family type.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from evald.exposition.encoder import FrozenLabels
from evald.exposition.series import SEGMENT, SERIES, SERIES_AGE, Series

if TYPE_CHECKING:
    from evald.engine import Engine

log = logging.getLogger(__name__)

__all__ = ["READY_HELP", "EngineCollector", "ReadyCollector", "Snapshot", "ready_family"]


class Snapshot:
    """Engine state copied in one go (under the caller's lock), so families are built without
    holding it and every family of one scrape describes the same moment.

    Holds the segment label keys and one copy per distinct :attr:`Series.source` of the table.
    """

    __slots__ = ("label_keys", "states")

    def __init__(self, engine: Engine, series: Sequence[Series] = SERIES) -> None:
        self.label_keys: tuple[str, ...] = tuple(engine.segments.keys)
        self.states: dict[Callable[[Engine], Any], Any] = {}
        for entry in series:
            if entry.source not in self.states:
                self.states[entry.source] = entry.source(engine)

    def of(self, series: Series) -> Any:
        """The copy ``series`` reads its rows from."""
        return self.states[series.source]


class EngineCollector:
    """prometheus_client custom collector over an :class:`~evald.engine.Engine`.

    Reads the engine's plain state at scrape time; nothing is recorded per event. The engine is
    not thread-safe: pass the ``lock`` the processing loop holds around ``feed``/``tick``/
    ``drain`` so a scrape copies a consistent state (held only for the copy, a few ms at 10k
    series). Without a lock the copy is retried when a dict changes size under it.

    ``engine`` may be replaced (``collector.engine = new``) when the owner rebuilds its engine,
    or be None (no engine series). ``series`` is the table it renders (default: all of them).

    A lock that gives up (raises TimeoutError: `evald run`'s, while the loop holds the engine
    through a large poll or a restore) does not leave a gap: the last complete snapshot is
    rendered again, and ``evald_engine_series_age_seconds`` says how old it is, so dashboards
    and ``rate()`` see the same counters again instead of series that vanish and come back.
    """

    def __init__(
        self,
        engine: Engine | None,
        *,
        lock: AbstractContextManager[Any] | None = None,
        retries: int = 5,
        max_cached: int = 100_000,
        series: Sequence[Series] = SERIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.series = tuple(series)
        self.lock = lock
        self.retries = max(1, retries)
        self.max_cached = max_cached
        #: scrapes whose engine state could not be read now (logged; the last snapshot, if
        #: any, is served after a lock timeout; otherwise the engine series are left out)
        self.failures = 0
        self._clock = clock
        self._last: tuple[Snapshot, float] | None = None  # the last complete snapshot, when
        # Label dicts are built only when a series is new, then reused across scrapes (the
        # encoder caches their rendering by identity): per label names (and bucket bounds),
        # per label values.
        self._labels: dict[tuple[Any, ...], dict[tuple[str, ...], Any]] = {}

    def describe(self) -> Iterable[Metric]:
        """Family names without samples, so a registry can refuse duplicates at register()."""
        return [Metric(s.name, s.name, s.kind) for s in self.series] + [
            Metric(SERIES_AGE, SERIES_AGE, "gauge")
        ]

    def snapshot(self) -> Snapshot | None:
        engine = self.engine
        if engine is None:
            return None
        for attempt in range(self.retries):
            try:
                if self.lock is None:
                    return Snapshot(engine, self.series)
                with self.lock:
                    return Snapshot(engine, self.series)
            except RuntimeError:  # "dictionary changed size during iteration", unlocked only
                if self.lock is not None or attempt == self.retries - 1:
                    raise
        return None  # unreachable

    def collect(self) -> Iterator[Metric]:
        age = 0.0
        try:
            snap = self.snapshot()
            if snap is not None:
                self._last = (snap, self._clock())
        except TimeoutError as exc:  # the loop kept the engine (evald run: a poll, a restore)
            self.failures += 1
            last = self._last
            if last is None:
                log.warning("%s; no complete page yet to serve instead", exc)
                return
            snap, age = last[0], self._clock() - last[1]
            log.warning("%s; serving the last complete page (%.1fs old)", exc, age)
        except Exception:
            # The registry's other collectors (evald_ready, daemon, process) must still be
            # served, above all while something is wrong: skip only the engine's families.
            self.failures += 1
            log.exception("reading the engine for /metrics failed; its series are left out")
            return
        if snap is None:
            return
        if sum(len(cache) for cache in self._labels.values()) > self.max_cached:
            self._labels.clear()
        for series in self.series:
            yield self._family(series, snap)
        family = Metric(
            SERIES_AGE,
            "Seconds since the engine's series in this scrape were read: 0 when read for it; "
            "above 0 when the poll loop held the engine past the scrape's wait and the last "
            "complete page was served again.",
            "gauge",
        )
        family.samples.append(Sample(SERIES_AGE, {}, age))
        yield family

    def _family(self, series: Series, snap: Snapshot) -> Metric:
        names: list[str] = []
        for name in series.labels:
            if name == SEGMENT:
                names.extend(snap.label_keys)
            else:
                names.append(name)
        state = snap.of(series)
        family = Metric(series.name, series.help, series.kind)
        if series.bounds is not None:
            les = [floatToGoString(b) for b in series.bounds(state)] + ["+Inf"]
            self._histogram(family, tuple(names), les, series.rows(state))
            return family
        sample_name = series.name + "_total" if series.kind == "counter" else series.name
        cache = self._labels.setdefault(tuple(names), {})
        samples = family.samples
        for values, value in series.rows(state):
            labels = cache.get(values)
            if labels is None:
                labels = cache[values] = FrozenLabels(zip(names, values, strict=True))
            samples.append(Sample(sample_name, labels, value))
        return family

    def _histogram(
        self,
        family: Metric,
        names: tuple[str, ...],
        les: list[str],
        rows: Iterable[tuple[tuple[str, ...], Any]],
    ) -> None:
        """``_bucket`` per bound (cumulative), ``_count`` (the +Inf bucket) and ``_sum``."""
        bucket, count, total = (f"{family.name}_{part}" for part in ("bucket", "count", "sum"))
        cache = self._labels.setdefault((*names, "le", *les), {})
        samples = family.samples
        for values, (buckets, value_sum) in rows:
            cached = cache.get(values)
            if cached is None:
                base = FrozenLabels(zip(names, values, strict=True))
                cached = cache[values] = (base, [FrozenLabels(base, le=le) for le in les])
            base, bucket_labels = cached
            for labels, n in zip(bucket_labels, buckets, strict=True):
                samples.append(Sample(bucket, labels, n))
            samples.append(Sample(count, base, buckets[-1]))
            samples.append(Sample(total, base, value_sum))


#: ``evald_ready``'s help, the words `evald run` has always served (the check is /readyz's)
READY_HELP = "1 when every assigned partition is restored and the broker answers"


def ready_family(ok: bool) -> Metric:
    """``evald_ready``, defined once for every command that serves it: 1 if ``ok``, else 0."""
    family = Metric("evald_ready", READY_HELP, "gauge")
    family.samples.append(Sample("evald_ready", {}, 1.0 if ok else 0.0))
    return family


class ReadyCollector:
    """``evald_ready`` (:func:`ready_family`) from the owner's readiness check.

    For commands without a collector of their own for it (``evald demo``); the Kafka daemon
    exports the same family from its own collector instead.
    """

    def __init__(self, ready: Callable[[], object]) -> None:
        self.ready = ready

    def describe(self) -> Iterable[Metric]:
        return [ready_family(False)]

    def collect(self) -> Iterator[Metric]:
        try:
            result = self.ready()
            ok = bool(result[0]) if isinstance(result, tuple) else bool(result)
        except Exception:  # a broken check reads as not ready, never as a failed scrape
            ok = False
        yield ready_family(ok)
