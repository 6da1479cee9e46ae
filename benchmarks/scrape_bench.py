"""Scrape cost: `/metrics` of an engine holding >= 10k series, rendered and served over HTTP.

A real Engine is fed seeded traffic spread over enough segments (label values) that its
exposition reaches 10k series, with >= 1h of event time so the 5m and 1h windows are complete,
windows closing by the watermark. Timed (best and median of repeated scrapes): prometheus_client's
``generate_latest`` on the engine's registry, evald's own caching ``Encoder``, and an HTTP GET of
``/metrics`` from ``evald.http.MetricsServer`` on 127.0.0.1. Baseline, same run: a stock labelled
``Gauge`` with the same number of series rendered by ``generate_latest`` and served by the same
HTTP server.

Target (issue 6 §5): `/metrics` with 10k series renders in <= 100 ms.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import _common as c

TARGET_SERIES = 10_000
TARGET_S = 0.100
SPAN_MS = 9_000_000  # 2.5 h of event time


def timings(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(best, median) wall seconds of `repeat` calls on unchanged state."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def segments(n: int) -> list[tuple[str, str, str]]:
    """n distinct (model, arm, surface) label tuples, each value under the default cap of 50."""
    out = []
    for i in range(n):
        out.append((f"m{i % 40}", f"a{(i // 40) % 40}", f"s{i // 1600}"))
    return out


def series_count(body: bytes) -> int:
    """Number of samples (non-comment lines) in a text exposition."""
    return sum(1 for row in body.splitlines() if row and not row.startswith(b"#"))


RESERVE = 20_000  # lines kept back and fed between scrapes, so every scrape sees new state
FEED_PER_SCRAPE = 200


class Live:
    """An engine fed most of its traffic, with the rest kept to change its state between scrapes."""

    def __init__(self, engine: Any, registry: Any, reserve: list[bytes]) -> None:
        self.engine, self.registry, self.reserve, self.pos = engine, registry, reserve, 0

    def advance(self) -> None:
        """Feed the next FEED_PER_SCRAPE reserved lines and tick (not timed)."""
        for raw in self.reserve[self.pos : self.pos + FEED_PER_SCRAPE]:
            self.engine.feed(raw)
        self.pos = (self.pos + FEED_PER_SCRAPE) % max(1, len(self.reserve))
        self.engine.tick()


def build(n_segments: int, n_imp: int, seed: int) -> Live:
    """A Live engine over n_segments segments; its windows closed by the watermark."""
    from prometheus_client import CollectorRegistry

    engine_mod = c.require("evald.engine", "Engine")
    config_mod = c.require("evald.config", "EngineConfig")
    expo = c.require("evald.exposition", "EngineCollector")
    gap = max(1, SPAN_MS // n_imp)  # always ~2.5 h of event time: complete 5m and 1h windows
    traffic = c.generate_traffic(n_imp, seed=seed, gap_ms=gap, segments=segments(n_segments))
    engine = engine_mod.Engine(config_mod.EngineConfig(), clock=lambda: 1_763_769_600.0)  # type: ignore[attr-defined]
    keep = min(RESERVE, len(traffic.lines) // 4)
    for raw in traffic.lines[:-keep]:
        engine.feed(raw)
    engine.tick()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(expo.EngineCollector(engine))  # type: ignore[attr-defined]
    return Live(engine, registry, traffic.lines[-keep:])


def timings_changing(fn: Callable[[], object], live: Live, repeat: int) -> tuple[float, float]:
    """(best, median) of `fn` with the engine's state advanced before each call."""
    times = []
    for _ in range(repeat):
        live.advance()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def body(argv: Sequence[str] | None) -> None:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    args = c.parse_args(__doc__ or "", argv)
    repeat = 10 if args.quick else 30
    http_mod = c.require("evald.http", "MetricsServer")
    expo = c.require("evald.exposition", "Encoder")

    # Size the segment count from a 2-point probe: fixed series + per-segment series.
    s1 = series_count(generate_latest(build(1, 4_000, args.seed).registry))
    s2 = series_count(generate_latest(build(2, 4_000, args.seed).registry))
    per_segment = max(1, s2 - s1)
    n_segments = max(2, math.ceil((TARGET_SERIES - (s1 - per_segment)) / per_segment))
    n_segments = min(n_segments, 1_000)  # a sanity bound should the probe mis-measure
    n_imp = max(40_000, n_segments * 500)
    t0 = time.perf_counter()
    live = build(n_segments, n_imp, args.seed)
    registry = live.registry
    body_bytes = generate_latest(registry)
    n_series = series_count(body_bytes)
    c.line("engine", f"{n_segments} segments, {n_imp:,} impressions, default measures")
    c.line("  built in (not timed)", c.fmt_s(time.perf_counter() - t0))
    c.line(
        "series exposed",
        f"{n_series:,} ({per_segment} per segment), {len(body_bytes) / 1e6:.2f} MB",
    )
    c.line("state changes between scrapes", f"{FEED_PER_SCRAPE} events fed + tick() before each")

    # Baseline: a stock labelled Gauge with as many series.
    base_reg = CollectorRegistry(auto_describe=False)
    gauge = Gauge(
        "bench_gauge",
        "baseline gauge",
        ["measure", "window", "model", "arm", "surface"],
        registry=base_reg,
    )
    for i in range(n_series):
        gauge.labels(f"meas{i % 7}", "5m", f"m{i % 97}", f"a{i // 97 % 31}", f"s{i}").set(i * 0.001)
    base_best, base_med = timings(lambda: generate_latest(base_reg), repeat)
    c.line(
        f"baseline: generate_latest, stock Gauge x {n_series:,}",
        f"best {c.fmt_s(base_best)}  median {c.fmt_s(base_med)}",
    )
    gen_best, gen_med = timings_changing(lambda: generate_latest(registry), live, repeat)
    c.line(
        "evald: generate_latest(engine registry)",
        f"best {c.fmt_s(gen_best)}  median {c.fmt_s(gen_med)}",
    )
    encoder = expo.Encoder()  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    encoder.encode(registry)
    cold = time.perf_counter() - t0
    enc_best, enc_med = timings_changing(lambda: encoder.encode(registry), live, repeat)
    c.line("evald: Encoder.encode, first scrape (cold cache)", c.fmt_s(cold))
    c.line(
        "evald: Encoder.encode, later scrapes",
        f"best {c.fmt_s(enc_best)}  median {c.fmt_s(enc_med)}",
    )

    server = http_mod.MetricsServer("127.0.0.1:0", registry)  # type: ignore[attr-defined]
    base_server = http_mod.MetricsServer("127.0.0.1:0", base_reg)  # type: ignore[attr-defined]
    server.start()
    base_server.start()
    try:
        url, base_url = server.url + "/metrics", base_server.url + "/metrics"
        status, got = c.http_get(url)
        c.line("check: HTTP GET /metrics", f"status {status}, {series_count(got):,} series")
        bh_best, bh_med = timings(lambda: c.http_get(base_url), repeat)
        still_best, still_med = timings(lambda: c.http_get(url), repeat)
        http_best, http_med = timings_changing(lambda: c.http_get(url), live, repeat)
    finally:
        server.stop()
        base_server.stop()
    c.line(
        "baseline: HTTP GET, stock Gauge registry",
        f"best {c.fmt_s(bh_best)}  median {c.fmt_s(bh_med)}",
    )
    c.line(
        "evald: HTTP GET /metrics, state unchanged",
        f"best {c.fmt_s(still_best)}  median {c.fmt_s(still_med)}",
    )
    c.line(
        "evald: HTTP GET /metrics, state changed",
        f"best {c.fmt_s(http_best)}  median {c.fmt_s(http_med)}",
    )
    c.line("ratio generate_latest evald / stock gauge (median)", f"{gen_med / base_med:.2f}x")
    c.line("ratio HTTP GET evald (changed) / stock gauge (median)", f"{http_med / bh_med:.2f}x")
    c.target(
        f"HTTP GET /metrics, {n_series:,} series, state changed (median)",
        c.fmt_s(http_med),
        http_med <= TARGET_S and n_series >= TARGET_SERIES,
        "<= 100 ms at >= 10k series",
    )


def main(argv: Sequence[str] | None = None) -> int:
    return c.run_main("Scrape: /metrics at 10k series", lambda: body(argv))


if __name__ == "__main__":
    sys.exit(main())
