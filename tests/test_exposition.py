"""Exposition of a real Engine fed real events: values checked against an independent model.

Every expected number here is computed by the test from the events it generated (grades from
the actions, measures from their textbook formulas, window sums from timestamps), never copied
from the engine's output. The exposition is parsed with prometheus_client's own parsers and,
when available, linted by ``promtool check metrics``.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, Info
from prometheus_client import Counter as PromCounter
from prometheus_client.exposition import generate_latest as library_text
from prometheus_client.openmetrics.exposition import generate_latest as library_om
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.utils import floatToGoString

from evald.config import EngineConfig
from evald.engine import Engine
from evald.exposition import (
    ENGINE_FAMILIES,
    Encoder,
    EngineCollector,
    FrozenLabels,
    ReadyCollector,
    SeriesShape,
    _go_float,
    build_registry,
)

T0 = 1_763_683_200_000  # 2025-11-21T00:00:00Z, aligned to the hour
MINUTE = 60_000
WINDOW_MS = 2 * MINUTE
LATENESS_MS = MINUTE
MEASURES = ("P@3", "RR", "nDCG@3")
GRADE = {"click": 1.0, "add_to_cart": 2.0, "purchase": 3.0}
Z95 = 1.959963984540054
OPENMETRICS = "application/openmetrics-text;version=1.0.0"


# --------------------------------------------------------------------------------------------
# An independent model of what the engine should compute
# --------------------------------------------------------------------------------------------


@dataclass
class Served:
    request_id: str
    ts: int
    items: list[str]
    labels: dict[str, str]
    partition: int
    grades: dict[str, float] = field(default_factory=dict)

    def measures(self) -> dict[str, float]:
        """P@3, RR and nDCG@3 (linear gain, log2 discount, ideal = served grades sorted)."""
        g = [self.grades.get(item, 0.0) for item in self.items]
        p3 = sum(1 for x in g[:3] if x >= 1) / 3
        rr = next((1 / (i + 1) for i, x in enumerate(g) if x >= 1), 0.0)
        dcg = sum(x / math.log2(i + 2) for i, x in enumerate(g[:3]))
        ideal = sorted(g, reverse=True)
        idcg = sum(x / math.log2(i + 2) for i, x in enumerate(ideal[:3]))
        return {"P@3": p3, "RR": rr, "nDCG@3": dcg / idcg if idcg > 0 else 0.0}


def impression(request_id: str, ts: int, items: list[str], labels: dict[str, str]) -> bytes:
    return json.dumps(
        {"request_id": request_id, "ts": ts, "items": items, "labels": labels}
    ).encode()


def feedback(
    request_id: str, ts: int, item: str, action: str, event_id: str | None = None
) -> bytes:
    doc = {"request_id": request_id, "ts": ts, "item": item, "action": action}
    if event_id is not None:
        doc["event_id"] = event_id
    return json.dumps(doc).encode()


def segment_key(labels: dict[str, str]) -> tuple[str, str, str]:
    """The segment an impression lands in: configured keys, ``__none__`` when missing."""
    return tuple(labels.get(k, "__none__") for k in ("model", "arm", "surface"))  # type: ignore[return-value]


SEGMENT_LABELS = [
    {"model": "m1", "arm": "control", "surface": "web"},
    {"model": "m2", "arm": "treatment", "surface": "web"},
    {"model": "m2", "arm": "treatment", "surface": "app", "locale": "de"},
    {"model": "m1", "arm": "control"},  # no surface: __none__
]


def traffic(seed: int, n: int, span_ms: int) -> tuple[list[Served], list[tuple[int, int, bytes]]]:
    """Seeded impressions over ``[T0, T0 + span_ms)`` with in-window feedback, in event order.

    Returns the model of each impression (with the grades its feedback earns) and the events
    as (partition, ts, bytes) sorted by time, impressions before feedback at equal times.
    """
    rng = random.Random(seed)
    served: list[Served] = []
    events: list[tuple[int, int, int, bytes]] = []
    for i in range(n):
        ts = T0 + rng.randrange(span_ms)
        items = [f"d{i}-{k}" for k in range(rng.randint(1, 6))]
        labels = dict(rng.choice(SEGMENT_LABELS))
        imp = Served(f"r{i}", ts, items, labels, partition=i % 2)
        served.append(imp)
        events.append((ts, 0, imp.partition, impression(imp.request_id, ts, items, labels)))
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            rank = min(int(rng.expovariate(0.7)), len(items) - 1)
            action = rng.choice(["click", "click", "click", "add_to_cart", "purchase"])
            fb_ts = ts + rng.randrange(WINDOW_MS + 1)  # inside [ts, ts + window]
            item = items[rank]
            imp.grades[item] = max(imp.grades.get(item, 0.0), GRADE[action])
            events.append((fb_ts, 1, imp.partition, feedback(imp.request_id, fb_ts, item, action)))
    events.sort(key=lambda e: (e[0], e[1]))
    return served, [(p, ts, raw) for ts, _, p, raw in events]


def make_engine(clock: list[float] | None = None, **overrides: object) -> Engine:
    settings: dict[str, object] = {
        "window": WINDOW_MS,
        "lateness": LATENESS_MS,
        "measures": list(MEASURES),
        "max_event_lead": None,  # the clock is frozen far before the events' times
    }
    settings.update(overrides)
    now = clock if clock is not None else [1_000.0]
    return Engine(EngineConfig.model_validate(settings), clock=lambda: now[0])


# --------------------------------------------------------------------------------------------
# Reading an exposition back
# --------------------------------------------------------------------------------------------

Key = tuple[str, frozenset[tuple[str, str]]]


def scrape(registry: CollectorRegistry, accept: str | None = None) -> dict[Key, float]:
    """Every sample of one scrape through Encoder, parsed by prometheus_client's parser."""
    body, content_type = Encoder().encode(registry, accept)
    text = body.decode()
    parse = parse_om if content_type.startswith("application/openmetrics-text") else parse_text
    out: dict[Key, float] = {}
    for family in parse(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out


def series(samples: dict[Key, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def named(samples: dict[Key, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def seg_labels(key: tuple[str, str, str]) -> dict[str, str]:
    return dict(zip(("model", "arm", "surface"), key, strict=True))


def engine_registry(engine: Engine, **kwargs: object) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine, **kwargs))  # type: ignore[arg-type]
    return registry


def feed_all(engine: Engine, events: Iterable[tuple[int, int, bytes]]) -> None:
    for partition, _ts, raw in events:
        engine.feed(raw, partition=partition)


# --------------------------------------------------------------------------------------------
# Measure histograms
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def drained() -> tuple[Engine, list[Served]]:
    """300 impressions over two 5-minute windows, two partitions, fed in order and drained."""
    served, events = traffic(seed=11, n=300, span_ms=10 * MINUTE)
    engine = make_engine()
    feed_all(engine, events)
    engine.drain()
    return engine, served


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
    engine = make_engine()
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
    engine = make_engine(clock=now)
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
    # partition 3 has seen one event: a lone event time is not confirmed, so no watermark yet
    assert named(samples, "evald_watermark_timestamp_seconds") == {
        frozenset({("partition", "0")}): watermark,
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
    assert named(samples, "evald_measure_count") == {}


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


# --------------------------------------------------------------------------------------------
# Formats, promtool, registry composition
# --------------------------------------------------------------------------------------------


def test_openmetrics_and_text_carry_the_same_values(drained) -> None:
    engine, _ = drained
    registry = engine_registry(engine)
    text = scrape(registry)
    om = scrape(registry, OPENMETRICS)
    assert om == text
    types = {f.name: f.type for f in parse_om(Encoder().encode(registry, OPENMETRICS)[0].decode())}
    assert types == dict(ENGINE_FAMILIES)


def test_encoder_writes_exactly_what_prometheus_client_writes(drained) -> None:
    engine, _ = drained
    registry, _ = build_registry(engine, ready=lambda: True)
    PromCounter("evald_probe", "with _created", ["kind"], registry=registry).labels("a").inc()
    Info("evald_build", "info family", registry=registry).info({"version": "1"})

    families = list(registry.collect())  # once: process metrics move between calls

    class Frozen:
        def collect(self):
            return iter(families)

    encoder = Encoder()
    for _ in range(2):  # cold and warm cache
        assert encoder.text(families) == library_text(Frozen())
        assert encoder.openmetrics(families) == library_om(Frozen())


def test_encoder_falls_back_to_prometheus_client_where_it_has_no_fast_path() -> None:
    registry = CollectorRegistry()
    Gauge("evald.dotted", "a UTF-8 era name", registry=registry).set(2)
    hits = PromCounter("evald_hits", "with an exemplar", registry=registry)
    hits.inc(1, exemplar={"trace_id": "abc"})
    encoder = Encoder()
    body, content_type = encoder.encode(registry, OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert b'# {trace_id="abc"}' in body
    assert b"evald_dotted 2.0" in body
    body, content_type = encoder.encode(registry, "text/plain;version=1.0.0;escaping=allow-utf-8")
    assert "escaping=allow-utf-8" in content_type
    assert b'{"evald.dotted"} 2.0' in body


def test_name_filter_restricts_the_output(drained) -> None:
    engine, _ = drained
    body, _ = Encoder().encode(engine_registry(engine), names=["evald_pending_impressions"])
    assert body.decode().splitlines()[-1] == "evald_pending_impressions 0.0"
    assert b"evald_measure" not in body


@pytest.mark.prometheus
def test_promtool_check_metrics_is_clean(drained) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; `make test` installs it)")
    engine, _ = drained
    registry, _ = build_registry(engine, ready=lambda: True)
    body, _ = Encoder().encode(registry)
    assert b"evald_window_count" in body and b"process_cpu_seconds_total" in body
    done = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


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


# --------------------------------------------------------------------------------------------
# docs/metrics-reference.md stays true to the exposition
# --------------------------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs"


def promql_examples() -> list[str]:
    """Every expression in the reference's promql blocks (blank lines separate them)."""
    text = (DOCS / "metrics-reference.md").read_text()
    out = []
    for block in re.findall(r"```promql\n(.*?)```", text, flags=re.S):
        for chunk in re.split(r"\n\s*\n", block):
            lines = [
                ln for ln in chunk.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
            ]
            if lines:
                out.append("\n".join(lines))
    return out


def test_reference_documents_every_exposed_family_and_only_real_names(drained) -> None:
    engine, _ = drained
    registry, _ = build_registry(engine, ready=lambda: True, process=False)
    exposed = scrape(registry)
    sample_names = {name for name, _ in exposed}
    family_names = {name for name, _ in ENGINE_FAMILIES} | {"evald_ready"}
    # a counter with no sample yet (evald_feedback_skipped under the native schema)
    family_names |= {name + "_total" for name, kind in ENGINE_FAMILIES if kind == "counter"}
    contract = set(re.findall(r"`(evald_[a-z0-9_]+)`", (DOCS / "architecture.md").read_text()))
    reference = (DOCS / "metrics-reference.md").read_text()
    documented = set(re.findall(r"\bevald_[a-z0-9_]*[a-z0-9]\b", reference))  # not evald_window_*
    for name, kind in [*ENGINE_FAMILIES, ("evald_ready", "gauge")]:
        shown = name + "_total" if kind == "counter" else name
        assert f"`{shown}`" in reference, f"{shown} is not in docs/metrics-reference.md"
    unknown = documented - sample_names - family_names - contract
    assert not unknown, f"the reference names series evald does not expose: {sorted(unknown)}"
    assert len(promql_examples()) >= 15


@pytest.mark.prometheus
def test_reference_promql_examples_parse(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; `make test` installs it)")
    rules = [
        {"record": f"docs:example_{i}", "expr": expr} for i, expr in enumerate(promql_examples())
    ]
    path = tmp_path / "examples.rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "docs", "rules": rules}]}))  # JSON is YAML
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout.decode()


# --------------------------------------------------------------------------------------------
# Encoder internals that the byte-equality tests may not reach
# --------------------------------------------------------------------------------------------


@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**60), max_value=2**60),
        st.sampled_from([0.0, -0.0, 999_999.9999, 1e6, 1_234_567.0, 1e-7, 2**53, -(2**53)]),
    )
)
def test_value_formatting_matches_prometheus_client(value: float) -> None:
    assert _go_float(value) == floatToGoString(value)


def test_frozen_labels_refuse_changes_so_identity_caching_is_safe() -> None:
    labels = FrozenLabels({"arm": "a"}, measure="RR")
    for change in (
        lambda: labels.__setitem__("arm", "b"),
        lambda: labels.update(arm="b"),
        lambda: labels.pop("arm"),
        lambda: labels.clear(),
        lambda: labels.setdefault("x", "y"),
        lambda: labels.popitem(),
        lambda: labels.__delitem__("arm"),
    ):
        with pytest.raises(TypeError):
            change()
    assert labels == {"arm": "a", "measure": "RR"}


def test_encoder_cache_is_bounded_and_still_correct_after_clearing(drained) -> None:
    """Fresh collectors hand out fresh label sets (as after an engine swap): the identity cache
    would keep every generation; max_cached clears it instead."""
    engine, _ = drained

    def scrape_with(encoder: Encoder) -> tuple[int, int]:
        families = list(EngineCollector(engine).collect())

        class Frozen:
            def collect(self):
                return iter(families)

        assert encoder.text(families) == library_text(Frozen())
        samples = [s for f in families for s in f.samples]
        frozen = sum(1 for s in samples if isinstance(s.labels, FrozenLabels))
        return frozen, len(samples) - frozen

    unbounded, bounded = Encoder(), Encoder(max_cached=100)
    for generation in range(1, 4):
        frozen, other = scrape_with(unbounded)
        assert frozen > 100
        assert len(unbounded._by_identity) == generation * frozen
        assert len(unbounded._by_content) == other
        scrape_with(bounded)
        assert len(bounded._by_identity) + len(bounded._by_content) == frozen + other


# --------------------------------------------------------------------------------------------
# Segment cap and series budget
# --------------------------------------------------------------------------------------------


def test_the_overflow_counter_is_exported_at_zero_from_the_start() -> None:
    samples = scrape(engine_registry(make_engine()))
    assert series(samples, "evald_segments_overflow_total") == 0


def test_a_saturated_engine_exposes_exactly_the_worst_case_of_its_settings() -> None:
    """Every kept segment and the overflow hold >= 2 impressions in the last complete window of
    both widths, so every per-segment series exists: the count must equal SeriesShape's."""
    kept, combinations, per_combination = 4, 9, 3
    engine = make_engine(max_segments=kept, windows=["5m", "1h"])
    rng = random.Random(11)
    served = []
    for i in range(combinations * per_combination):
        combo = i % combinations
        labels = {"model": f"m{combo}", "arm": f"a{combo % 2}", "surface": "web"}
        ts = T0 + i * 1_000
        items = [f"d{i}-{k}" for k in range(3)]
        engine.feed(impression(f"r{i}", ts, items, labels))
        if rng.random() < 0.6:
            engine.feed(feedback(f"r{i}", ts + 10, items[rng.randrange(3)], "click"))
        served.append(combo)
    engine.drain()
    samples = scrape(engine_registry(engine))
    shape = SeriesShape.of(engine.config)
    watermarks = len(named(samples, "evald_watermark_timestamp_seconds"))
    assert watermarks == 1
    assert len(samples) == shape.worst_case(kept) + watermarks
    segments = {
        (dict(k)["model"], dict(k)["arm"])
        for k in named(samples, "evald_impressions_abandoned_total")
    }
    assert segments == {(f"m{c}", f"a{c % 2}") for c in range(kept)} | {("__other__", "__other__")}
    folded = sum(1 for combo in served if combo >= kept)
    assert series(samples, "evald_segments_overflow_total") == folded
    other = {"measure": "RR", "model": "__other__", "arm": "__other__", "surface": "__other__"}
    assert series(samples, "evald_measure_count", **other) == folded


def test_label_combinations_cannot_push_a_scrape_past_the_budget() -> None:
    """20,000 distinct combinations (every key within its value cap) against the defaults."""
    engine = make_engine()
    for i in range(20_000):
        labels = {"model": f"m{i % 50}", "arm": f"a{i // 50 % 50}", "surface": f"s{i // 2500}"}
        engine.feed(impression(f"r{i}", T0 + i * 10, ["a", "b"], labels))
    engine.drain()
    samples = scrape(engine_registry(engine))
    config = engine.config
    assert len(engine.segments) == config.max_segments + 1
    assert len(samples) <= SeriesShape.of(config).worst_case(config.max_segments) + 1
    assert len(samples) <= config.max_series
    assert series(samples, "evald_segments_overflow_total") == 20_000 - config.max_segments


class BlockingCollector:
    """Counts its collections; each one waits for ``release`` so scrapes can pile up on it."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.release = threading.Event()
        self.fail = fail
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Gauge]:
        with self._lock:
            self.calls += 1
        self.release.wait()
        if self.fail:
            raise RuntimeError("collector broke")
        gauge = Gauge("bench", "doc", registry=None)
        gauge.set(self.calls)
        return gauge.collect()


def wait_for(predicate, what: str) -> None:
    """Wait for a condition other threads bring about (no fixed sleeps; fails, never hangs)."""
    deadline = time.monotonic() + 60
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened within 60 s: {what}")
        time.sleep(0.005)


def test_concurrent_scrapes_share_one_rendering_and_later_ones_render_afresh() -> None:
    collector = BlockingCollector()
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    encoder = Encoder()
    bodies: list[bytes] = []
    scrapers = [
        threading.Thread(target=lambda: bodies.append(encoder.encode(registry)[0]), daemon=True)
        for _ in range(6)
    ]
    for thread in scrapers:
        thread.start()
    try:
        wait_for(
            lambda: collector.calls == 1 and encoder.shared.waiting() == 5, "5 waiting scrapers"
        )
    finally:
        collector.release.set()
    for thread in scrapers:
        thread.join(timeout=60)
    assert collector.calls == 1 and encoder.renders == 1
    assert len(bodies) == 6 and len(set(bodies)) == 1 and b"bench 1.0" in bodies[0]
    # nothing is kept after the rendering: the next scrape sees the state of its own time
    assert b"bench 2.0" in encoder.encode(registry)[0]
    assert collector.calls == 2
    assert encoder.shared.waiting() == 0


def test_scrapes_of_different_outputs_do_not_share() -> None:
    collector = BlockingCollector()
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    encoder = Encoder()
    kinds: list[str] = []
    threads = [
        threading.Thread(
            target=lambda a=accept: kinds.append(encoder.encode(registry, a)[1]), daemon=True
        )
        for accept in (None, OPENMETRICS)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: collector.calls == 2, "one rendering per format")
    finally:
        collector.release.set()
    for thread in threads:
        thread.join(timeout=60)
    assert encoder.shared.waiting() == 0
    assert sorted(kinds)[0].startswith("application/openmetrics-text")


def test_a_failed_shared_rendering_fails_every_scraper_that_waited_for_it() -> None:
    collector = BlockingCollector(fail=True)
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    encoder = Encoder()
    errors: list[BaseException] = []

    def scrape_once() -> None:
        try:
            encoder.encode(registry)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=scrape_once, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: collector.calls == 1 and encoder.shared.waiting() == 2, "2 waiting")
    finally:
        collector.release.set()
    for thread in threads:
        thread.join(timeout=60)
    assert len(errors) == 3 and collector.calls == 1
    collector.fail = False
    assert b"bench 2.0" in encoder.encode(registry)[0]  # the next scrape renders again
