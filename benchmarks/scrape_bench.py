"""Scrape cost: `/metrics` of an engine holding >= 10k series, rendered and served over HTTP.

A real Engine is fed seeded traffic spread over enough segments (label values) that its
exposition reaches 10k series, with >= 1h of event time so the 5m and 1h windows are complete,
windows closing by the watermark. Timed (best and median of repeated scrapes): prometheus_client's
``generate_latest`` on the engine's registry, evald's own caching ``Encoder``, and an HTTP GET of
``/metrics`` from ``evald.http.MetricsServer`` on 127.0.0.1. Baseline, same run: a stock labelled
``Gauge`` with the same number of series rendered by ``generate_latest`` and served by the same
HTTP server.

Target (issue 6 §5): `/metrics` with 10k series renders in <= 100 ms.

Label combinations (issue 10 §4): the same default engine fed impressions over 100,000 distinct
(model, arm, surface) combinations, every key within its 50-value cap, against 1 combination
as the baseline, each in a fresh interpreter: series exposed, HTTP GET `/metrics` time, RSS,
and how many renderings 8 concurrent scrapers cost. Before the segment cap, 10k combinations
gave 1.41M series and 9-11 s scrapes; 100k never finished a scrape.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import threading
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
    engine = engine_mod.Engine(config_mod.EngineConfig(window="30m"), clock=lambda: 1_763_769_600.0)  # type: ignore[attr-defined]
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


COMBINATIONS = 100_000
PER_COMBINATION = 2  # impressions per combination, so every kept window mean has n >= 2
CONCURRENT = 8


def combination_labels(i: int) -> dict[str, str]:
    """Combination ``i`` of 100,000: 50 models x 50 arms x 40 surfaces."""
    return {"model": f"m{i % 50}", "arm": f"a{i // 50 % 50}", "surface": f"s{i // 2500}"}


def child(combinations: int, seed: int, repeat: int) -> dict[str, Any]:
    """One measurement in this (fresh) interpreter: feed, then scrape over HTTP."""
    import random

    engine_mod = c.require("evald.engine", "Engine")
    config_mod = c.require("evald.config", "EngineConfig")
    expo = c.require("evald.exposition", "build_registry", "Encoder")
    http_mod = c.require("evald.http", "MetricsServer")
    rng = random.Random(seed)
    n = COMBINATIONS * PER_COMBINATION  # the same traffic volume for every case
    gap = SPAN_MS // n
    start = 1_763_683_200_000
    engine = engine_mod.Engine(config_mod.EngineConfig(window="30m"), clock=lambda: 1_763_683_200.0)  # type: ignore[attr-defined]
    rss_start = c.rss_bytes()
    t0 = time.perf_counter()
    for i in range(n):
        ts = start + i * gap
        items = [f"d{rng.randrange(200_000)}" for _ in range(10)]
        engine.feed(c.impression_line(f"r{i}", ts, items, combination_labels(i % combinations)))
        if rng.random() < 0.5:
            engine.feed(c.feedback_line(f"r{i}", ts + 1_000, items[rng.randrange(3)], "click"))
        if i % 20_000 == 0:
            engine.tick()
    engine.tick()
    fed = time.perf_counter() - t0
    registry, _ = expo.build_registry(engine, process=False)  # type: ignore[attr-defined]
    encoder = expo.Encoder()  # type: ignore[attr-defined]
    server = http_mod.MetricsServer("127.0.0.1:0", registry, encoder=encoder)  # type: ignore[attr-defined]
    server.start()
    try:
        url = server.url + "/metrics"
        status, got = c.http_get(url, timeout=600)
        assert status == 200, status
        best, median = timings(lambda: c.http_get(url, timeout=600), repeat)
        before = encoder.renders
        barrier = threading.Barrier(CONCURRENT)

        def scraper() -> None:
            barrier.wait()
            c.http_get(url, timeout=600)

        threads = [threading.Thread(target=scraper) for _ in range(CONCURRENT)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        renders = encoder.renders - before
    finally:
        server.stop()
    return {
        "combinations": combinations,
        "impressions": n,
        "segments": len(engine.segments),
        "series": series_count(got),
        "bytes": len(got),
        "overflow": int(engine.aggregates.overflow),
        "feed_s": fed,
        "scrape_best_s": best,
        "scrape_median_s": median,
        "renders": renders,
        "rss_start": rss_start,
        "rss_end": c.rss_bytes(),
    }


def run_child(combinations: int, seed: int, repeat: int) -> dict[str, Any]:
    cmd = c.python_cmd(
        "-m",
        "benchmarks.scrape_bench",
        "--child-combinations",
        str(combinations),
        "--seed",
        str(seed),
        "--repeat",
        str(repeat),
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    answer: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if "not_available" in answer:
        raise c.NotAvailable(answer["not_available"])
    return answer


def combinations_body(seed: int, repeat: int) -> None:
    c.line(
        "label combinations",
        f"{COMBINATIONS * PER_COMBINATION:,} impressions over 1 or {COMBINATIONS:,} "
        "combinations, default settings, each case in a fresh interpreter",
    )
    rows = {k: run_child(k, seed, repeat) for k in (1, COMBINATIONS)}
    for k, row in rows.items():
        who = "baseline: 1 combination" if k == 1 else f"{k:,} combinations"
        c.line(
            f"{who}: series",
            f"{row['series']:,} ({row['segments']} segments, {row['bytes'] / 1e6:.2f} MB, "
            f"{row['overflow']:,} impressions in the overflow)",
        )
        c.line(
            f"{who}: HTTP GET /metrics",
            f"best {c.fmt_s(row['scrape_best_s'])}  median {c.fmt_s(row['scrape_median_s'])}",
        )
        c.line(
            f"{who}: RSS",
            f"{row['rss_start'] / 1e6:.0f} MB at start, {row['rss_end'] / 1e6:.0f} MB at the "
            f"end (fed in {c.fmt_s(row['feed_s'])})",
        )
        c.line(f"{who}: renderings for {CONCURRENT} concurrent GETs", str(row["renders"]))
    base, many = rows[1], rows[COMBINATIONS]
    c.line(
        "ratio 100k / 1 combination: series, scrape (median), RSS",
        f"{many['series'] / base['series']:.1f}x, "
        f"{many['scrape_median_s'] / base['scrape_median_s']:.1f}x, "
        f"{many['rss_end'] / base['rss_end']:.2f}x",
    )
    config_mod = c.require("evald.config", "EngineConfig")
    expo = c.require("evald.exposition", "SeriesShape")
    config = config_mod.EngineConfig(window="30m")  # type: ignore[attr-defined]
    bound = expo.SeriesShape.of(config).worst_case(config.max_segments) + 1  # type: ignore[attr-defined]
    c.target(
        f"series at {COMBINATIONS:,} combinations",
        f"{many['series']:,}",
        many["series"] <= bound,
        f"<= {bound:,} (worst case of the settings, one partition)",
    )


def through_run(combinations: int, repeat: int) -> dict[str, Any]:
    """`evald run` on a fresh broker fed one impression per combination slot; scraped over HTTP
    once every impression whose window closed is finalized."""
    n = COMBINATIONS
    window_ms = 60_000
    start = 1_763_683_200_000
    with c.broker() as bootstrap:
        imp, fb = "bench-imp", "bench-fb"
        c.create_topics(bootstrap, [imp, fb], 1)
        lines = [
            c.impression_line(
                f"r{i}", start + i * 60, ["a", "b", "c"], combination_labels(i % combinations)
            )
            for i in range(n)
        ]
        # a later impression of a kept combination closes every window above
        lines.append(c.impression_line("push", start + 3 * 3_600_000, ["a"], combination_labels(0)))
        c.produce(bootstrap, [(imp, c.request_key(raw), raw) for raw in lines])
        port = c.free_port()
        cmd = c.python_cmd(
            "-m",
            "evald",
            "run",
            "--bootstrap-servers",
            bootstrap,
            "--impressions-topic",
            imp,
            "--feedback-topic",
            fb,
            "--results-topic",
            "bench-res",
            "--dlq-topic",
            "bench-dlq",
            "--group-id",
            "bench",
            "--metrics-address",
            f"127.0.0.1:{port}",
            "--set",
            f"engine.window={window_ms}",
            "--set",
            "engine.lateness=0",
        )
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            deadline = time.monotonic() + 600
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"evald run exited with {proc.returncode}")
                try:
                    status, got = c.http_get(url, timeout=60)
                except OSError:
                    status, got = 0, b""
                done = c.sum_samples(
                    c.parse_samples(got.decode()), "evald_impressions_finalized_total"
                )
                if status == 200 and done >= n:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {done:,.0f} of {n:,} finalized after 600 s")
                time.sleep(0.5)
            best, median = timings(lambda: c.http_get(url, timeout=60), repeat)
            status, got = c.http_get(url, timeout=60)
            samples = c.parse_samples(got.decode())
        finally:
            c.stop_process(proc, timeout=60)
    return {
        "series": series_count(got),
        "engine_series": sum(
            1 for key in samples if key.startswith("evald_") and not key.startswith(DAEMON_SERIES)
        ),
        "bytes": len(got),
        "overflow": c.sum_samples(samples, "evald_segments_overflow_total"),
        "scrape_best_s": best,
        "scrape_median_s": median,
        "rss": c.sum_samples(samples, "process_resident_memory_bytes"),
    }


#: series of the daemon's own collector, not bounded by the engine settings
DAEMON_SERIES = (
    "evald_ready",
    "evald_consumer_lag",
    "evald_backpressure_pauses",
    "evald_dlq_records",
    "evald_results_produced",
)


def run_body(repeat: int) -> None:
    c.line(
        "through `evald run` on a broker",
        f"{COMBINATIONS:,} impressions (1 partition), window 1m, one process per case",
    )
    rows = {k: through_run(k, repeat) for k in (1, COMBINATIONS)}
    for k, row in rows.items():
        who = "baseline: 1 combination" if k == 1 else f"{k:,} combinations"
        c.line(
            f"run, {who}: series",
            f"{row['series']:,} ({row['engine_series']:,} from the engine, "
            f"{row['bytes'] / 1e6:.2f} MB, overflow {row['overflow']:,.0f})",
        )
        c.line(
            f"run, {who}: HTTP GET /metrics",
            f"best {c.fmt_s(row['scrape_best_s'])}  median {c.fmt_s(row['scrape_median_s'])}",
        )
        c.line(f"run, {who}: RSS", f"{row['rss'] / 1e6:.0f} MB")
    base, many = rows[1], rows[COMBINATIONS]
    c.line(
        "run: ratio 100k / 1 combination: series, scrape (median), RSS",
        f"{many['series'] / base['series']:.1f}x, "
        f"{many['scrape_median_s'] / base['scrape_median_s']:.1f}x, "
        f"{many['rss'] / base['rss']:.2f}x",
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--child-combinations" in argv:
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("--child-combinations", type=int, required=True)
        parser.add_argument("--seed", type=int, required=True)
        parser.add_argument("--repeat", type=int, required=True)
        args = parser.parse_args(argv)
        try:
            answer = child(args.child_combinations, args.seed, args.repeat)
        except c.NotAvailable as exc:
            answer = {"not_available": str(exc)}
        print(json.dumps(answer), flush=True)
        return 0

    def everything() -> None:
        body(argv)
        args = c.parse_args(__doc__ or "", argv)
        combinations_body(args.seed, 5 if args.quick else 15)
        run_body(5 if args.quick else 10)

    return c.run_main(
        "Scrape: /metrics at 10k series, and under 100k label combinations", everything
    )


if __name__ == "__main__":
    sys.exit(main())
