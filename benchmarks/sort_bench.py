"""`evald replay --sort` on an export larger than its memory budget: peak RSS and time.

The data: a UBI ``_bulk`` export (an action line before each document, as OpenSearch's UBI data
generator writes it) of searches 2 s apart, each a query record without hits, its list as
per-item ``impression`` events and a few clicks, times spelt as RFC 3339 or epoch ms, written
as exports come: every query record first, then every event, each block out of order. It is
generated, streaming, before anything is timed.

Measured, each in its own child process (``evald replay`` as a user runs it; peak RSS is the
child's ``ru_maxrss``, CPU its user + system time):

* ``--sort --sort-memory BUDGET`` on the export;
* baseline: the same records already in time order, replayed without ``--sort`` (the engine's
  own memory and time for this traffic).

The claim: peak RSS with ``--sort`` stays below the baseline's peak plus the budget, on a file
several times the budget, and both runs give the same results (their digests are compared).
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks import _common as c

START = 1_717_243_200_000  # 2024-06-01T12:00:00Z
CHUNK = 2_000  # searches shuffled together into the export's blocks
WINDOW_MS = 30 * 60_000


def _time(ms: int, rng: random.Random) -> object:
    if rng.random() < 0.5:
        return ms
    seconds, millis = divmod(ms, 1000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{millis:03d}Z" if rng.random() < 0.5 else f"{stamp}.{millis:03d}+0000"


def searches(n: int, seed: int) -> Iterator[list[tuple[int, str, bytes]]]:
    """Chunks of (time, index, document) records of ``CHUNK`` searches each."""
    rng = random.Random(seed)
    chunk: list[tuple[int, str, bytes]] = []
    for k in range(n):
        ts = START + k * 2_000
        qid = f"q{seed}-{k}"
        items = [f"sku-{rng.randrange(5000)}" for _ in range(20)]
        query = {"application": "shop", "query_id": qid, "client_id": f"c{rng.randrange(999)}",
                 "user_query": "red shoes", "timestamp": _time(ts, rng),
                 "query_attributes": {"model": rng.choice(["bm25", "ltr"])}}  # fmt: skip
        chunk.append((ts, "ubi_queries", json.dumps(query).encode()))
        for ordinal, item in enumerate(items):
            shown = ts + rng.choice([0, 0, rng.randrange(5_000)])
            attributes = {"object": {"object_id": item, "object_id_field": "product_id"},
                          "position": {"ordinal": ordinal}}  # fmt: skip
            event = {"application": "shop", "action_name": "impression", "query_id": qid,
                     "timestamp": _time(shown, rng), "event_attributes": attributes}  # fmt: skip
            chunk.append((shown, "ubi_events", json.dumps(event).encode()))
        for _ in range(rng.randrange(4)):
            at = ts + rng.randrange(10_000, 600_000)
            ordinal = rng.randrange(20)
            attributes = {
                "object": {"object_id": items[ordinal]},
                "position": {"ordinal": ordinal},
            }
            click = {
                "application": "shop",
                "action_name": rng.choice(["click", "purchase"]),
                "query_id": qid,
                "timestamp": _time(at, rng),
                "event_attributes": attributes,
            }
            chunk.append((at, "ubi_events", json.dumps(click).encode()))
        if len(chunk) >= CHUNK * 22:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _bulk(index: str, doc: bytes) -> bytes:
    return b'{"index":{"_index":"' + index.encode() + b'"}}\n' + doc + b"\n"


def write_files(target_bytes: int, seed: int, workdir: Path) -> tuple[Path, Path, int]:
    """(the export out of order, the same records in time order, records), at least
    ``target_bytes`` each; streaming: memory holds one chunk and the records not yet due."""
    export, ordered = workdir / "export.ndjson", workdir / "ordered.ndjson"
    events_tmp = workdir / "events.tmp"
    rng = random.Random(seed)
    due: list[tuple[int, int, str, bytes]] = []
    written = records = seq = 0
    with export.open("wb") as queries, events_tmp.open("wb") as events, ordered.open("wb") as out:
        for chunk in searches(10**9, seed):
            rng.shuffle(chunk)
            for ts, index, doc in chunk:
                (queries if index == "ubi_queries" else events).write(_bulk(index, doc))
                heapq.heappush(due, (ts, seq, index, doc))
                seq += 1
                written += len(doc) + 30
                records += 1
            horizon = max(ts for ts, _, _ in chunk) - 700_000  # no later record is older
            while due and due[0][0] <= horizon:
                _, _, index, doc = heapq.heappop(due)
                out.write(_bulk(index, doc))
            if written >= target_bytes:
                break
        while due:
            _, _, index, doc = heapq.heappop(due)
            out.write(_bulk(index, doc))
    with export.open("ab") as tail, events_tmp.open("rb") as events:
        while block := events.read(1 << 20):
            tail.write(block)
    events_tmp.unlink()
    return export, ordered, records


def replay(path: Path, results: Path, extra: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS bytes) of `evald replay` in a child process."""
    argv = [sys.executable, "-m", "evald", "replay", str(path), "--mapping", "ubi",
            "--progress", "never", "--results", str(results), *extra]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss * 1024


def digest(path: Path) -> str:
    """The results as a set: the same lists with the same values, in any order."""
    lines = sorted(path.read_bytes().splitlines())
    return hashlib.sha256(b"\n".join(lines)).hexdigest()[:16]


def measure(args: argparse.Namespace) -> None:
    budget_mb = 16 if args.quick else args.budget_mb
    target = budget_mb * (1 << 20) * args.times
    with tempfile.TemporaryDirectory(prefix="evald-sort-bench-", dir=args.dir) as tmp:
        workdir = Path(tmp)
        export, ordered, records = write_files(target, args.seed, workdir)
        size = os.path.getsize(export)
        c.line("export", f"{size / 1e6:,.0f} MB, {records:,} records, queries then events")
        c.line("budget", f"--sort-memory {budget_mb}M ({size / (budget_mb << 20):.1f}x smaller)")
        # the baseline first: ru_maxrss of RUSAGE_CHILDREN only grows
        base = replay(ordered, workdir / "base.jsonl", [])
        sort = replay(
            export, workdir / "sorted.jsonl", ["--sort", "--sort-memory", f"{budget_mb}M"]
        )
        c.line(
            "baseline (in order)",
            f"peak RSS {base[2] / 1e6:,.0f} MB, CPU {base[1]:.1f} s, wall {base[0]:.1f} s",
        )
        c.line(
            "--sort", f"peak RSS {sort[2] / 1e6:,.0f} MB, CPU {sort[1]:.1f} s, wall {sort[0]:.1f} s"
        )
        extra, budget = max(0, sort[2] - base[2]), budget_mb << 20
        c.line(
            "sort's memory", f"{extra / 1e6:,.0f} MB over the baseline ({extra / budget:.2f} of it)"
        )
        c.line("sort's time", f"{sort[1] / base[1]:.2f}x the baseline's CPU")
        same = digest(workdir / "base.jsonl") == digest(workdir / "sorted.jsonl")
        c.line("results", "identical" if same else "DIFFERENT")
        bound = base[2] + budget
        ok = sort[2] <= bound and same
        c.target(
            "peak RSS",
            f"{sort[2] / 1e6:,.0f} MB",
            ok,
            f"<= baseline + budget = {bound / 1e6:,.0f} MB, same results",
        )


def main(argv: list[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--budget-mb", type=int, default=64, help="--sort-memory in MiB")
        parser.add_argument("--times", type=int, default=5, help="export size in budgets")
        parser.add_argument("--dir", help="where the files go (default: the temporary directory)")

    args = c.parse_args(__doc__.splitlines()[0], argv, extra)
    return c.run_main(
        "replay --sort: peak RSS on an export larger than the budget", lambda: measure(args)
    )


if __name__ == "__main__":
    sys.exit(main())
