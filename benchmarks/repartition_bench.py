"""The repartition stage (``input.repartition``) against a bare consume -> produce copy.

An Apache Kafka broker (deploy/local_kafka, Java needed) runs on loopback. Seeded simulator
traffic is produced once into an impressions topic of 3 partitions and a feedback topic of 2,
keyed by the user (impressions) or the item (feedback), not by request id. Then, in this process
and each in its own consumer group, reading the same records:

* baseline: a kafka-python consumer polling both topics and a plain (not transactional)
  producer writing each record unchanged to a third topic, keyed as read; it parses nothing;
* stage: :class:`evald.daemon.repartition.stage.Repartitioner`, which reads each record's request id
  (one JSON parse), orders the records by timestamp across the source partitions and writes
  them to the internal topics in one transaction per poll, committing the source offsets in it.

Both are timed over the drain, from the first record copied (baseline: sent; stage: committed)
to the last, and by process CPU over the same span. The stage's figure includes its 2 s hold
at the end of the input (the last records wait for sources that are caught up), which is a
latency, not a rate: the larger the run, the less it weighs.
"""

from __future__ import annotations

import json
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import Any

from benchmarks import _common as c

PARTITIONS = {"impressions": 3, "feedback": 2}


def produce_keyed_by_client(bootstrap: str, topics: dict[str, str], events: int, seed: int) -> int:
    from kafka import KafkaProducer

    from evald.demo.simulator import IMPRESSION, Faults, Simulator

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024)
    written = 0
    try:
        sim = Simulator(seed % 2**31, rate=200.0, speed=60, faults=Faults.none())
        for event in islice(sim.events(), events):
            doc = json.loads(event.value)
            impression = event.kind == IMPRESSION
            key = str(doc.get("user_id") if impression else doc.get("item")).encode()
            topic = topics["impressions"] if impression else topics["feedback"]
            producer.send(topic, key=key, value=event.value, timestamp_ms=event.at_ms)
            written += 1
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=10)
    return written


def baseline(bootstrap: str, topics: dict[str, str], total: int) -> tuple[float, float]:
    """Seconds and CPU seconds of the bare copy's drain."""
    from kafka import KafkaConsumer, KafkaProducer

    consumer = KafkaConsumer(
        topics["impressions"],
        topics["feedback"],
        bootstrap_servers=bootstrap,
        group_id=f"{topics['copy']}-baseline",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=2000,
    )
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024)
    copied, started, cpu = 0, 0.0, 0.0
    try:
        while copied < total:
            for records in consumer.poll(timeout_ms=200).values():
                if not copied:
                    started, cpu = time.perf_counter(), time.process_time()
                for record in records:
                    producer.send(
                        topics["copy"],
                        key=record.key,
                        value=record.value,
                        timestamp_ms=record.timestamp,
                    )
                copied += len(records)
        producer.flush(timeout=120)
        return time.perf_counter() - started, time.process_time() - cpu
    finally:
        consumer.close()
        producer.close(timeout=10)


def stage(bootstrap: str, topics: dict[str, str], total: int) -> tuple[float, float]:
    """Seconds and CPU seconds of the repartition stage's drain."""
    from evald.daemon.repartition.stage import Repartitioner
    from evald.daemon.settings import load_settings

    settings = load_settings(
        environ={},
        flags={
            "kafka": {"bootstrap_servers": bootstrap},
            "topics": {
                "impressions": topics["impressions"],
                "feedback": topics["feedback"],
                "results": f"{topics['copy']}-results",
                "dlq": f"{topics['copy']}-dlq",
            },
            "daemon": {"group_id": f"{topics['copy']}-stage"},
            "input": {"repartition": True},
        },
    )
    runner = Repartitioner(settings)
    runner.start()
    started, cpu = 0.0, 0.0
    try:
        while True:
            copied = sum(runner.stats.repartitioned.values())
            if copied and not started:
                started, cpu = time.perf_counter(), time.process_time()
            if copied >= total:
                return time.perf_counter() - started, time.process_time() - cpu
            if runner.status is not None:
                raise RuntimeError("the repartition stage stopped with a fatal error")
            time.sleep(0.005)
    finally:
        runner.stop(30)


def body(args: Any) -> None:
    lk: Any = c.require("deploy.local_kafka", "LocalKafka")
    c.require("evald.daemon.repartition.stage", "Repartitioner")
    events = 20_000 if args.quick else 200_000
    with tempfile.TemporaryDirectory(prefix="evald-bench-kafka-") as data:
        kafka = lk.LocalKafka(Path(data))
        try:
            kafka.start()
        except lk.LocalKafkaError as exc:
            raise c.NotAvailable(f"Apache Kafka cannot start: {exc}") from exc
        try:
            bootstrap = kafka.bootstrap
            run = f"bench-{time.monotonic_ns() % 10**9:x}"
            topics = {"impressions": f"{run}-imp", "feedback": f"{run}-fb", "copy": f"{run}-copy"}
            from kafka.admin import KafkaAdminClient, NewTopic

            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                admin.create_topics(
                    [NewTopic(topics[k], n, 1) for k, n in PARTITIONS.items()]
                    + [NewTopic(topics["copy"], PARTITIONS["impressions"], 1)]
                )
            finally:
                admin.close()
            total = produce_keyed_by_client(bootstrap, topics, events, args.seed)
            base_s, base_cpu = baseline(bootstrap, topics, total)
            stage_s, stage_cpu = stage(bootstrap, topics, total)
        finally:
            kafka.stop()
    c.line("records (3 + 2 partitions, keyed by client)", f"{total:,}")
    c.line("baseline: consume -> produce, no parse, no txn", c.fmt_rate(total / base_s))
    c.line("stage: request id, timestamp order, txn per poll", c.fmt_rate(total / stage_s))
    c.line("stage rate / baseline rate", f"{base_s / stage_s:.2f}x")
    c.line("CPU per record: baseline", c.fmt_s(base_cpu / total))
    c.line("CPU per record: stage", c.fmt_s(stage_cpu / total))
    c.line("stage CPU / baseline CPU", f"{stage_cpu / base_cpu:.2f}x")


def main(argv: list[str] | None = None) -> int:
    args = c.parse_args(__doc__.splitlines()[0], argv)
    return c.run_main("repartition stage (input.repartition) vs a bare copy", lambda: body(args))


if __name__ == "__main__":
    raise SystemExit(main())
