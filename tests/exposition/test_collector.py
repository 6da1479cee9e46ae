"""The engine collector over a real Engine fed real events: values checked against an
independent model (support.py), read back with prometheus_client's parsers.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import Counter, defaultdict

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Gauge

from evald.exposition import (
    EngineCollector,
    ReadyCollector,
    build_registry,
)

from .support import (
    LATENESS_MS,
    MEASURES,
    MINUTE,
    OPENMETRICS,
    SEGMENT_LABELS,
    T0,
    WINDOW_MS,
    Z95,
    Key,
    Served,
    engine_registry,
    feed_all,
    feedback,
    impression,
    make_engine,
    named,
    scrape,
    seg_labels,
    segment_key,
    series,
    traffic,
)

# --------------------------------------------------------------------------------------------
# Measure histograms
# --------------------------------------------------------------------------------------------


def test_histogram_count_sum_and_buckets_match_the_finalized_impressions(drained) -> None:
    engine, served = drained
    samples = scrape(engine_registry(engine))
    bounds = [*engine.config.histogram_bounds, math.inf]
    by_segment: dict[tuple[str, str, str], list[dict[str, float]]] = defaultdict(list)
    for imp in served:
        by_segment[segment_key(imp.labels)].append(imp.measures())
    assert len(by_segment) == len(SEGMENT_LABELS)
    for key, rows in by_segment.items():
        for measure in MEASURES:
            labels = {"measure": measure, **seg_labels(key)}
            values = [row[measure] for row in rows]
            assert series(samples, "evald_measure_count", **labels) == len(values)
            assert series(samples, "evald_measure_sum", **labels) == pytest.approx(
                sum(values), rel=1e-12, abs=1e-12
            )
            for bound in bounds:
                le = "+Inf" if bound == math.inf else repr(float(bound))
                got = series(samples, "evald_measure_bucket", le=le, **labels)
                # bracket a value that sits on a bound within rounding error
                low = sum(1 for v in values if v <= bound - 1e-12)
                high = sum(1 for v in values if v <= bound + 1e-12)
                assert low <= got <= high, (key, measure, le, got, low, high)


def test_histogram_series_exist_for_every_segment_and_measure_only(drained) -> None:
    engine, served = drained
    samples = scrape(engine_registry(engine))
    counts = named(samples, "evald_measure_count")
    expected = {
        frozenset({"measure": m, **seg_labels(segment_key(imp.labels))}.items())
        for imp in served
        for m in MEASURES
    }
    assert set(counts) == expected
    # the ignored label key (locale) never reaches a series
    assert all("locale" not in dict(labels) for labels in counts)


def test_all_finalized_impressions_are_counted_once(drained) -> None:
    engine, served = drained
    samples = scrape(engine_registry(engine))
    counts = named(samples, "evald_measure_count")
    for measure in MEASURES:
        total = sum(v for labels, v in counts.items() if dict(labels)["measure"] == measure)
        assert total == len(served)
    finalized = named(samples, "evald_impressions_finalized_total")
    assert sum(finalized.values()) == len(served)


# --------------------------------------------------------------------------------------------
# Event-time windows
# --------------------------------------------------------------------------------------------


def expected_windows(
    served: list[Served], start: int, end: int
) -> dict[tuple[tuple[str, str, str], str], list[float]]:
    out: dict[tuple[tuple[str, str, str], str], list[float]] = defaultdict(list)
    for imp in served:
        if start <= imp.ts < end:
            values = imp.measures()
            for measure in MEASURES:
                out[(segment_key(imp.labels), measure)].append(values[measure])
    return out


def check_window(samples: dict[Key, float], window: str, expected: dict) -> None:
    means = named(samples, "evald_window_mean")
    got_keys = {labels for labels in means if dict(labels)["window"] == window}
    want_keys = {
        frozenset({"measure": m, "window": window, **seg_labels(seg)}.items())
        for seg, m in expected
    }
    assert got_keys == want_keys
    for (seg, measure), values in expected.items():
        labels = {"measure": measure, "window": window, **seg_labels(seg)}
        n = len(values)
        assert series(samples, "evald_window_count", **labels) == n
        assert series(samples, "evald_window_sum", **labels) == pytest.approx(sum(values))
        assert series(samples, "evald_window_sum_squares", **labels) == pytest.approx(
            sum(v * v for v in values)
        )
        assert series(samples, "evald_window_mean", **labels) == pytest.approx(
            statistics.fmean(values)
        )
        ci_key = ("evald_window_ci95_halfwidth", frozenset(labels.items()))
        if n >= 2:
            half = Z95 * statistics.stdev(values) / math.sqrt(n)
            assert samples[ci_key] == pytest.approx(half, rel=1e-9, abs=1e-12)
        else:
            assert ci_key not in samples  # undefined for one value: absent, not NaN


def test_windows_after_drain_are_the_last_5m_and_the_hour(drained) -> None:
    engine, served = drained
    samples = scrape(engine_registry(engine))
    # data spans [T0, T0 + 10m): the newest 5m window is the second one; the hour holds all
    check_window(samples, "5m", expected_windows(served, T0 + 5 * MINUTE, T0 + 10 * MINUTE))
    check_window(samples, "1h", expected_windows(served, T0, T0 + 60 * MINUTE))
    ends = named(samples, "evald_window_end_timestamp_seconds")
    assert ends == {
        frozenset({("window", "5m")}): (T0 + 10 * MINUTE) / 1000,
        frozenset({("window", "1h")}): (T0 + 60 * MINUTE) / 1000,
    }


def test_windows_while_running_show_only_complete_windows() -> None:
    """Without a drain, a window is shown once every impression in it is finalized."""
    served, events = traffic(seed=5, n=120, span_ms=5 * MINUTE)
    engine = make_engine(watermark_quorum=1)  # each event confirms its time
    feed_all(engine, events)
    # One later impression on each partition moves both watermarks to T0 + 8m - lateness:
    # everything in [T0, T0 + 5m) has ts + window <= T0 + 7m, so it is closed.
    clock_ts = T0 + 8 * MINUTE
    for p in (0, 1):
        engine.feed(impression(f"clock{p}", clock_ts, ["x"], {"model": "tick"}), partition=p)
    samples_before = scrape(engine_registry(engine))
    assert named(samples_before, "evald_window_mean") == {}  # nothing scored before tick()
    engine.tick()
    samples = scrape(engine_registry(engine))
    check_window(samples, "5m", expected_windows(served, T0, T0 + 5 * MINUTE))
    # the last complete hour, [T0 - 1h, T0), holds nothing: no 1h series, no 1h end time
    assert not [k for k in named(samples, "evald_window_count") if ("window", "1h") in k]
    assert named(samples, "evald_window_end_timestamp_seconds") == {
        frozenset({("window", "5m")}): (T0 + 5 * MINUTE) / 1000
    }
    # the two clock impressions are still waiting for their window
    assert series(samples, "evald_pending_impressions") == 2


# --------------------------------------------------------------------------------------------
# Pipeline health
# --------------------------------------------------------------------------------------------


def test_health_counters_follow_what_was_fed() -> None:
    now = [100.0]
    engine = make_engine(clock=now, watermark_quorum=1)  # each event confirms its time
    seg = {"model": "m1", "arm": "control", "surface": "web"}
    rejected: Counter[str] = Counter()
    for raw in [b"{not json", b"[1, 2]", b'{"request_id": "x", "ts": "yesterday", "items": []}']:
        result = engine.feed(raw)
        rejected[result.reason] += 1  # type: ignore[union-attr]
    engine.feed(impression("a", T0, ["i1", "i2", "i3"], seg))
    engine.feed(impression("a", T0, ["i1", "i2", "i3"], seg))  # duplicate impression
    engine.feed(impression("b", T0 + 1_000, ["j1", "j2"], seg))  # no feedback: abandoned
    engine.feed(feedback("a", T0 + 2_000, "i2", "click", event_id="e1"))
    engine.feed(feedback("a", T0 + 2_500, "i2", "click", event_id="e1"))  # duplicate event_id
    engine.feed(feedback("a", T0 + 3_000, "nope", "click"))  # item not served
    engine.feed(feedback("a", T0 - 1_000, "i1", "click"))  # before its impression: early
    engine.feed(feedback("zzz", T0 + MINUTE, "q", "purchase"))  # impression never comes
    # after b's window: late; its watermark (T0 + 2m + 5s) also closes "a" and "b"
    late_ts = T0 + WINDOW_MS + LATENESS_MS + 5_000
    engine.feed(feedback("b", late_ts, "j1", "click"))
    engine.feed(impression("c", T0 + 1_000, ["k1"], {"arm": "treatment"}), partition=3)

    samples = scrape(engine_registry(engine))
    assert series(samples, "evald_pending_impressions") == 3
    assert series(samples, "evald_pending_feedback") == 1
    watermark = (late_ts - LATENESS_MS) / 1000
    assert named(samples, "evald_watermark_timestamp_seconds") == {
        frozenset({("partition", "0")}): watermark,
        frozenset({("partition", "3")}): (T0 + 1_000 - LATENESS_MS) / 1000,
    }
    for reason, n in rejected.items():
        assert series(samples, "evald_rejected_total", reason=reason) == n
    assert sum(named(samples, "evald_rejected_total").values()) == 3
    events = named(samples, "evald_events_total")
    assert series(samples, "evald_events_total", kind="impression", outcome="accepted") == 3
    assert series(samples, "evald_events_total", kind="impression", outcome="duplicate") == 1
    assert series(samples, "evald_events_total", kind="feedback", outcome="duplicate") == 1
    assert series(samples, "evald_events_total", kind="feedback", outcome="accepted") == 5
    assert sum(events.values()) == 3 + 3 + 1 + 6
    assert sum(v for k, v in events.items() if ("outcome", "rejected") in k) == 3

    now[0] = 107.5  # wall clock moves on before the drain scores everything
    engine.drain()
    samples = scrape(engine_registry(engine))
    unattributed = {
        dict(k)["reason"]: v for k, v in named(samples, "evald_feedback_unattributed_total").items()
    }
    assert unattributed == {
        "late": 1,
        "early": 1,
        "orphaned": 1,
        "duplicate": 1,
        "unknown_item": 1,
    }
    assert series(samples, "evald_pending_impressions") == 0
    assert series(samples, "evald_pending_feedback") == 0
    finalized = {
        dict(k)["reason"]: v for k, v in named(samples, "evald_impressions_finalized_total").items()
    }
    # "a" and "b" closed by the late feedback's watermark, "c" by the drain
    assert finalized == {"window": 2, "late": 0, "cap": 0, "drain": 1}
    abandoned = named(samples, "evald_impressions_abandoned_total")
    assert abandoned == {
        frozenset(seg.items()): 1,  # "b"
        frozenset({"model": "__none__", "arm": "treatment", "surface": "__none__"}.items()): 1,
    }
    # "a" and "b" were closed at wall 100 and scored at 107.5; "c" closed and scored at 107.5
    lag = named(samples, "evald_finalize_lag_seconds_bucket")
    assert lag[frozenset({("le", "5.0")})] == 1
    assert lag[frozenset({("le", "10.0")})] == 3
    assert lag[frozenset({("le", "+Inf")})] == 3
    assert series(samples, "evald_finalize_lag_seconds_count") == 3
    assert series(samples, "evald_finalize_lag_seconds_sum") == pytest.approx(2 * 7.5)


def test_every_known_reason_is_exported_from_the_start() -> None:
    """rate() and alerts need the series before the first event of each kind."""
    samples = scrape(engine_registry(make_engine()))
    assert len(named(samples, "evald_events_total")) == 9
    assert {dict(k)["reason"] for k in named(samples, "evald_feedback_unattributed_total")} == {
        "late",
        "early",
        "orphaned",
        "duplicate",
        "unknown_item",
    }
    assert {dict(k)["reason"] for k in named(samples, "evald_impressions_finalized_total")} == {
        "window",
        "late",
        "cap",
        "drain",
    }
    from evald.decode import REASONS

    assert {dict(k)["reason"] for k in named(samples, "evald_rejected_total")} == set(REASONS)
    assert named(samples, "evald_watermark_timestamp_seconds") == {}
    assert series(samples, "evald_watermark_outliers_total") == 0
    assert named(samples, "evald_measure_count") == {}


def test_event_times_the_watermark_did_not_follow_are_counted() -> None:
    """Blocks of 4 events: a time 45 minutes ahead in the first is still ahead once the
    second is full, so it is counted; the stream itself is not."""
    engine = make_engine(watermark_quorum=4)
    times = [0, 45 * MINUTE, 1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000]
    for k, ts in enumerate(times):
        engine.feed(impression(f"r{k}", T0 + ts, ["x"], {}))
    samples = scrape(engine_registry(engine))
    assert series(samples, "evald_watermark_outliers_total") == 1
    assert named(samples, "evald_watermark_timestamp_seconds") == {
        frozenset({("partition", "0")}): (T0 + 3_000 - LATENESS_MS) / 1000
    }


def test_label_values_are_escaped_and_capped() -> None:
    engine = make_engine(label_value_cap=2)
    odd = 'q"uote\\back\nline é'
    for i, model in enumerate([odd, "plain", "third", "fourth"]):
        engine.feed(impression(f"r{i}", T0 + i, ["a", "b"], {"model": model, "arm": "x"}))
    engine.drain()
    for accept in (None, OPENMETRICS):
        samples = scrape(engine_registry(engine), accept)
        models = Counter(dict(k)["model"] for k in named(samples, "evald_measure_count"))
        # two accepted values, the rest merged into __other__, three measures each
        assert models == {odd: 3, "plain": 3, "__other__": 3}
        other = {"measure": "RR", "model": "__other__", "arm": "x", "surface": "__none__"}
        assert series(samples, "evald_measure_count", **other) == 2


def test_build_registry_composes_engine_ready_process_and_extra() -> None:
    state = {"ready": False}
    extra = CollectorRegistry()  # a collector of its own, as the daemon brings
    Gauge("evald_consumer_lag", "lag", ["topic", "partition"], registry=extra).labels(
        "imps", "0"
    ).set(5)
    registry, collector = build_registry(make_engine(), ready=lambda: state["ready"], extra=[extra])
    samples = scrape(registry)
    assert series(samples, "evald_ready") == 0
    state["ready"] = True
    samples = scrape(registry)
    assert series(samples, "evald_ready") == 1
    assert series(samples, "evald_consumer_lag", topic="imps", partition="0") == 5
    assert series(samples, "evald_pending_impressions") == 0
    assert ("process_cpu_seconds_total", frozenset()) in samples
    assert ("python_info", frozenset()) not in samples  # python_info has labels
    assert any(name == "python_info" for name, _ in samples)
    collector.engine = None  # e.g. between two daemon sessions
    samples = scrape(registry)
    assert not any(name.startswith("evald_pending") for name, _ in samples)
    assert series(samples, "evald_ready") == 1


def test_a_raising_readiness_check_reads_as_not_ready() -> None:
    def broken() -> bool:
        raise RuntimeError("no broker")

    registry = CollectorRegistry()
    registry.register(ReadyCollector(broken))
    assert series(scrape(registry), "evald_ready") == 0
    registry2 = CollectorRegistry()
    registry2.register(ReadyCollector(lambda: (False, "restoring")))
    assert series(scrape(registry2), "evald_ready") == 0


def test_registry_refuses_a_second_source_of_the_same_series() -> None:
    registry, _ = build_registry(make_engine(), ready=lambda: True, process=False)
    with pytest.raises(ValueError, match="evald_ready"):
        registry.register(ReadyCollector(lambda: True))
    with pytest.raises(ValueError, match="Duplicated"):
        registry.register(EngineCollector(make_engine()))


def test_an_unreadable_engine_leaves_out_only_its_own_series(caplog) -> None:
    """E.g. a daemon's engine proxy before its first session: readiness must still be served."""

    class NoEngineYet:
        def __getattr__(self, name: str) -> object:
            raise AttributeError(name)

    registry, collector = build_registry(
        NoEngineYet(),  # type: ignore[arg-type]
        ready=lambda: (False, "connecting"),
        process=False,
    )
    samples = scrape(registry)
    assert samples == {("evald_ready", frozenset()): 0.0}
    assert collector.failures == 1
    assert "reading the engine for /metrics failed" in caplog.text
    collector.engine = make_engine()
    assert series(scrape(registry), "evald_pending_impressions") == 0
    assert collector.failures == 1


def test_replacing_the_engine_switches_the_series(drained) -> None:
    engine, served = drained
    collector = EngineCollector(make_engine())
    registry = CollectorRegistry()
    registry.register(collector)
    assert named(scrape(registry), "evald_measure_count") == {}
    collector.engine = engine
    total = sum(named(scrape(registry), "evald_impressions_finalized_total").values())
    assert total == len(served)


# --------------------------------------------------------------------------------------------
# Scrapes concurrent with the processing loop
# --------------------------------------------------------------------------------------------


def test_a_scrape_in_the_middle_of_an_aggregate_growth_still_renders() -> None:
    """Without the lock a scrape can land while ``Aggregates._grow`` has replaced the
    histogram counts but not yet the sums: the snapshot keeps the rows every array has."""
    served, events = traffic(seed=3, n=400, span_ms=30 * MINUTE)
    engine = make_engine()
    for partition, _ts, raw in events:
        engine.feed(raw, partition=partition)
    engine.drain()
    agg = engine.aggregates
    rows = len(engine.segments.segments)
    m, b = agg.hist_counts.shape[1:]
    agg.hist_sum = agg.hist_sum[:rows]  # as long as the segments, then the counts grow first
    agg.hist_counts = np.concatenate([agg.hist_counts, np.zeros((8, m, b), np.int64)])
    engine.segments.segment_of({"model": "new", "arm": "control", "surface": "web"})
    samples = scrape(engine_registry(engine))
    assert sum(named(samples, "evald_impressions_finalized_total").values()) == len(served)
    assert len(named(samples, "evald_measure_count")) == rows * len(engine.measure_names)


@pytest.mark.parametrize("locked", [True, False], ids=["with-lock", "without-lock"])
def test_scrapes_while_the_loop_feeds_are_consistent(locked: bool) -> None:
    served, events = traffic(seed=3, n=1500, span_ms=30 * MINUTE)
    engine = make_engine()
    lock = threading.Lock()
    collector = EngineCollector(engine, lock=lock if locked else None, retries=50)
    registry = CollectorRegistry()
    registry.register(collector)
    done = threading.Event()
    failures: list[BaseException] = []

    def loop() -> None:
        try:
            for i, (partition, _ts, raw) in enumerate(events):
                with lock:
                    engine.feed(raw, partition=partition)
                    if i % 200 == 0:
                        engine.tick()
            with lock:
                engine.drain()
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    scrapes = 0
    previous: dict[Key, float] = {}
    try:
        while not done.is_set() or scrapes < 3:
            samples = scrape(registry)
            scrapes += 1
            for key, value in samples.items():
                if key[0].endswith(("_total", "_bucket", "_count")) and key[0].startswith(
                    "evald_measure"
                ):
                    # histogram series are counters: never go down between scrapes
                    assert value >= previous.get(key, 0.0), key
            for labels, count in named(samples, "evald_measure_count").items():
                inf = frozenset({*labels, ("le", "+Inf")})
                assert samples[("evald_measure_bucket", inf)] == count
            previous = samples
    finally:
        worker.join(timeout=120)
    assert not worker.is_alive()
    assert not failures
    assert scrapes >= 3
    final = scrape(registry)
    assert sum(named(final, "evald_impressions_finalized_total").values()) == len(served)


class GivingUpLock:
    """A lock that gives up while ``busy`` (as `evald run`'s does after its wait)."""

    def __init__(self) -> None:
        self.busy = False

    def __enter__(self) -> GivingUpLock:
        if self.busy:
            raise TimeoutError("the poll loop held the engine for over 1s")
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_a_lock_that_gives_up_serves_the_last_complete_page_with_its_age(caplog) -> None:
    """A scrape during a long poll came back without the engine's series: dashboards showed
    gaps and rate() lost points. Now the last complete page comes back, saying how old."""
    served, events = traffic(7, 300, 20 * MINUTE)
    engine = make_engine()
    lock, now = GivingUpLock(), [100.0]
    collector = EngineCollector(engine, lock=lock, clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(collector)
    lock.busy = True  # before any complete page: the engine's series are left out
    assert scrape(registry) == {}
    lock.busy = False
    feed_all(engine, events[:150])
    first = scrape(registry)
    assert series(first, "evald_engine_series_age_seconds") == 0
    feed_all(engine, events[150:])
    engine.drain()
    lock.busy, now[0] = True, 107.5
    stale = scrape(registry)
    assert series(stale, "evald_engine_series_age_seconds") == 7.5
    assert {k: v for k, v in stale.items() if k[0] != "evald_engine_series_age_seconds"} == {
        k: v for k, v in first.items() if k[0] != "evald_engine_series_age_seconds"
    }
    assert "serving the last complete page (7.5s old)" in caplog.text
    lock.busy = False
    fresh = scrape(registry)
    assert series(fresh, "evald_engine_series_age_seconds") == 0
    assert series(fresh, "evald_events_total", kind="impression", outcome="accepted") == len(served)
    assert collector.failures == 2
