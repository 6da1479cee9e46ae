"""`evald run` restoring from saved state that is gone, damaged or not believable, on Apache
Kafka: each case exits 2 with what happened and what to do, and writes nothing (it used to
replay the inputs from the beginning, retry forever, or restore a year-9999 watermark); a fresh
group still starts from the beginning; many partitions are restored together.

The saved state is prepared as evald leaves it (a checkpoint record before the group's
committed offset on the checkpoint topic, the input offsets committed beside it), then broken
the way the issue found it: the checkpoint topic deleted (Kafka drops the group's offsets on
it), its records deleted by retention, the group's offsets gone, the record corrupted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from child_processes import die_with_parent
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from kafka_harness import Broker, KafkaTools, free_port, wait_until
from kafka_instances import make_settings, names, run_argv, running, settled
from kafka_oracle import assert_exactly_once, results_by_id
from test_kafka import run_to_exit

from evald.daemon.main.checkpoint import Checkpoint

pytestmark = pytest.mark.kafka


def checkpoints_topic(unique: str) -> str:
    return f"{names(unique)['results']}.checkpoints"


def setup_topics(tools: KafkaTools, unique: str, partitions: int = 1) -> None:
    topics = names(unique)
    tools.create(
        {
            topics["impressions"]: partitions,
            topics["feedback"]: partitions,
            topics["results"]: partitions,
            checkpoints_topic(unique): partitions,
        }
    )


def saved(p: int = 0, **fields: object) -> Checkpoint:
    """A checkpoint as evald writes it for a partition it has fed nothing yet."""
    doc: dict[str, object] = {
        "partition": p,
        "watermark": None,
        "committed": {"impression": 0, "feedback": 0},
        "consumed": {"impression": 0, "feedback": 0},
    }
    doc.update(fields)
    return Checkpoint.of(**doc)  # type: ignore[arg-type]


def write_checkpoint(
    bootstrap: str, topic: str, p: int, value: bytes, *, transactional: str | None = None
) -> int:
    """The record at the offset it returns; ``transactional``: written in a committed
    transaction of that id (what evald's transactions leave)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional)
    try:
        if transactional:
            producer.init_transactions()
            producer.begin_transaction()
        at = producer.send(topic, key=str(p).encode(), value=value, partition=p).get(timeout=30)
        if transactional:
            producer.commit_transaction()
        return int(at.offset)
    finally:
        producer.close(timeout=5)


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit the group's offsets from outside (no member is active)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tps = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
        consumer.assign(list(tps))
        consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in tps.items()})
    finally:
        consumer.close()


def save(bootstrap: str, unique: str, checkpoints: dict[int, bytes]) -> dict[int, int]:
    """Each partition's checkpoint record and the group's offsets, as a commit leaves them."""
    topics, topic = names(unique), checkpoints_topic(unique)
    at = {p: write_checkpoint(bootstrap, topic, p, value) for p, value in checkpoints.items()}
    offsets = {(topic, p): o + 1 for p, o in at.items()}
    for p in checkpoints:
        offsets[(topics["impressions"], p)] = offsets[(topics["feedback"], p)] = 0
    commit(bootstrap, f"g-{unique}", offsets)
    return at


def refused(bootstrap: str, unique: str) -> str:
    """`evald run` on the prepared state: exit 2 (a daemon that restores or retries instead is
    killed after 60 s and fails the test); its log, which must say it refused to restore."""
    proc = run_to_exit(run_argv(bootstrap, unique, "127.0.0.1:0"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "evald run: refusing to restore: " in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc.stderr


def nothing_written(tools: KafkaTools, unique: str) -> None:
    assert tools.read(names(unique)["results"]) == []


def admin_of(bootstrap: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap)


# -- the checkpoint topic deleted or expired while evald was stopped (issue 22 item 3) ---------


def test_a_checkpoint_topic_deleted_while_evald_was_stopped_is_refused(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """Kafka drops the group's offsets on a deleted topic and keeps those on the inputs: the
    restart used to read both inputs from the beginning again (2,312 duplicate results)."""
    setup_topics(kafka_tools, unique)
    topics = names(unique)
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=400, seed=31)
    save(broker.bootstrap, unique, {0: saved(consumed={"impression": 3, "feedback": 2}).encode()})
    commit(broker.bootstrap, f"g-{unique}", {(topics["impressions"], 0): 3})
    admin = admin_of(broker.bootstrap)
    try:
        admin.delete_topics([checkpoints_topic(unique)])
        wait_until(lambda: checkpoints_topic(unique) not in admin.list_topics(), 30, "the deletion")
    finally:
        admin.close()
    text = refused(broker.bootstrap, unique)
    assert f"committed offsets on the inputs of partition 0 ({topics['impressions']}:0@3" in text
    assert f"but none on the checkpoint topic {checkpoints_topic(unique)}" in text
    assert "new daemon.group_id" in text
    nothing_written(kafka_tools, unique)


def test_a_checkpoint_expired_while_evald_was_stopped_is_refused(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """Retention (here DeleteRecords, as retention does) removed the committed checkpoint: the
    restore used to retry forever."""
    setup_topics(kafka_tools, unique)
    at = save(broker.bootstrap, unique, {0: saved().encode()})
    admin = admin_of(broker.bootstrap)
    try:
        admin.delete_records({TopicPartition(checkpoints_topic(unique), 0): at[0] + 1})
    finally:
        admin.close()
    text = refused(broker.bootstrap, unique)
    assert f"{checkpoints_topic(unique)}:0@{at[0]} is gone: the partition's log starts at" in text
    assert "retention.ms" in text
    nothing_written(kafka_tools, unique)


def test_a_group_whose_offsets_expired_is_refused(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """The broker deletes an empty group's offsets after offsets.retention.minutes: the group
    looked fresh and the restart read both inputs from the beginning again."""
    setup_topics(kafka_tools, unique)
    topics = names(unique)
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=400, seed=32)
    at = write_checkpoint(
        broker.bootstrap, checkpoints_topic(unique), 0, saved().encode(), transactional=unique
    )
    text = refused(broker.bootstrap, unique)
    assert f"g-{unique} has no committed offset for partition 0" in text
    assert f"committed checkpoints of it (the first at offset {at})" in text
    assert "offsets.retention.minutes" in text
    nothing_written(kafka_tools, unique)


def test_a_first_transaction_that_never_committed_is_still_a_fresh_start(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """The negative control of the one above: an instance killed inside its first transaction
    leaves an aborted checkpoint record and no offset. That is a fresh group: everything is
    read from the beginning, each result once."""
    setup_topics(kafka_tools, unique)
    topics = names(unique)
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=1500, seed=33)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=unique)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        value = saved(consumed={"impression": 500, "feedback": 300}).encode()
        producer.send(checkpoints_topic(unique), key=b"0", value=value, partition=0).get(30)
        producer.abort_transaction()
    finally:
        producer.close(timeout=5)
    settings = make_settings(broker.bootstrap, unique)
    with running(settings) as daemon:
        wait_until(lambda: settled(daemon, kafka_tools, unique), 90, "the daemon to settle")
    expected, _ = kafka_tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(kafka_tools, topics["results"]), expected)


# -- a corrupted or implausible checkpoint (issue 22 item 8) -----------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"\x00\x01 not a checkpoint", "is not a checkpoint ("),
        (saved(watermark=253_402_300_799_000).encode(), "its watermark is 9999-12-31T23:59:59"),
    ],
    ids=["undecodable", "year-9999-watermark"],
)
def test_a_checkpoint_that_cannot_be_right_exits_2_saying_what_to_do(
    value: bytes, says: str, broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """An undecodable record used to be retried forever with tracebacks while /readyz said
    "broker not reachable"; a year-9999 watermark was restored (700 results missing, 1,121
    wrong)."""
    setup_topics(kafka_tools, unique)
    topics = names(unique)
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=400, seed=34)
    at = save(broker.bootstrap, unique, {0: value})
    text = refused(broker.bootstrap, unique)
    assert f"checkpoint of partition 0 at {checkpoints_topic(unique)}:0@{at[0]}" in text
    assert says in text
    assert f"--reset-offsets --group g-{unique} --topic {checkpoints_topic(unique)}:0" in text
    nothing_written(kafka_tools, unique)


# -- many partitions restored together (issue 22 item 11) --------------------------------------


#: `evald run` with every OffsetFetch kafka-python sends printed to stderr (the partitions it
#: names), so a test can count the round trips of a restore
LOG_OFFSET_FETCHES = """
import runpy, sys
from kafka.coordinator.consumer import ConsumerCoordinator
send = ConsumerCoordinator._send_offset_fetch_request
async def logged(self, partitions):
    named = sorted(f"{tp.topic}:{tp.partition}" for tp in partitions or ())
    print("OffsetFetch", " ".join(named), file=sys.stderr, flush=True)
    return await send(self, partitions)
ConsumerCoordinator._send_offset_fetch_request = logged
sys.argv = ["evald", *sys.argv[1:]]
runpy.run_module("evald", run_name="__main__")
"""


def test_16_partitions_are_restored_together_with_one_offset_fetch(
    broker: Broker, kafka_tools: KafkaTools, unique: str, tmp_path: Path
) -> None:
    """Before, each partition was restored on its own: 16 OffsetFetch requests in a row, each
    naming one checkpoint partition (then a read of its checkpoint, its snapshot, its
    results: ready after 32 s with 64 partitions). Now one names all 16."""
    setup_topics(kafka_tools, unique, partitions=16)
    save(broker.bootstrap, unique, {p: saved(p).encode() for p in range(16)})
    port = free_port()
    argv = run_argv(broker.bootstrap, unique, f"127.0.0.1:{port}")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("EVALD_")}
    log_path = tmp_path / "evald.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [argv[0], "-c", LOG_OFFSET_FETCHES, *argv[3:]],
            env=env,
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent,
        )
        try:
            wait_until(lambda: ready(port) or proc.poll() is not None, 90, "readiness")
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=40) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    text = log_path.read_text(errors="replace")
    ckpt = checkpoints_topic(unique)
    fetches = [line.split()[1:] for line in text.splitlines() if line.startswith("OffsetFetch")]
    of_checkpoints = [f for f in fetches if any(n.startswith(f"{ckpt}:") for n in f)]
    assert of_checkpoints, f"no OffsetFetch of the checkpoint topic in {fetches}"
    for named in of_checkpoints:  # a retried fetch names them all again
        assert {n for n in named if n.startswith(f"{ckpt}:")} == {
            f"{ckpt}:{p}" for p in range(16)
        }, named
    assert "16 partitions restored in" in text


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False
