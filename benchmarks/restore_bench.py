"""Restoring many partitions at once: spawn -> /readyz of `evald run` taking over 64 partitions
that have committed checkpoints, this checkout against another (``--baseline-path DIR``, e.g.
``git worktree add DIR <commit>``) in the same run.

Apache Kafka 4.3.1 (deploy/local_kafka, a fresh data directory). Generated traffic keyed by
request id into 64 partitions of both inputs; a first `evald run` of this checkout consumes it
(1 min window, so results are written and every checkpoint names a range of them), commits and
stops. Every measured run then gets a consumer group of its own holding the first group's
committed offsets (committed from outside), so each restores exactly the same checkpoints:

* **ready**: spawn -> /readyz 200 with every partition restored (process start and group join
  included);
* **restore**: from the log line of the 64 partitions' assignment to the last partition's
  ``restored`` line (the log's millisecond times).

Trees alternate within each round (baseline first); figures are medians over ``--rounds``;
ratios are baseline / this checkout.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import _common as c
from benchmarks.kafka_bench import evald_cmd, run_evald, tail, tree_env

PARTITIONS = 64
#: the first run's engine: results within seconds (as the Kafka tests' settings)
ENGINE_ENV = {
    "EVALD_ENGINE__WINDOW": "1m",
    "EVALD_ENGINE__LATENESS": "10s",
    "EVALD_ENGINE__WINDOWS": '["5m"]',
    "EVALD_ENGINE__RETENTION": "2h",
}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ")
ASSIGNED = re.compile(r"partitions \[([\d, ]+)\] assigned")
RESTORED = re.compile(r"partition (\d+) restored: ")


def prepare(bootstrap: str, impressions: int, seed: int) -> tuple[dict[str, str], dict[Any, int]]:
    """Topics holding the traffic and the committed offsets of a group that consumed it."""
    from kafka import KafkaAdminClient

    topics = {k: f"rs.{k}" for k in ("impressions", "feedback", "results", "dlq")}
    c.create_topics(bootstrap, list(topics.values()), PARTITIONS)
    traffic = c.generate_traffic(impressions, seed=seed)
    records = [
        (topics[f"{kind}s" if kind == "impression" else kind], c.request_key(raw), raw)
        for raw, kind in zip(traffic.lines, traffic.kinds, strict=True)
    ]
    c.produce(bootstrap, records)
    c.line(
        f"traffic: {traffic.events:,} events over {PARTITIONS} partitions",
        f"{traffic.impressions:,} impressions",
    )
    t0 = time.perf_counter()
    run_evald(bootstrap, topics, traffic.events, "rs-first", ENGINE_ENV, 900.0)
    c.line("first run: consumed, committed, stopped (not timed)", c.fmt_s(time.perf_counter() - t0))
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({"rs-first": None})["rs-first"]
    finally:
        admin.close()
    ckpt = f"{topics['results']}.checkpoints"
    restorable = {tp.partition for tp in offsets if tp.topic == ckpt}
    if len(restorable) != PARTITIONS:
        raise RuntimeError(f"checkpoints committed for {len(restorable)} of {PARTITIONS}")
    return topics, {tp: meta.offset for tp, meta in offsets.items()}


def commit(bootstrap: str, group: str, offsets: dict[Any, int]) -> None:
    """Commit ``offsets`` for ``group`` from outside (no member is active)."""
    from kafka import KafkaConsumer
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        consumer.assign(list(offsets))
        consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
    finally:
        consumer.close()


def restart(
    bootstrap: str, topics: dict[str, str], group: str, tree: str | None
) -> dict[str, float]:
    """`evald run` of ``tree`` (None: this checkout) restoring the group's 64 partitions."""
    port = c.free_port()
    cmd = evald_cmd(bootstrap, topics, group, port)
    cmd += ["--set", f"topics.checkpoints={topics['results']}.checkpoints"]
    env = {**os.environ, **ENGINE_ENV, **(tree_env(tree) if tree else {})}
    with tempfile.NamedTemporaryFile(prefix="evald-restore-bench-") as log:
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tree)
        try:
            deadline = t0 + 600
            while time.time() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"evald run exited {proc.returncode}: {tail(log)}")
                text = Path(log.name).read_text(errors="replace")
                if len(set(RESTORED.findall(text))) == PARTITIONS and ready(port):
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"not ready in 600 s: {tail(log)}")
            ready_s = time.time() - t0
        finally:
            c.stop_process(proc, timeout=60)
        text = Path(log.name).read_text(errors="replace")
    return {"ready": ready_s, "restore": restore_span(text)}


def ready(port: int) -> bool:
    try:
        status, _ = c.http_get(f"http://127.0.0.1:{port}/readyz", timeout=2)
    except OSError:
        return False
    return status == 200


def restore_span(text: str) -> float:
    """Seconds from the log line assigning all partitions to the last ``restored`` line."""
    assigned = restored = None
    for row in text.splitlines():
        stamp = STAMP.match(row)
        if stamp is None:
            continue
        at = datetime.fromisoformat(stamp.group(1)).timestamp()
        found = ASSIGNED.search(row)
        if found and len(found.group(1).split(",")) == PARTITIONS:
            assigned, restored = at, None
        elif RESTORED.search(row) and assigned is not None:
            restored = at
    if assigned is None or restored is None:
        raise RuntimeError("no assignment of every partition followed by their restores")
    return restored - assigned


def body(args: Any) -> None:
    c.require("evald.daemon.main.restore", "Restorer")
    impressions = args.impressions or (8_000 if args.quick else 32_000)
    trees: dict[str, str | None] = {}
    for i, path in enumerate(args.baseline_path):
        name = "baseline" if len(args.baseline_path) == 1 else f"baseline{i + 1}"
        trees[name] = os.path.abspath(path)
    trees["current"] = None
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with c.broker() as bootstrap:
        topics, offsets = prepare(bootstrap, impressions, args.seed)
        for round_no in range(args.rounds):
            for name, tree in trees.items():
                group = f"rs-{name}-{round_no}"
                commit(bootstrap, group, offsets)
                got = restart(bootstrap, topics, group, tree)
                runs[name].append(got)
                c.line(
                    f"  round {round_no + 1}: {name}",
                    f"ready {c.fmt_s(got['ready'])}, restore {c.fmt_s(got['restore'])}"
                    f"  (load {os.getloadavg()[0]:.1f})",
                )
    medians = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("ready", "restore")}
        for name, rs in runs.items()
    }
    cur = medians["current"]
    for name, tree in trees.items():
        got = medians[name]
        c.line(
            f"{name} ({tree or 'this checkout'}), median of {args.rounds}",
            f"ready {c.fmt_s(got['ready'])}, restore of {PARTITIONS} partitions "
            f"{c.fmt_s(got['restore'])}",
        )
        if name != "current":
            c.line(
                f"  {name} / current",
                f"ready {got['ready'] / cur['ready']:.2f}x, "
                f"restore {got['restore'] / cur['restore']:.1f}x",
            )


def main(argv: Sequence[str] | None = None) -> int:
    def extra(p: Any) -> None:
        p.add_argument(
            "--baseline-path",
            action="append",
            default=[],
            help="another checkout of evald to measure in the same run (repeatable)",
        )
        p.add_argument("--rounds", type=int, default=3, help="restarts per tree")
        p.add_argument("--impressions", type=int, default=0, help="impressions generated")

    args = c.parse_args(__doc__ or "", argv, extra)
    return c.run_main(
        f"Restore of {PARTITIONS} partitions: spawn -> ready, against a baseline tree",
        lambda: body(args),
    )


if __name__ == "__main__":
    sys.exit(main())
