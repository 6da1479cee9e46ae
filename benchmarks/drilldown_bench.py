"""The drill-down's cost: CPU of the engine with the query summaries against without, and RSS
of the summaries under millions of distinct queries.

1. CPU: engine_bench's traffic with a Zipf-distributed query on every impression (20,000
   queries, s = 1.1), fed by ``feed_batch`` per 500 lines, ticked, drained; the same bytes
   through an engine with ``drilldown.capacity`` 32 (the default) and 0 (no summaries), and
   the traffic without queries (nothing carried either), interleaved rounds, CPU seconds of
   this process (``time.process_time``), medians. Target (issue 27): ratio <= 1.15.
2. Memory: ``Aggregates.observe`` (the stage the summaries sit in) fed 10 million lists, every
   one with a query never seen before, in 10,000-list batches over one segment, pruned to the
   retention as the engine prunes; RSS after each million. Target: flat (the last figure within
   a few MB of the figure after the first million) while the distinct queries grow tenfold.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from benchmarks import _common as c
from benchmarks.engine_bench import engine_run, load_engine


def with_queries(lines: Sequence[bytes], kinds: Sequence[str], seed: int) -> list[bytes]:
    """The traffic's impression lines with a ``"query"`` (Zipf over 20,000)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 20_001) ** 1.1
    picks = rng.choice(20_000, size=len(lines), p=weights / weights.sum())
    return [
        line[:-1] + b',"query":"Query %d"}' % q if kind == "impression" else line
        for line, kind, q in zip(lines, kinds, picks.tolist(), strict=True)
    ]


def with_labels(lines: Sequence[bytes], kinds: Sequence[str], seed: int) -> list[bytes]:
    """The impression lines with three labels that are not segment keys: a device (3 values),
    a browser (2) and a session id new on every list (the label summaries' worst case)."""
    rng = np.random.default_rng(seed + 1)
    devices = rng.integers(3, size=len(lines)).tolist()
    browsers = rng.integers(2, size=len(lines)).tolist()
    out = []
    for k, (line, kind) in enumerate(zip(lines, kinds, strict=True)):
        if kind == "impression":
            extra = b'"device":"d%d","browser":"b%d","session":"s%d",' % (
                devices[k],
                browsers[k],
                k,
            )
            line = line.replace(b'"labels":{', b'"labels":{' + extra, 1)
        out.append(line)
    return out


def cpu(impressions: int, rounds: int, seed: int) -> None:
    engine_cls, config_cls, _, _ = load_engine()
    traffic = c.generate_traffic(impressions, seed=seed, gap_ms=50)
    lines = with_queries(traffic.lines, traffic.kinds, seed)
    labelled = with_labels(lines, traffic.kinds, seed)
    off = config_cls.model_validate({"drilldown": {"capacity": 0}})
    cases = {
        "no query in the events, capacity 0": (traffic.lines, off),
        "queries, capacity 0 (carried, not summarised)": (lines, off),
        "queries, capacity 32 (the default)": (
            lines,
            config_cls.model_validate({"drilldown": {"capacity": 32}}),
        ),
        "queries and 3 other labels, label_keys 0 (not summarised)": (
            labelled,
            config_cls.model_validate({"drilldown": {"label_keys": 0}}),
        ),
        "queries and 3 other labels, label summaries on (the default)": (
            labelled,
            config_cls.model_validate({}),
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (data, config) in cases.items():
            run = engine_run(data, traffic.kinds, engine_cls, config, batched=True)
            gc.collect()
            t0 = time.process_time()
            results, _engine = run()
            times[name].append(time.process_time() - t0)
            assert results == impressions, (name, results)
    events = len(lines)
    for name, spent in times.items():
        med = statistics.median(spent)
        c.line(
            f"{name}, {events:,} events",
            f"median {c.fmt_s(med)} CPU ({min(spent):.2f}..{max(spent):.2f} s), "
            f"{c.fmt_rate(events / med)} events/s",
        )
    bare, base, drill, unlabelled, labels = (statistics.median(times[n]) for n in cases)
    ratio = drill / base
    c.target("CPU ratio with / without the summaries", f"{ratio:.3f}x", ratio <= 1.15, "<= 1.15x")
    c.line("CPU ratio with the summaries / no query at all", f"{drill / bare:.3f}x")
    c.line("CPU ratio with / without the label summaries (3 labels)", f"{labels / unlabelled:.3f}x")


def memory(lists: int, seed: int) -> None:
    from evald.aggregate import Aggregates
    from evald.segments import SegmentIndex

    measures = ["nDCG@10", "RR", "Success@10", "RBP(p=0.8)", "P@10", "R@10", "AP@10"]
    segments = SegmentIndex(["model", "arm", "surface"], 50, 200)
    seg = segments.segment_of({"model": "m", "arm": "a", "surface": "s"})
    retention = 3 * 3_600_000
    aggregates = Aggregates(
        measures, segments, [0.5, 1.0], 60_000, [300_000, 3_600_000], retention, 0, 32
    )
    rng = np.random.default_rng(seed)
    batch = 10_000
    ids = np.full(batch, seg, dtype=np.intp)
    start = 1_763_683_200_000
    base = None
    for done in range(0, lists, batch):
        ts = start + (done + np.arange(batch, dtype=np.int64)) * 10  # 100 lists/s of event time
        queries = [f"distinct query number {done + i}" for i in range(batch)]
        values = rng.random((batch, len(measures)))
        aggregates.observe(0, ids, ts, values, queries=queries)
        aggregates.prune(0, int(ts[-1]) - retention)
        if (done + batch) % 1_000_000 == 0:
            gc.collect()
            rss = c.rss_bytes()
            base = rss if base is None else base
            c.line(f"RSS after {done + batch:>10,} distinct queries", f"{rss / 2**20:8.1f} MiB")
    assert base is not None
    grew = (c.rss_bytes() - base) / 2**20
    c.target("RSS growth after the first million", f"{grew:+.1f} MiB", grew < 16, "< 16 MiB (flat)")


def main(argv: Sequence[str] | None = None) -> int:
    args = c.parse_args(__doc__ or "", argv)
    impressions, rounds, lists = (20_000, 3, 2_000_000) if args.quick else (100_000, 5, 10_000_000)

    def body() -> None:
        cpu(impressions, rounds, args.seed)
        memory(lists, args.seed)

    return c.run_main("The drill-down's query summaries: CPU and memory", body)


if __name__ == "__main__":
    sys.exit(main())
