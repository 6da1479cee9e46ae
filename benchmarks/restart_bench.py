"""Restart cost: what `evald run` reads, and how long until /readyz, when it restores a partition.

Apache Kafka 4.3.1 (deploy/local_kafka, a fresh data directory) holds one results partition of
N committed results, written with the daemon's own result encoder. For each N two committed
checkpoints are prepared, each for its own consumer group and checkpoint topic:

* **ranges**: what evald wrote before snapshots (and still restores): every result of the
  current ownership epoch, ``[0, N)``, to be re-read and absorbed;
* **snapshot**: the window aggregates of the first N - K results as a snapshot record (built
  by ``Engine.snapshot`` from the same results) plus the range of the last K results.

Then `evald run` starts on each and restores the partition: figures are spawn -> /readyz 200
(process start included) and the records/bytes the restore read (its log line). The two
restores of one N must give the same /metrics window series (checked: the same series, values
equal to 1e-9 relative, as summing in another order leaves the last digits to chance).
A third case has 1M impressions pending: the checkpoint's committed offset is 0 and its
consumed offset 1M, so the restart replays them (the pending joins; bounded by window +
lateness by construction of the committed offset). Ratios are against the 50k snapshot case.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import _common as c
from benchmarks.kafka_bench import evald_cmd, tail

TAIL = 1_000  # results written after the snapshot (a snapshot is due every 2,000 or more)
RESULT_RATE = 400.0  # results/s of event time on the partition (issue 12's per-partition rate)
START_MS = 1_763_683_200_000
RESTORED = re.compile(
    r"restored: .* snapshot of (\w+) bytes, (\d+) results absorbed, (\d+) records "
    r"\((\d+) bytes\) read in ([0-9.]+)s"
)


@contextmanager
def apache_kafka() -> Iterator[str]:
    """A fresh single-node Apache Kafka on loopback; yields its bootstrap address."""
    try:
        from deploy.local_kafka import LocalKafka, LocalKafkaError
    except ImportError as exc:
        raise c.NotAvailable(f"deploy.local_kafka: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="evald-restart-bench-") as data:
        kafka = LocalKafka(Path(data), settings={"auto.create.topics.enable": "false"})
        try:
            kafka.start()
        except LocalKafkaError as exc:
            raise c.NotAvailable(f"Apache Kafka cannot run: {exc}") from exc
        try:
            yield kafka.bootstrap
        finally:
            kafka.stop()


def producer(bootstrap: str) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=20,
        batch_size=512 * 1024,
        max_request_size=8 * 1024 * 1024,
    )


def write_results(bootstrap: str, topic: str, engine: Any, n: int, seed: int) -> int:
    """n results into partition 0 (the daemon's encoder), their window sums into ``engine``
    for the first n - TAIL (what the snapshot holds). Returns the newest event time."""
    from kafka import TopicPartition

    from evald.daemon.kafka_compat import RecordAppender
    from evald.daemon.main.results import ResultEncoder
    from evald.engine import Result
    from evald.statistics.bootstrap import request_clusters

    rng = np.random.default_rng(seed)
    combos = [
        {"model": m, "arm": a, "surface": s} for m in c.MODELS for a in c.ARMS for s in c.SURFACES
    ]
    seg_of = np.asarray([engine.segments.segment_of(labels) for labels in combos])
    names = engine.measure_names
    encoder = ResultEncoder()
    labels_json = [json.dumps(x, separators=(",", ":")) for x in combos]
    heads = [json.dumps(name) + ":" for name in names]
    out = producer(bootstrap)
    appender, tp = RecordAppender(out), TopicPartition(topic, 0)
    ts_all = START_MS + (np.arange(n) * (1000.0 / RESULT_RATE)).astype(np.int64)
    for first in range(0, n, 100_000):
        last = min(n, first + 100_000)
        ts = ts_all[first:last]
        combo = rng.integers(0, len(combos), last - first)
        values = rng.random((last - first, len(names)))
        rows = zip(ts.tolist(), combo.tolist(), values.tolist(), strict=True)
        for i, (t, k, row) in enumerate(rows):
            rid = f"r{first + i:09d}"
            # the encoder's bytes, several times faster; checked against it below
            measures = ",".join([h + repr(v) for h, v in zip(heads, row, strict=True)])
            value = (
                f'{{"request_id":"{rid}","ts":"{encoder.format_ts(t)}",'
                f'"labels":{labels_json[k]},"measures":{{{measures}}}}}'
            ).encode()
            if i < 100:
                result = Result(rid, t, combos[k], dict(zip(names, row, strict=True)))
                if encoder.encode(result) != (rid.encode(), value):
                    raise RuntimeError("the fast result encoding differs from ResultEncoder")
            appender.send(tp, rid.encode(), value, first_in_transaction=first + i == 0)
        upto = min(last, n - TAIL) - first
        if upto > 0:
            # each result its own bootstrap cluster, as a restore absorbs a result without one
            ids = [f"r{first + i:09d}" for i in range(upto)]
            engine.aggregates.observe(
                0,
                seg_of[combo[:upto]],
                ts[:upto],
                values[:upto],
                histogram=False,
                clusters=request_clusters(ids),
            )
    out.flush(timeout=600)
    out.close(timeout=30)
    return int(ts_all[-1])


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit group offsets from outside (no member is active): what a transaction commits."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tps = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
        consumer.assign(list(tps))
        consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in tps.items()})
    finally:
        consumer.close()


def write_checkpoint(
    bootstrap: str, topics: dict[str, str], ckpt_topic: str, group: str, checkpoint: Any, raw: bytes
) -> None:
    """Snapshot chunks (if ``raw``), then the checkpoint naming them, then the group offsets."""
    import dataclasses
    import zlib

    from evald.daemon.main import snapshots
    from evald.daemon.main.checkpoint import SnapshotRef

    out = producer(bootstrap)
    if raw:
        futures = [
            out.send(ckpt_topic, key=b"0.snapshot", value=chunk, partition=0)
            for chunk in snapshots.chunks(raw)
        ]
        out.flush(timeout=60)
        offsets = tuple(f.get(timeout=30).offset for f in futures)
        ref = SnapshotRef(offsets, len(raw), zlib.crc32(raw), int(time.time() * 1000))
        checkpoint = dataclasses.replace(checkpoint, snapshot=ref)
    at = out.send(ckpt_topic, key=b"0", value=checkpoint.encode(), partition=0).get(timeout=30)
    out.close(timeout=30)
    commit(
        bootstrap,
        group,
        {
            (ckpt_topic, 0): at.offset + 1,
            (topics["impressions"], 0): checkpoint.committed["impression"],
            (topics["feedback"], 0): checkpoint.committed["feedback"],
        },
    )


def restart(
    bootstrap: str,
    topics: dict[str, str],
    group: str,
    ckpt_topic: str,
    env: dict[str, str],
    pending: int = 0,
) -> dict[str, Any]:
    """Start `evald run` on a prepared checkpoint; time to /readyz (and to ``pending`` open
    impressions), what the restore read, the /metrics window series; then SIGTERM."""
    import os

    port = c.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [*evald_cmd(bootstrap, topics, group, port), "--set", f"topics.checkpoints={ckpt_topic}"]
    with tempfile.NamedTemporaryFile(prefix="evald-restart-bench-") as log:
        t0 = time.time()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
        try:
            # /readyz alone can answer 200 during a rebalance that assigned nothing yet
            up = wait(lambda: restored(log) and get(url + "/readyz")[0] == 200, proc, log, "ready")
            ready = up - t0
            full = None
            if pending:
                full = wait(lambda: pending_now(url) >= pending, proc, log, "pending") - t0
            time.sleep(2.0)  # a few loop cycles: the exposition shows the restored windows
            text = get(url + "/metrics")[1]
            series = sorted(line for line in text.splitlines() if line.startswith("evald_window"))
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        finally:
            c.stop_process(proc)
        found = RESTORED.search(Path(log.name).read_text(errors="replace"))
    if found is None:
        raise RuntimeError("no restore log line")
    size, absorbed, records, nbytes, took = found.groups()
    return {
        "ready": ready,
        "full": full,
        "snapshot": size,
        "absorbed": int(absorbed),
        "records": int(records),
        "bytes": int(nbytes),
        "restore_s": float(took),
        "series": series,
    }


def restored(log: Any) -> bool:
    """The restore log line is out (read through another handle: seeking the child's own
    would move where it writes)."""
    return RESTORED.search(Path(log.name).read_text(errors="replace")) is not None


def get(url: str) -> tuple[int, str]:
    try:
        status, body = c.http_get(url, timeout=5)
    except OSError:
        return 0, ""
    return status, body.decode()


def pending_now(url: str) -> float:
    status, body = get(url + "/metrics")
    if status != 200:
        return 0.0
    return c.sum_samples(c.parse_samples(body), "evald_pending_impressions")


def wait(cond: Any, proc: Any, log: Any, what: str, timeout: float = 1800.0) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"evald run exited {proc.returncode} waiting for {what}: {tail(log)}"
            )
        if cond():
            return time.time()
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}: {tail(log)}")


def topics_for(tag: str) -> dict[str, str]:
    return {k: f"rb-{tag}.{k}" for k in ("impressions", "feedback", "results", "dlq")}


def results_case(bootstrap: str, n: int, seed: int, ranges_max: int) -> dict[str, dict[str, Any]]:
    """Both restores of one partition holding n results (the ranges one up to ``ranges_max``:
    it reads every result, minutes at millions)."""
    import dataclasses

    from evald.config import load_config
    from evald.daemon.main.checkpoint import Checkpoint, ResultRange
    from evald.engine import Engine

    tag = f"r{n}"
    topics = topics_for(tag)
    ckpt = {"ranges": f"rb-{tag}.ckpt-ranges", "snapshot": f"rb-{tag}.ckpt-snapshot"}
    c.create_topics(bootstrap, [*topics.values(), *ckpt.values()], 1)
    config = load_config({"window": "30m"})  # the daemon's, as evald_cmd sets it
    engine = Engine(config)
    t0 = time.perf_counter()
    newest = write_results(bootstrap, topics["results"], engine, n, seed)
    c.line(f"{n:,} results written (not timed)", c.fmt_s(time.perf_counter() - t0))
    # a watermark that completes the 5m window holding the newest result (or the first 5m),
    # so /metrics shows window series to compare
    watermark = max(newest + 1, START_MS + 300_000) + config.window
    engine.aggregates.prune(0, watermark - config.window - config.retention)
    base = Checkpoint.of(
        partition=0,
        watermark=watermark,
        committed={"impression": 0, "feedback": 0},
        consumed={"impression": 0, "feedback": 0},
        results=(ResultRange(0, n, newest),),
        epoch_start=0,
    )
    write_checkpoint(bootstrap, topics, ckpt["ranges"], f"rb-{tag}-ranges", base, b"")
    tail_only = dataclasses.replace(
        base, results=(ResultRange(n - TAIL, n, newest),), epoch_start=None
    )
    raw = engine.snapshot(0)
    write_checkpoint(bootstrap, topics, ckpt["snapshot"], f"rb-{tag}-snapshot", tail_only, raw)
    out = {"snapshot": restart(bootstrap, topics, f"rb-{tag}-snapshot", ckpt["snapshot"], {})}
    if n > ranges_max:
        return out
    out["ranges"] = restart(bootstrap, topics, f"rb-{tag}-ranges", ckpt["ranges"], {})
    if not same_series(out["snapshot"]["series"], out["ranges"]["series"]):
        a, b = set(out["snapshot"]["series"]), set(out["ranges"]["series"])
        print("  snapshot only:", sorted(a - b)[:6], "\n  ranges only:", sorted(b - a)[:6])
        raise RuntimeError(f"{n:,} results: the two restores show different window series")
    return out


def same_series(a: list[str], b: list[str], rel: float = 1e-9) -> bool:
    """The same series with the same values: counts digit for digit, sums and intervals to
    ``rel`` (a snapshot's sums were added in another order than one result at a time)."""
    if not a or len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        (name_x, value_x), (name_y, value_y) = x.rsplit(" ", 1), y.rsplit(" ", 1)
        if name_x != name_y or not math.isclose(float(value_x), float(value_y), rel_tol=rel):
            return False
    return True


def pending_case(bootstrap: str, m: int, seed: int) -> dict[str, Any]:
    """A restore replaying m pending impressions (committed 0, consumed m)."""
    from benchmarks.recovery_bench import impressions
    from evald.daemon.main.checkpoint import Checkpoint

    topics = topics_for(f"p{m}")
    ckpt_topic = f"rb-p{m}.ckpt"
    c.create_topics(bootstrap, [*topics.values(), ckpt_topic], 1)
    records = impressions(m, seed)
    replay_bytes = sum(len(k) + len(v) for _, k, v in records)
    out = producer(bootstrap)
    for _, key, value in records:
        out.send(topics["impressions"], key=key, value=value, partition=0)
    out.flush(timeout=600)
    out.close(timeout=30)
    del records
    checkpoint = Checkpoint.of(
        partition=0,
        watermark=None,
        committed={"impression": 0, "feedback": 0},
        consumed={"impression": m, "feedback": 0},
    )
    write_checkpoint(bootstrap, topics, ckpt_topic, f"rb-p{m}", checkpoint, b"")
    env = {"EVALD_ENGINE__WINDOW": "1000h", "EVALD_ENGINE__MAX_PENDING": str(2 * m + 10)}
    found = restart(bootstrap, topics, f"rb-p{m}", ckpt_topic, env, pending=m)
    found["replay_bytes"] = replay_bytes
    return found


def report(label: str, got: dict[str, Any], base: dict[str, Any]) -> None:
    read = got["bytes"] + got.get("replay_bytes", 0)
    base_read = base["bytes"]
    c.line(
        label,
        f"ready {c.fmt_s(got['ready'])} ({got['ready'] / base['ready']:.2f}x), "
        f"restore {c.fmt_s(got['restore_s'])}, {got['records']:,} records, "
        f"{read:,} bytes ({read / base_read:.1f}x)",
    )


def body(args: Any) -> None:
    c.require("evald.daemon.main.snapshots", "due")
    sizes = [50_000, 500_000] if args.quick else [50_000, 500_000, 5_000_000]
    if args.results:
        sizes = [50_000, *args.results]
    ranges_max = args.ranges_max or (500_000 if not args.quick else 50_000)
    m = args.pending or (50_000 if args.quick else 1_000_000)
    with apache_kafka() as bootstrap:
        found = {n: results_case(bootstrap, n, args.seed, ranges_max) for n in sizes}
        pend = pending_case(bootstrap, m, args.seed)
    base = found[sizes[0]]["snapshot"]
    c.line("baseline", f"restore after {sizes[0]:,} results from the snapshot")
    measured = max(n for n in sizes if "ranges" in found[n])
    per_result = found[measured]["ranges"]["restore_s"] / measured
    for n in sizes:
        for kind in ("snapshot", "ranges"):
            if kind in found[n]:
                report(f"{n:,} results, {kind}", found[n][kind], base)
        if "ranges" in found[n]:
            c.line(f"{n:,} results: window series of both restores", "equal (1e-9)")
        else:
            c.line(
                f"{n:,} results, ranges (not run: projected)",
                f"restore ~{c.fmt_s(per_result * n)}, {n + 1:,} records (linear from {measured:,})",
            )
    report(f"{m:,} pending impressions (replayed)", pend, base)
    c.line(
        f"  {m:,} pending: spawn -> all pending again",
        f"{c.fmt_s(pend['full'])}, {pend['replay_bytes']:,} input bytes replayed",
    )
    figures = {
        f"{n}-{kind}": {k: v for k, v in got.items() if k != "series"}
        for n in sizes
        for kind, got in found[n].items()
    }
    figures["pending"] = {k: v for k, v in pend.items() if k != "series"}
    print("  figures:", json.dumps(figures), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    def extra(p: Any) -> None:
        p.add_argument("--results", type=int, nargs="*", default=[], help="result counts")
        p.add_argument("--pending", type=int, default=0, help="pending impressions (1M)")
        p.add_argument(
            "--ranges-max", type=int, default=0, help="largest count restored through ranges"
        )

    args = c.parse_args(__doc__ or "", argv, extra)
    return c.run_main("Restart cost: snapshot + later results vs every result", lambda: body(args))


if __name__ == "__main__":
    sys.exit(main())
