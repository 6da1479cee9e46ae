"""A flood at the pending cap: impressions with no feedback at all, far more than max_pending.

Issue 10 §3: with `engine.max_pending` small against the flood, `evald run` must keep consuming
at the cap (closing the oldest open impression per new one, the documented rule) at a rate near
its rate before the cap, without pausing and resuming the impressions over and over.

A single-node Apache Kafka runs on free loopback ports; seeded impressions (20 items, 1 ms
apart, so none closes by the window within the run) are produced into two partitions;
`python -m evald run` consumes them with `engine.max_pending` = 1/6 of the flood, watched
through `/metrics` 20 times a second. Two rates from the same run: records/s while pending
climbs to the cap (from the first record counted to 90% of max_pending), and records/s at the
cap (from 1.5x max_pending consumed to the end).

Target: rate at the cap >= 0.5x the rate before it, and fewer than 10 backpressure pauses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import _common as c
from benchmarks.kafka_bench import evald_cmd, tail

PARTITIONS = 2
POLL_S = 0.05
#: no progress for this long ends the run: the daemon is stalled at the cap
STALL_S = 30.0
#: allowance for the start (imports, topic creation, init_transactions, the group join)
START_S = 180.0


def rate_between(points: list[tuple[float, float]], low: float, high: float) -> float | None:
    """Records/s between the first samples at or above ``low`` and ``high`` records consumed."""
    t_low = next((t for t, n in points if n >= low), None)
    hit = next(((t, n) for t, n in points if n >= high), None)
    if t_low is None or hit is None or hit[0] <= t_low:
        return None
    n_low = next(n for t, n in points if t == t_low)
    return (hit[1] - n_low) / (hit[0] - t_low)


def body(args: Any) -> None:
    n = 60_000 if args.quick else 300_000
    cap = n // 6
    traffic = c.generate_traffic(n, seed=args.seed, gap_ms=1, feedback_per_impression=0)
    topics = {
        "impressions": "flood.impressions",
        "feedback": "flood.feedback",
        "results": "flood.results",
        "dlq": "flood.dlq",
    }
    records = [(topics["impressions"], c.request_key(raw), raw) for raw in traffic.lines]
    with c.broker() as bootstrap:
        c.create_topics(bootstrap, [topics["impressions"], topics["feedback"]], PARTITIONS)
        took = c.produce(bootstrap, records)
        c.line("topics", f"{PARTITIONS} partitions; {n:,} impressions, no feedback")
        c.line("  produced in (not timed)", c.fmt_s(took))
        c.line("engine.max_pending", f"{cap:,}")
        port = c.free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        env = {**os.environ, "EVALD_ENGINE__MAX_PENDING": str(cap)}
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            evald_cmd(bootstrap, topics, "flood-evald", port),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        points: list[tuple[float, float]] = []
        samples: dict[str, float] = {}
        try:
            last_change = time.time()
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"evald run exited {proc.returncode}: {tail(log)}")
                try:
                    status, raw = c.http_get(url)
                    samples = c.parse_samples(raw.decode()) if status == 200 else samples
                except OSError:
                    pass
                count = c.sum_samples(samples, "evald_events_total")
                now = time.time()
                if not points or count > points[-1][1]:
                    last_change = now
                points.append((now, count))
                quiet = STALL_S if count > 0 else START_S
                if count >= n or now - last_change > quiet:
                    break
                time.sleep(POLL_S)
        finally:
            c.stop_process(proc, timeout=30)
            log.close()
    consumed = points[-1][1] if points else 0
    before = rate_between(points, 1, 0.9 * cap)
    at_cap = rate_between(points, 1.5 * cap, n)
    pauses = c.sum_samples(samples, "evald_backpressure_pauses_total")
    c.line("consumed", f"{consumed:,.0f} of {n:,}" + ("" if consumed >= n else "  (STALLED)"))
    c.line(
        "results produced / closed by the cap",
        f"{c.sum_samples(samples, 'evald_results_produced_total'):,.0f} / "
        f"{c.sum_samples(samples, 'evald_impressions_finalized_total', 'cap'):,.0f}",
    )
    c.line("backpressure pauses", f"{pauses:,.0f}")
    # None when a single scrape already showed 90% of max_pending: too fast to see at this size
    unseen = "not measured: reached between two scrapes"
    c.line(
        "rate before the cap (first .. 90% of max_pending)",
        unseen if before is None else c.fmt_rate(before),
    )
    c.line("rate at the cap (1.5x max_pending .. end)", c.fmt_rate(at_cap or 0.0))
    if before is None:
        c.line("rate at the cap / before it", unseen)
    else:
        ratio = (at_cap or 0.0) / before
        c.target("rate at the cap / before it", f"{ratio:.2f}x", ratio >= 0.5, ">= 0.5x")
    c.target("backpressure pauses", f"{pauses:.0f}", pauses < 10, "< 10")


def main(argv: Sequence[str] | None = None) -> int:
    args = c.parse_args(__doc__ or "", list(sys.argv[1:] if argv is None else argv))
    return c.run_main(
        "Flood at the pending cap: evald run, rate at vs before the cap", lambda: body(args)
    )


if __name__ == "__main__":
    sys.exit(main())
