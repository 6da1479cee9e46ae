"""`evald run` as a real process on the test broker, fed what production throws at it: a record
just under Kafka's size limit, a flood of impressions without feedback, topics deleted and
recreated under it, a SIGHUP (issue 10)."""

from __future__ import annotations

import hashlib
import json
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import Instance, names

pytestmark = pytest.mark.kafka


def log_text(inst: Instance) -> str:
    inst.log.flush()
    return Path(inst.log.name).read_text(errors="replace")


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets on ``topic`` (partition -> offset)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


#: a status line with records pending in the engine
FED = re.compile(r"status.* · pending [1-9]")  # ready or not


def test_sighup_stops_cleanly_with_a_commit(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=3000, seed=11)
    inst = instances(extra=("--set", "daemon.commit_interval_ms=600000", "--status-interval", "1s"))
    # records fed (the status line reads the engine itself; its counters on /metrics show what
    # committed, 0 until the stop); nothing committed by the interval (ten minutes): only the
    # stop commits
    wait_until(lambda: FED.search(log_text(inst)), 90, "records fed")
    assert inst.metric("evald_events_total") == 0
    assert not committed(broker.bootstrap, f"g-{unique}", topics["feedback"])
    inst.proc.send_signal(signal.SIGHUP)
    assert inst.proc.wait(timeout=40) == 0
    text = log_text(inst)
    assert "received SIGHUP" in text
    assert inst.windows.exists(), "the clean-stop path (which writes the windows file) did not run"
    fed = sum(committed(broker.bootstrap, f"g-{unique}", topics["feedback"]).values())
    assert fed > 0, "no commit on SIGHUP"
    assert "events/impression/accepted" in text  # the session logged what its engine counted


def recreate(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again with ``partitions`` partitions."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
        wait_until(lambda: topic not in admin.list_topics(), 30, f"{topic} to be deleted")

        def created() -> bool:
            try:
                admin.create_topics([NewTopic(topic, partitions, 1)])
            except TopicAlreadyExistsError:  # the deletion is still under way
                return False
            return True

        wait_until(created, 30, f"{topic} to be created again")
    finally:
        admin.close()


@pytest.mark.parametrize(
    ("kind", "partitions", "said"),
    [
        ("feedback", 4, "changed from 3 to 4 partitions"),
        ("impressions", 3, "was deleted and recreated (topic id"),
    ],
    ids=["feedback-repartitioned", "impressions-recreated"],
)
def test_input_topic_recreated_under_the_daemon_exits_2(
    kind: str,
    partitions: int,
    said: str,
    broker: Broker,
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 3, topics["feedback"]: 3})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=1500, seed=12)
    inst = instances()
    wait_until(lambda: inst.lag_zero(3), 90, "the daemon to catch up")
    recreate(broker.bootstrap, topics[kind], partitions)
    # the daemon checks every 10 s; without the check it never notices
    wait_until(lambda: inst.proc.poll() is not None, 60, "the daemon to exit")
    assert inst.proc.returncode == 2
    text = log_text(inst)
    # a check landing between the delete and the create sees the topic missing: also right
    gone = f"input topic {topics[kind]} no longer exists"
    assert f"input topic {topics[kind]} {said}" in text or gone in text, text[-3000:]
    assert "start evald with a new daemon.group_id" in text
    # the consumer did not create anything on its own either
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        (desc,) = admin.describe_topics([topics[kind]])
    finally:
        admin.close()
    assert len(desc["partitions"]) == partitions


@pytest.mark.chaos  # a broker fault: the chaos tier (make test-chaos)
def test_broker_restarted_empty_is_not_consumed_as_new_topics(unique: str, tmp_path: Path) -> None:
    """A broker that lost its data: the daemon must not carry on with "ok" on empty inputs; it
    exits 2 saying what happened to them. (a broker that creates subscribed topics itself
    (tansu does, whatever the client asks) gets caught by a new topic id or another partition
    count; on Apache Kafka with `allow_auto_create_topics=False` the topics
    stay missing.)"""
    first = Broker(tmp_path / "kafka")
    port = first.port
    inst = None
    try:
        tools = KafkaTools(first.bootstrap)
        topics = names(unique)
        tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
        tools.produce_sim(topics["impressions"], topics["feedback"], events=1000, seed=13)
        inst = Instance(first.bootstrap, unique, "a", tmp_path)
        wait_until(lambda: inst.lag_zero(2), 90, "the daemon to catch up")
        first.stop()
        first = Broker(tmp_path / "kafka-empty", port=port)  # same address, no data
        wait_until(lambda: inst.proc.poll() is not None, 90, "the daemon to exit")
        assert inst.proc.returncode == 2
        text = log_text(inst)
        said = ("do not exist", "no longer exists", "was deleted and recreated", "partitions while")
        assert any(s in text for s in said), text[-3000:]
        assert "start evald with a new daemon.group_id" in text
    finally:
        if inst is not None:
            inst.close()
        first.stop()


#: accepted by Kafka's default limits, rejected by evald as too_large; its dead letter with
#: the original bytes would be 1,048,688 bytes, over a DLQ topic at Kafka's default limit
#: (one evald creates has room for it: docs/daemon.md)
BIG = 1_048_400


def test_a_record_just_under_kafkas_limit_is_dead_lettered_truncated(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    from kafka import KafkaProducer
    from kafka_instances import make_settings
    from kafka_oracle import assert_exactly_once, results_by_id

    topics = names(unique)
    # the DLQ made by hand, at Kafka's default max.message.bytes: the letter must be cut
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1, topics["dlq"]: 1})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=1500, seed=14)
    big = (b'{"request_id":"big","items":["' + b"x" * BIG)[:BIG]
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=2_000_000)
    try:
        # in the traffic's event time, so the merge order is the reference's
        ts = kafka_tools.read(topics["impressions"])[-1].timestamp
        meta = producer.send(topics["impressions"], key=b"big-key", value=big, timestamp_ms=ts).get(
            timeout=30
        )
    finally:
        producer.close(timeout=5)
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=1500, seed=14, skip=1500
    )
    inst = instances()
    wait_until(lambda: inst.lag_zero(1), 120, "the daemon to catch up")
    assert inst.terminate() == 0
    expected, _ = kafka_tools.expected(
        make_settings(broker.bootstrap, unique).engine_config(),
        topics["impressions"],
        topics["feedback"],
    )
    # every good impression scored, exactly once
    assert_exactly_once(
        results_by_id(kafka_tools, topics["results"]), expected, allow_identical_copies=False
    )
    letters = [r for r in kafka_tools.read(topics["dlq"]) if r.key == b"big-key"]
    assert len(letters) == 1
    (letter,) = letters
    headers = {name: value.decode() for name, value in letter.headers}
    assert headers["evald-reason"] == "too_large"
    assert headers["evald-source-topic"] == topics["impressions"]
    assert headers["evald-source-partition"] == str(meta.partition)
    assert headers["evald-source-offset"] == str(meta.offset)
    assert headers["evald-original-size"] == str(BIG)
    assert headers["evald-original-sha256"] == hashlib.sha256(big).hexdigest()
    assert headers["evald-truncated"] == str(len(letter.value))
    assert 0 < len(letter.value) < BIG and big.startswith(letter.value)


def flood(tools: KafkaTools, topic: str, count: int, start_ms: int = 1_763_683_200_000) -> None:
    """``count`` impressions 1 ms apart (all inside one window), keyed by request id."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=tools.bootstrap, linger_ms=20)
    try:
        for i in range(count):
            rid = f"f{i:07d}"
            value = json.dumps(
                {"request_id": rid, "ts": start_ms + i, "items": [f"i{i % 97}", f"i{i % 89}"]}
            ).encode()
            producer.send(topic, key=rid.encode(), value=value, timestamp_ms=start_ms + i)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=5)


def test_a_flood_without_feedback_is_evicted_at_the_cap_without_pausing(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """Ten times max_pending impressions and no feedback at all: pausing the impressions cannot
    drain anything, so they keep flowing and the cap closes the earliest deadlines; every
    impression beyond the cap is finalized once, with no pause/resume churn."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    flood(kafka_tools, topics["impressions"], 20_000)
    inst = instances(extra=("--set", "engine.max_pending=2000"))
    wait_until(lambda: inst.lag_zero(2), 120, "the daemon to consume the flood")
    wait_until(
        lambda: inst.metric("evald_results_produced_total") >= 18_000, 60, "the cap's results"
    )
    assert inst.metric("evald_backpressure_pauses_total") == 0
    assert inst.get("/readyz")[0] == 200
    assert inst.terminate() == 0
    got = [json.loads(r.value)["request_id"] for r in kafka_tools.read(topics["results"])]
    assert len(got) == len(set(got)) >= 18_000
    lines = [x for x in log_text(inst).splitlines() if "backpressure" in x]
    assert len(lines) <= 2, lines


def test_readyz_turns_red_when_lag_exists_but_nothing_is_consumed(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """Feedback newer than every impression waits for the merge hold; with a hold far longer
    than ``stall_timeout_s`` that is a stall the loop cannot see from inside: /readyz says so."""
    from kafka_instances import make_settings, running

    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    settings = make_settings(broker.bootstrap, unique, stall_timeout_s=1.0)
    with running(settings, merge_hold_s=120.0) as daemon:
        wait_until(lambda: daemon.ready()[0], 60, "the daemon to be ready")
        kafka_tools.produce_raw(
            topics["feedback"],
            [b'{"request_id":"r1","ts":1763683200000,"item":"a","action":"click"}'] * 5,
            timestamp_ms=1_763_683_200_000,
        )

        def stalled() -> str | None:
            ok, reason = daemon.ready()
            return reason if not ok and reason.startswith("stalled") else None

        # a (re)assignment may show "restoring partitions [0]" first; then the stall
        reason = wait_until(stalled, 60, "a stall")
        assert reason.startswith("stalled: 5 records of lag and nothing consumed for")
        # evald_ready follows at the next lag probe (every commit interval)
        wait_until(lambda: daemon.stats.ready is False, 30, "evald_ready 0")


def test_an_input_recreated_while_no_evald_ran_is_refused_at_restore(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=1500, seed=15)
    first = instances("a")
    wait_until(lambda: first.lag_zero(2), 90, "the daemon to catch up")
    assert first.terminate() == 0
    recreate(broker.bootstrap, topics["impressions"], 2)
    second = instances("a")
    wait_until(lambda: second.proc.poll() is not None, 90, "the restarted daemon to exit")
    assert second.proc.returncode == 2
    text = log_text(second)
    assert f"input topic {topics['impressions']} was deleted and recreated since the" in text


def test_a_missing_input_topic_at_start_exits_2_and_is_not_created(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    import subprocess

    from kafka import KafkaAdminClient
    from kafka_instances import run_argv

    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2})
    proc = subprocess.run(
        run_argv(broker.bootstrap, unique, "127.0.0.1:0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"input topic(s) {topics['feedback']} do not exist" in proc.stderr
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert topics["feedback"] not in admin.list_topics()
    finally:
        admin.close()
