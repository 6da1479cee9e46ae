"""Memory per pending impression: RSS growth while 1M impressions of 20 items wait in the join.

Each measurement runs in its own child process (clean RSS, nothing left from the parent): RSS is
read from /proc/self/statm after the imports and the engine are set up, then after feeding the
impressions (generated and fed in chunks of 10k, so the generator's bytes never pile up) with a
window so long that nothing finalizes. Baselines, measured the same way in sibling processes:
the same impressions held as parsed JSON (``json.loads`` dicts, what a naive store keeps) and as
their raw bytes.

Target (issue 6 §2): <= 300 bytes of RSS per pending impression of 20 items, at 1M pending.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from benchmarks import _common as c

CHUNK = 10_000
TARGET_BYTES = 300
USER_LISTS = 10  # pending lists per user in the user-id run


def impression_chunks(n: int, seed: int, users: int = 0) -> Iterator[list[bytes]]:
    """n impressions of 20 items, 1 ms apart, 12 segments, as JSON bytes in chunks of CHUNK;
    ``users``: with a ``user_id`` from that many users, round robin (0: none)."""
    rng = np.random.default_rng(seed)
    segs = [
        {"model": m, "arm": a, "surface": s} for m in c.MODELS for a in c.ARMS for s in c.SURFACES
    ]
    start = 1_763_683_200_000
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        items = rng.integers(0, 200_000, size=(hi - lo, 20))
        seg = rng.integers(0, len(segs), size=hi - lo)
        lines = [
            c.impression_line(
                f"r{i:09d}", start + i, [f"i{x}" for x in items[i - lo]], segs[seg[i - lo]]
            )
            for i in range(lo, hi)
        ]
        if users:
            lines = [
                line[:-1] + b',"user_id":"user-%07d"}' % (i % users)
                for i, line in enumerate(lines, lo)
            ]
        yield lines


def child_engine(n: int, seed: int, *, daemon_path: bool = False, users: int = 0) -> dict[str, Any]:
    """Feed n impressions into an Engine whose window never closes; report RSS before/after.

    ``daemon_path``: as ``evald run`` feeds it, a poll batch at a time with the source kind
    and offsets (which the engine then keeps for ``low_offsets``); otherwise ``feed`` per line.
    ``users``: the impressions carry user ids from that many users (``impression_chunks``).
    """
    engine_mod = c.require("evald.engine", "Engine")
    config_mod = c.require("evald.config", "EngineConfig")
    config = config_mod.EngineConfig(window="1000h", max_pending=n + 1)  # type: ignore[attr-defined]
    engine = engine_mod.Engine(config, clock=lambda: 1_763_769_600.0)  # type: ignore[attr-defined]
    # Warm the code paths (and their caches) on a separate engine so only state is measured.
    warm = engine_mod.Engine(config, clock=lambda: 1_763_769_600.0)  # type: ignore[attr-defined]
    for raw in next(impression_chunks(1000, seed + 1)):
        warm.feed(raw)
    warm.tick()
    del warm
    gc.collect()
    before = c.rss_bytes()
    t0 = time.perf_counter()
    offset = 0
    for chunk in impression_chunks(n, seed, users):
        if daemon_path:
            offsets = range(offset, offset + len(chunk))
            engine.feed_batch(chunk, kinds="impression", offsets=offsets)
            offset += len(chunk)
        else:
            for raw in chunk:
                engine.feed(raw)
        engine.tick()
    elapsed = time.perf_counter() - t0
    del chunk
    gc.collect()
    after = c.rss_bytes()
    return {"before": before, "after": after, "pending": engine.pending(), "seconds": elapsed}


def child_parsed(n: int, seed: int, raw_only: bool) -> dict[str, Any]:
    """Hold the same n impressions as parsed JSON objects (or as raw bytes); RSS before/after."""
    gc.collect()
    before = c.rss_bytes()
    held: list[Any] = []
    for chunk in impression_chunks(n, seed):
        if raw_only:
            held.extend(chunk)
        else:
            held.extend(json.loads(raw) for raw in chunk)
    del chunk
    gc.collect()
    after = c.rss_bytes()
    return {"before": before, "after": after, "pending": len(held), "seconds": 0.0}


def run_child(mode: str, n: int, seed: int) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; parse its one-line JSON answer."""
    cmd = c.python_cmd(
        "-m", "benchmarks.memory_bench", "--child", mode, "--n", str(n), "--seed", str(seed)
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"child {mode} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    if "not_available" in answer:
        raise c.NotAvailable(answer["not_available"])
    return answer


def body(args: Any) -> None:
    n = 100_000 if args.quick else 1_000_000
    c.line("pending impressions", f"{n:,} x 20 items (the target is stated at 1M)")
    rows: dict[str, dict[str, Any]] = {}
    for mode, label in (
        ("raw", "baseline: raw JSON bytes held in a list"),
        ("parsed", "baseline: json.loads dicts held in a list"),
    ):
        rows[mode] = run_child(mode, n, args.seed)
        grow = rows[mode]["after"] - rows[mode]["before"]
        c.line(label, f"{grow / 1e6:8.1f} MB  {grow / n:7.0f} B/impression")
    try:
        rows["engine"] = run_child("engine", n, args.seed)
    except c.NotAvailable as exc:
        c.line("evald Engine pending store", f"NOT AVAILABLE: {exc}")
        return
    eng = rows["engine"]
    grow = eng["after"] - eng["before"]
    per = grow / n
    c.line("evald Engine pending store", f"{grow / 1e6:8.1f} MB  {per:7.0f} B/impression")
    c.line("check: engine.pending()", f"{eng['pending']:,} of {n:,}")
    c.line("feeding rate (impressions only, incl. generation)", c.fmt_rate(n / eng["seconds"]))
    parsed = (rows["parsed"]["after"] - rows["parsed"]["before"]) / n
    raw = (rows["raw"]["after"] - rows["raw"]["before"]) / n
    c.line("evald / parsed JSON", f"{per / parsed:.3f}x")
    c.line("evald / raw bytes", f"{per / raw:.3f}x")
    c.target(
        "bytes of RSS per pending impression",
        f"{per:.0f} B",
        per <= TARGET_BYTES,
        f"<= {TARGET_BYTES} B",
    )
    for mode, label in (
        ("engine-offsets", "  the same fed as evald run does (batches, kind, offsets)"),
        ("engine-users", f"  the same with user ids ({n // USER_LISTS:,} users x {USER_LISTS})"),
    ):
        answer = run_child(mode, n, args.seed)
        grow = answer["after"] - answer["before"]
        c.target(label, f"{grow / n:.0f} B", grow / n <= TARGET_BYTES, f"<= {TARGET_BYTES} B")


def main(argv: Sequence[str] | None = None) -> int:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--child",
            choices=("engine", "engine-offsets", "engine-users", "parsed", "raw"),
            help=argparse.SUPPRESS,
        )
        p.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)

    args = c.parse_args(__doc__ or "", argv, extra)
    if args.child:
        try:
            if args.child.startswith("engine"):
                answer = child_engine(
                    args.n,
                    args.seed,
                    daemon_path=args.child in ("engine-offsets", "engine-users"),
                    users=args.n // USER_LISTS if args.child == "engine-users" else 0,
                )
            else:
                answer = child_parsed(args.n, args.seed, raw_only=args.child == "raw")
        except c.NotAvailable as exc:
            answer = {"not_available": str(exc)}
        print(json.dumps(answer))
        return 0
    return c.run_main("Memory per pending impression (RSS)", lambda: body(args))


if __name__ == "__main__":
    sys.exit(main())
