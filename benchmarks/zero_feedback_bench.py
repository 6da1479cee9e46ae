"""The zero-feedback signals' cost: CPU of the engine with them against without.

engine_bench's traffic (20 items a list) with a Zipf-distributed query on every impression
(drilldown_bench's), fed by ``feed_batch`` per 500 lines, ticked, drained; the same bytes
through an engine with ``zero_feedback.depth`` 10 and 0 (off: no item keys, no memory, no
window sums), interleaved rounds, CPU seconds of this process (``time.process_time``),
medians. The reference arm is the traffic's ``control``. Aim (issue 27, as the drill-down):
ratio <= 1.15.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Sequence

from benchmarks import _common as c
from benchmarks.drilldown_bench import with_queries
from benchmarks.engine_bench import engine_run, load_engine


def cpu(impressions: int, rounds: int, seed: int) -> None:
    engine_cls, config_cls, _, _ = load_engine()
    traffic = c.generate_traffic(impressions, seed=seed, gap_ms=50)
    lines = with_queries(traffic.lines, traffic.kinds, seed)
    cases = {
        f"zero_feedback.depth {depth}": config_cls.model_validate(
            {"zero_feedback": {"depth": depth}}
        )
        for depth in (0, 10)
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, config in cases.items():
            run = engine_run(lines, traffic.kinds, engine_cls, config, batched=True)
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
    off, on = (statistics.median(times[n]) for n in cases)
    ratio = on / off
    c.target("CPU ratio with / without the signals", f"{ratio:.3f}x", ratio <= 1.15, "<= 1.15x")


def main(argv: Sequence[str] | None = None) -> int:
    args = c.parse_args(__doc__ or "", argv)
    impressions, rounds = (20_000, 3) if args.quick else (100_000, 5)
    return c.run_main("The zero-feedback signals: CPU", lambda: cpu(impressions, rounds, args.seed))


if __name__ == "__main__":
    sys.exit(main())
