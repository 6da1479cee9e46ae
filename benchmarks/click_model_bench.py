"""`evald replay` with a click model against without (issue 28: aim <= 1.3x, CPU time).

The demo's traffic (`evald produce --output`, seeded: impressions of 20 items with a query,
clicks, carts and purchases) is replayed end to end, in this process, without a click model
and with each of ``--click-model pbm|cascade|coec|dbn``: the same decode, join and scoring,
plus the decoder tee, the sessions and the model's batch fit and debiased scoring. Every round
runs every case once, in turn, so load drifting on a shared machine hits all alike; each run is
timed in CPU seconds of this process, after one untimed run of each (imports). Printed: the
median per case and its ratio to the run without a click model.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import _common as c
from evald.cli import main as evald

CASES = ("off", "pbm", "cascade", "coec", "dbn")


def replay_cpu(events: Path, model: str) -> float:
    argv = ["replay", str(events), "--format", "json", "--progress", "never"]
    if model != "off":
        argv += ["--click-model", model]
    start = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        assert evald(argv) == 0
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    args = c.parse_args(__doc__ or "", argv)
    events_n = 20_000 if args.quick else 200_000
    rounds = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        with contextlib.redirect_stderr(io.StringIO()):
            evald(["produce", "--output", str(events), "--events", str(events_n), "--seed", "1"])
        for case in CASES:  # warm-up, not timed: the first replay imports and compiles
            replay_cpu(events, case)
        times: dict[str, list[float]] = {case: [] for case in CASES}
        for _ in range(rounds):
            for case in CASES:
                times[case].append(replay_cpu(events, case))
    base = statistics.median(times["off"])
    print(f"replay of {events_n:,} events, {rounds} round(s), CPU seconds (median)")
    for case in CASES:
        median = statistics.median(times[case])
        print(f"  {case:<8} {median:7.2f} s  {median / base:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
