"""`evald run`'s engine with ``engine.click_model: pbm`` against without (issue 28: aim <= 1.3x).

The demo's traffic (`evald produce --output`, seeded: impressions of 20 items with a query,
clicks, carts and purchases) is fed as the daemon feeds it: by input partition (four, by
request id, as the producer keys them), a poll batch of 500 records per ``feed_batch`` with the
source offsets, ``tick()`` after each, and at every commit (every ``COMMIT_EVENTS`` records: a
second of traffic at 5,000 events/s) each partition's ``Engine.state`` encoded as its checkpoint
record would be (a model snapshot past 64 KB named by reference, as the daemon's
transaction places it: its bytes decoded once per snapshot, to be sent). With the click model
that adds the decoder tee (pair keys of each impression), the online fit with its refits, and
the model in every checkpoint (its last snapshot, taken again once the lists logged since
outgrow it, plus that log). Every round runs
both cases in turn, so load drifting on a shared machine hits both alike; CPU seconds of this
process, after one untimed run of each. Printed: the medians, their ratio, and the size of a
partition's click-model state in the last checkpoint (snapshot plus log, base64).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from benchmarks import _common as c
from evald.cli import main as evald
from evald.clicks import stream
from evald.config import load_config
from evald.daemon.main import snapshots
from evald.engine import Engine

PARTITIONS = 4
BATCH = 500
COMMIT_EVENTS = 5_000
#: (click model, whether each commit takes the partitions' state, ``stream.LOG_SHARE``:
#: 0 snapshots every partition's whole model at every commit, as before the log)
CASES = {
    "off": ("off", True, stream.LOG_SHARE),
    "pbm": ("pbm", True, stream.LOG_SHARE),
    "pbm, snapshot always": ("pbm", True, 0.0),
    "pbm, no checkpoints": ("pbm", False, stream.LOG_SHARE),
}


def partitioned(lines: list[bytes]) -> list[list[tuple[int, bytes]]]:
    """Each partition's (offset, record) in order, partitioned by request id."""
    out: list[list[tuple[int, bytes]]] = [[] for _ in range(PARTITIONS)]
    for line in lines:
        try:
            rid = str(json.loads(line)["request_id"])
        except (ValueError, KeyError, TypeError):  # the demo's malformed records: dead letters
            rid = ""
        part = out[sum(rid.encode()) % PARTITIONS]
        part.append((len(part), line))
    return out


def placed(held: dict[str, Any], written: dict[int, str], p: int) -> dict[str, Any]:
    """The click model as the transaction places it in the checkpoint record: a snapshot
    past 64 KB leaves it for records of its own, written (decoded, its CRC taken) only when
    it is not the one the last checkpoint named (``Transaction._place_click_model``)."""
    snapshot = held.get("snapshot", "")
    if len(snapshot) <= snapshots.INLINE_STATISTICS_BYTES:
        return held
    if written.get(p) != snapshot:
        written[p] = snapshot
        zlib.crc32(base64.b64decode(snapshot))
    ref = {"offsets": [0, 1, 2, 3, 4], "size": len(snapshot), "crc32": 0, "written_ms": 0}
    return {**{k: v for k, v in held.items() if k != "snapshot"}, "records": ref}


def run_cpu(
    parts: list[list[tuple[int, bytes]]], model: str, commits: bool = True
) -> tuple[float, int]:
    """CPU seconds of feeding every partition round-robin by poll batch (``commits``: taking
    every partition's state every ``COMMIT_EVENTS`` records); and the base64 bytes of the
    click-model state of the partitions' last checkpoints."""
    settings = {"min_event_time": 0, "max_event_lead": None}
    if model != "off":
        settings["click_model"] = model
    engine = Engine(load_config(settings), clock=lambda: 1_900_000_000.0)
    fed = [0] * PARTITIONS
    written: dict[int, str] = {}
    since = 0
    state_bytes = 0
    start = time.process_time()
    longest = max(len(p) for p in parts)
    for lo in range(0, longest, BATCH):
        for p, records in enumerate(parts):
            batch = records[lo : lo + BATCH]
            if not batch:
                continue
            engine.feed_batch([r for _, r in batch], partition=p, offsets=[o for o, _ in batch])
            fed[p] = batch[-1][0] + 1
            since += len(batch)
        engine.tick()
        if commits and since >= COMMIT_EVENTS:
            since = 0
            state_bytes = 0
            for p in range(PARTITIONS):
                doc = engine.state(p, {"impression": fed[p], "feedback": fed[p]}).to_json()
                held = doc.get("click_model", {})
                state_bytes += len(held.get("snapshot", "")) + len(held.get("log", ""))
                doc["click_model"] = placed(held, written, p)
                json.dumps(doc, separators=(",", ":")).encode()  # the checkpoint record
    engine.drain()
    return time.process_time() - start, state_bytes


def main(argv: list[str] | None = None) -> int:
    args = c.parse_args(__doc__ or "", argv)
    events_n = 20_000 if args.quick else 200_000
    rounds = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        with contextlib.redirect_stderr(io.StringIO()):
            evald(["produce", "--output", str(events), "--events", str(events_n), "--seed", "1"])
        parts = partitioned(events.read_bytes().splitlines())
    share = stream.LOG_SHARE
    for model, commits, stream.LOG_SHARE in CASES.values():  # warm-up, not timed
        run_cpu(parts, model, commits)
    times: dict[str, list[float]] = {case: [] for case in CASES}
    sizes: dict[str, int] = {}
    for _ in range(rounds):
        for case, (model, commits, stream.LOG_SHARE) in CASES.items():
            cpu, sizes[case] = run_cpu(parts, model, commits)
            times[case].append(cpu)
    stream.LOG_SHARE = share
    base = statistics.median(times["off"])
    print(
        f"evald run's engine path, {events_n:,} events, {PARTITIONS} partitions, "
        f"{rounds} round(s), CPU seconds (median)"
    )
    for case in CASES:
        median = statistics.median(times[case])
        print(f"  {case:<20} {median:7.2f} s  {median / base:5.2f}x")
    for case in ("pbm", "pbm, snapshot always"):
        print(f"  {case}: click-model state in the last checkpoints {sizes[case]:,} bytes (base64)")
    print(f"  (a commit every {COMMIT_EVENTS:,} records: one a second at {COMMIT_EVENTS:,}/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
