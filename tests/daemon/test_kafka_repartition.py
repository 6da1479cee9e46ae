"""`evald run` with ``input.repartition`` on Apache Kafka: input topics keyed by a client id,
of different partition counts (3 and 2), re-keyed by request id through the internal topics.

Oracle: the results topic read ``read_committed``, with no deduplication, holds each request
exactly once, equal to `evald replay` of the same records; each internal topic holds each
source record exactly once (value, headers, timestamp), in the partition Kafka's default
partitioner gives its request id. The kill -9 test crashes the process at each step of the
repartition cycle and of the main stage's, then at a random moment, restarting the same
instance id each time: still the uninterrupted results. Negative control: without
repartitioning these topics are refused (not co-partitioned), so the stage is what makes the
runs work.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from child_processes import die_with_parent
from kafka_harness import ENGINE, Broker, CommittedReader, KafkaTools, served_port, wait_until

from evald.config import EngineConfig
from evald.daemon.crash import CRASH_ENV
from evald.daemon.names import internal_topic
from evald.daemon.repartition.rekey import partition_for

pytestmark = pytest.mark.kafka

#: the impressions topic's partition count, which the internal topics get by default
INTERNAL_PARTITIONS = 3
#: a member killed while joining holds a rebalance up to max_poll_interval_ms: keep it short
KAFKA = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "transaction_timeout_ms": 10000,
    "max_poll_interval_ms": 15000,
}
#: records whose request id cannot be read, with the reason the stage gives each
UNKEYABLE = [
    (b"not json", "invalid_json"),
    (b"[1, 2]", "not_an_object"),
    (b'{"ts": 1, "items": ["a"]}', "missing_field"),
    (b'{"request_id": 7, "ts": 1}', "wrong_type"),
]


def topics_of(unique: str) -> dict[str, str]:
    return {
        "impressions": f"imp-{unique}",
        "feedback": f"fb-{unique}",
        "results": f"res-{unique}",
        "dlq": f"dlq-{unique}",
        "group": f"g-{unique}",
    }


def produce_keyed_by_client(tools: KafkaTools, topics: dict[str, str], events: int) -> list[Any]:
    """Simulated traffic keyed by the user (impressions) or the item (feedback), partitioned
    by the producer's default partitioner, plus the unkeyable records; the events in order.

    The traffic ends with two blocks of impressions 30 minutes later on each internal partition
    (request ids ``end-*``; a time moves the watermark once a whole block of
    ``watermark_quorum`` events has reached it), so the daemon finalizes everything before
    them, as replay does at its end."""
    from itertools import islice

    from kafka import KafkaProducer

    from evald.demo.simulator import IMPRESSION, Faults, SimEvent, Simulator

    sim = Simulator(11, rate=200.0, speed=60, faults=Faults.none())
    produced = list(islice(sim.events(), events))
    end = produced[-1].at_ms + 1_800_000
    quorum = EngineConfig.model_fields["watermark_quorum"].default
    for p in range(INTERNAL_PARTITIONS):
        rids = [
            f"end-{n}"
            for n in range(100 * quorum)
            if partition_for(f"end-{n}".encode(), INTERNAL_PARTITIONS) == p
        ]
        for rid in rids[: 2 * quorum]:
            value = json.dumps({"request_id": rid, "ts": end, "items": ["i0"], "user_id": "u"})
            produced.append(SimEvent(end, IMPRESSION, value.encode(), rid.encode()))
    producer = KafkaProducer(bootstrap_servers=tools.bootstrap, linger_ms=10)
    try:
        for n, event in enumerate(produced):
            doc = json.loads(event.value)
            kind = event.kind == IMPRESSION
            key = str(doc.get("user_id") if kind else doc.get("item")).encode()
            assert key != event.key
            topic = topics["impressions"] if kind else topics["feedback"]
            headers = [("origin", f"sim-{n}".encode())]
            producer.send(
                topic, key=key, value=event.value, headers=headers, timestamp_ms=event.at_ms
            )
        for n, (raw, _) in enumerate(UNKEYABLE):
            topic = topics["impressions"] if n % 2 else topics["feedback"]
            producer.send(topic, key=b"client", value=raw, timestamp_ms=end)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)
    return produced


def replay_results(events: list[Any], tmp_path: Path) -> dict[str, dict[str, Any]]:
    """`evald replay` of the same records, in their order: request id -> result."""
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"".join(event.value + b"\n" for event in events))
    config = tmp_path / "engine.json"
    config.write_text(json.dumps(ENGINE))
    out = tmp_path / "replay-results.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "evald", "replay", str(source), "--config", str(config),
         "--results", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    by_id = {doc["request_id"]: doc for doc in results}
    assert len(by_id) == len(results)
    return {rid: doc for rid, doc in by_id.items() if not rid.startswith("end-")}


class Evald:
    """`python -m evald run --set input.repartition=true` as a child process."""

    def __init__(
        self, broker: Broker, unique: str, tmp_path: Path, crash_at: str | None = None
    ) -> None:
        topics = topics_of(unique)
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("EVALD_")}
        env.pop(CRASH_ENV, None)
        if crash_at is not None:
            env[CRASH_ENV] = crash_at
        argv = [
            sys.executable, "-m", "evald", "run", "--bootstrap-servers", broker.bootstrap,
            "--impressions-topic", topics["impressions"], "--feedback-topic", topics["feedback"],
            "--results-topic", topics["results"], "--dlq-topic", topics["dlq"],
            "--group-id", topics["group"], "--instance-id", "a",
            "--metrics-address", "127.0.0.1:0",
            "--set", "input.repartition=true",
            "--set", "daemon.commit_interval_ms=300",
            "--set", "daemon.retry_backoff_max_ms=1000",
        ]  # fmt: skip
        for key, number in KAFKA.items():
            argv += ["--set", f"kafka.{key}={number}"]
        for key, value in ENGINE.items():
            argv += ["--set", f"engine.{key}={json.dumps(value)}"]
        self.log_path = tmp_path / "run.log"
        self._port: int | None = None  # bound by the child, read from its log
        with self.log_path.open("ab") as log:
            log.write(f"--- start (crash at {crash_at})\n".encode())
            self._log_start = log.tell()
            log.flush()
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=log, preexec_fn=die_with_parent
            )

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a family's samples with these labels on /metrics (0 when absent)."""
        if self._port is None:
            self._port = served_port(self.log_path, self._log_start)
        port = self._port
        if port is None:
            return 0.0
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as response:
                text = response.read().decode()
        except (urllib.error.URLError, OSError):
            return 0.0
        total = 0.0
        for line in text.splitlines():
            mine = all(f'{key}="{value}"' in line for key, value in labels.items())
            if line.startswith(name) and line[len(name)] in " {" and mine:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def results_once(tools: KafkaTools, topic: str) -> dict[str, dict[str, Any]]:
    """The results topic as a downstream read_committed reader sees it: each request once."""
    docs = [json.loads(record.value) for record in tools.read(topic, committed=True)]
    counts = Counter(doc["request_id"] for doc in docs)
    twice = [request_id for request_id, n in counts.items() if n > 1]
    assert not twice, f"{len(twice)} results written twice, e.g. {twice[:3]}"
    return {doc["request_id"]: doc for doc in docs}


class InternalReaders:
    """read_committed readers of both internal topics on threads, started before anything is
    committed there: they see every copy before the stage's purge deletes it."""

    def __init__(self, tools: KafkaTools, topics: dict[str, str]) -> None:
        self.tools = tools
        self.readers = {
            name: CommittedReader(tools.bootstrap, internal_topic(topics["group"], name))
            for name in (topics["impressions"], topics["feedback"])
        }

    def assert_exact(self, partitions: int) -> None:
        """Each source record with a request id was copied exactly once, unchanged, to the
        partition of its request id."""
        keep = {value for value, _ in UNKEYABLE}

        def shape(record: Any) -> tuple[bytes, int, tuple[Any, ...]]:
            return record.value, record.timestamp, tuple(record.headers)

        for name, reader in self.readers.items():
            copies = reader.stop()
            for record in copies:
                assert record.partition == partition_for(record.key, partitions)
                assert json.loads(record.value)["request_id"].encode() == record.key
            source = self.tools.read(name, committed=True)
            expected = Counter(shape(r) for r in source if r.value not in keep)
            assert Counter(shape(r) for r in copies) == expected


def purged(tools: KafkaTools, topic: str) -> bool:
    """Some records of ``topic`` were deleted (its log start offset moved)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=tools.bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return any(offset > 0 for offset in consumer.beginning_offsets(tps).values())
    finally:
        consumer.close()


def internal_topics_exist(tools: KafkaTools, topics: dict[str, str]) -> bool:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=tools.bootstrap)
    try:
        names = consumer.topics()
    finally:
        consumer.close()
    wanted = [internal_topic(topics["group"], topics[kind]) for kind in ("impressions", "feedback")]
    return all(name in names for name in wanted)


def test_run_repartitions_topics_keyed_by_client_into_the_replay_results(
    broker: Broker, kafka_tools: KafkaTools, unique: str, tmp_path: Path
) -> None:
    topics = topics_of(unique)
    kafka_tools.create({topics["impressions"]: 3, topics["feedback"]: 2})
    events = produce_keyed_by_client(kafka_tools, topics, 3000)
    expected = replay_results(events, tmp_path)
    assert len(expected) > 100, "the reference finalized too little: the data is too short"
    run = Evald(broker, unique, tmp_path)
    wait_until(lambda: internal_topics_exist(kafka_tools, topics), 60, "the internal topics")
    readers = InternalReaders(kafka_tools, topics)  # the stage holds its first records 2 s
    try:
        wait_until(
            lambda: run.metric("evald_results_produced_total") >= len(expected) or None,
            120,
            "the daemon's results",
        )
        copied = run.metric("evald_repartitioned_records_total")
        rejected = {
            reason: run.metric("evald_repartition_rejected_records_total", reason=reason)
            for _, reason in UNKEYABLE
        }
    finally:
        status = run.stop()
    assert status == 0, run.log()
    got = results_once(kafka_tools, topics["results"])
    assert got == expected
    assert copied == len(events)
    assert rejected == dict.fromkeys(rejected, 1.0)
    letters = kafka_tools.read(topics["dlq"], committed=True)
    assert sorted((dict(r.headers)["evald-reason"].decode(), r.value) for r in letters) == sorted(
        (reason, value) for value, reason in UNKEYABLE
    )
    # the internal topics took the impressions topic's partition count
    readers.assert_exact(INTERNAL_PARTITIONS)


def crash_then_finish(
    broker: Broker,
    tools: KafkaTools,
    unique: str,
    tmp_path: Path,
    steps: list[str],
    random_kill: bool = False,
) -> None:
    """Kill -9 the process at each of ``steps`` in turn (then, with ``random_kill``, at a
    seeded random moment after the first results), restarting the same instance id each time;
    then let one run finish. Oracle: results read_committed without deduplication equal to
    `evald replay`, each source record copied exactly once; after the random kill, the
    internal topics purged of what the main stage had committed."""
    topics = topics_of(unique)
    tools.create({topics["impressions"]: 3, topics["feedback"]: 2})
    events = produce_keyed_by_client(tools, topics, 3000)
    expected = replay_results(events, tmp_path)
    readers: InternalReaders | None = None
    for step in steps:
        victim = Evald(broker, unique, tmp_path, crash_at=step)
        if readers is None:  # before the purge can delete anything
            wait_until(lambda: internal_topics_exist(tools, topics), 60, "the internal topics")
            readers = InternalReaders(tools, topics)
        wait_until(lambda v=victim: v.proc.poll() is not None, 120, f"the crash at {step}")
        assert victim.proc.returncode == -signal.SIGKILL, victim.log()
    assert readers is not None
    if random_kill:
        run = Evald(broker, unique, tmp_path)
        wait_until(lambda: run.metric("evald_results_produced_total") > 0 or None, 120, "results")
        time.sleep(random.Random(13).uniform(0.0, 1.5))
        run.proc.kill()
        run.proc.wait(timeout=10)
    run = Evald(broker, unique, tmp_path)
    try:
        wait_until(lambda: len(results_once(tools, topics["results"])) >= len(expected)
                   or None, 180, "every result")  # fmt: skip
        if random_kill:
            # what the main stage committed before the kill is deleted from the internal topics
            # (the stage purges as its session starts, then every 30 s)
            internal = internal_topic(topics["group"], topics["impressions"])
            wait_until(lambda: purged(tools, internal), 60, "the purge of the internal topic")
    finally:
        status = run.stop()
    assert status == 0, run.log()
    assert results_once(tools, topics["results"]) == expected
    readers.assert_exact(INTERNAL_PARTITIONS)


@pytest.mark.chaos  # 30 s: the chaos tier, so that `make test` stays well under 15 minutes
def test_kill_9_at_each_step_of_the_repartition_cycle_is_exact(
    broker: Broker, kafka_tools: KafkaTools, unique: str, tmp_path: Path
) -> None:
    """After the sends, after the offsets, after the commit (steps 4-6 of the cycle)."""
    steps = ["repartition_sent", "repartition_offsets_sent", "repartition_committed"]
    crash_then_finish(broker, kafka_tools, unique, tmp_path, steps)


@pytest.mark.chaos  # ~30 s: the per-step kills above keep the stage's kill -9 in `make test`
def test_kill_9_in_the_main_stage_and_at_random_with_both_stages_running_is_exact(
    broker: Broker, kafka_tools: KafkaTools, unique: str, tmp_path: Path
) -> None:
    """The main stage's crash points, reading the internal topics; then a random moment."""
    steps = ["results_sent", "offsets_sent"]
    crash_then_finish(broker, kafka_tools, unique, tmp_path, steps, random_kill=True)


def test_without_repartitioning_the_topics_are_refused(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """The negative control of the tests above: the same topics without the stage."""
    topics = topics_of(unique)
    kafka_tools.create({topics["impressions"]: 3, topics["feedback"]: 2})
    done = subprocess.run(
        [sys.executable, "-m", "evald", "run", "--bootstrap-servers", broker.bootstrap,
         "--impressions-topic", topics["impressions"], "--feedback-topic", topics["feedback"],
         "--results-topic", topics["results"], "--dlq-topic", topics["dlq"],
         "--group-id", f"g-{unique}", "--metrics-address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.upper().startswith("EVALD_")},
    )  # fmt: skip
    assert done.returncode == 2
    assert "not co-partitioned" in done.stderr


def test_internal_topics_of_another_partition_count_are_refused(
    broker: Broker, kafka_tools: KafkaTools, unique: str, tmp_path: Path
) -> None:
    topics = topics_of(unique)
    kafka_tools.create(
        {
            topics["impressions"]: 3,
            topics["feedback"]: 2,
            internal_topic(topics["group"], topics["impressions"]): 3,
            internal_topic(topics["group"], topics["feedback"]): 2,
        }
    )
    run = Evald(broker, unique, tmp_path)
    try:
        status = run.proc.wait(timeout=60)
    finally:
        run.stop()
    assert status == 2
    assert "internal topics must both have 3 partitions" in run.log()
