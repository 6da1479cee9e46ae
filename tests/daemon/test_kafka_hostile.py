"""Hostile event times through `evald run` on the test broker, across a kill -9 restart.

The issue's cases: a year-9999 impression (a client clock bug) used to set the partition's
watermark for good: every later impression was late and scored 0, and the poisoned watermark
came back from the checkpoint after a restart. Now it is dead-lettered as
``implausible_timestamp``. One impression 45 minutes ahead passes that bound (under 1 h ahead
of its record timestamp), and so does a feedback 3 h ahead whose record timestamp is just as
far ahead (its producer's clock is wrong too): before, the first was confirmed at once and made
every later impression late; now neither moves the watermark, which follows only times a whole
block of events has reached (docs/semantics.md §3).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kafka_harness import ENGINE, KafkaTools, wait_until
from kafka_instances import Instance, names
from kafka_oracle import results_by_id

from evald.config import EngineConfig, load_config

pytestmark = pytest.mark.kafka

T0 = 1_714_564_800_000  # 2024-05-01T12:00:00Z
SECOND = 1_000
MIN = 60_000
HOUR = 60 * MIN
LATENESS = load_config(ENGINE).lateness
QUORUM = EngineConfig.model_fields["watermark_quorum"].default

#: (record timestamp, 0 impression / 1 feedback, raw value): what one produce call writes
Records = list[tuple[int, int, bytes]]


def traffic(first: int, last: int) -> Records:
    """Impressions r{k} ten seconds apart, each clicked on its second item 5 s later; the
    record timestamp is the event time, as a producer stamping its own events would."""
    out: Records = []
    for k in range(first, last):
        ts = T0 + k * 10 * SECOND
        out.append((ts, 0, json.dumps({"request_id": f"r{k}", "ts": ts, "items": ["x", "y"]})))
        click = {"request_id": f"r{k}", "ts": ts + 5_000, "item": "y", "action": "click"}
        out.append((ts + 5_000, 1, json.dumps(click)))
    return [(stamp, kind, value.encode()) for stamp, kind, value in out]


def produce(tools: KafkaTools, topics: dict[str, str], records: Records) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=tools.bootstrap, linger_ms=10)
    try:
        for stamp, kind, value in records:
            topic = topics["feedback"] if kind else topics["impressions"]
            producer.send(topic, value=value, partition=0, timestamp_ms=stamp)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def fed_times(records: Records) -> list[int]:
    """The accepted events' times in the order the daemon feeds them: by record timestamp,
    impressions first, then offset (docs/design.md; ``records`` are produced in this order and
    their timestamps grow within each topic); the year-9999 one is rejected."""
    order = sorted(enumerate(records), key=lambda r: (r[1][0], r[1][1], r[0]))
    docs = [json.loads(value) for _, (_, _, value) in order]
    return [doc["ts"] for doc in docs if isinstance(doc["ts"], int)]


def expected_watermark(times: list[int]) -> int:
    """The rule from scratch: the largest earliest time of a full block, minus the lateness."""
    blocks = [times[k : k + QUORUM] for k in range(0, len(times) - QUORUM + 1, QUORUM)]
    return max(min(block) for block in blocks) - LATENESS


def watermark_s(instance: Instance) -> float:
    return instance.metric("evald_watermark_timestamp_seconds")


def late_finalized(instance: Instance) -> float | None:
    """``evald_impressions_finalized_total{reason="late"}``; None when not exposed."""
    status, text = instance.get("/metrics")
    for line in text.splitlines() if status == 200 else []:
        if line.startswith('evald_impressions_finalized_total{reason="late"}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def scored(tools: KafkaTools, topic: str) -> dict[str, Any]:
    return {rid: docs[0]["measures"]["RR"] for rid, docs in results_by_id(tools, topic).items()}


def test_times_ahead_never_poison_the_watermark_even_after_kill_9(
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    first_part = traffic(0, 120)
    # one impression 45 minutes ahead from a producer whose clock is right (lead < 1 h)
    stamp = T0 + 597 * SECOND
    ahead = {"request_id": "ahead", "ts": stamp + 45 * MIN, "items": ["x", "y"]}
    first_part.insert(120, (stamp, 0, json.dumps(ahead).encode()))  # after r59 and its click
    # last on their topics: within a partition the daemon merges the two topics by record
    # timestamp, so a record stamped 3 h ahead holds back the records behind it
    poison = b'{"request_id":"p","ts":"9999-12-31T23:59:59Z","items":["x"]}'
    first_part.append((T0 + 20 * MIN, 0, poison))
    ghost = {"request_id": "g", "ts": T0 + 20 * MIN + 3 * HOUR, "item": "x", "action": "click"}
    first_part.append((ghost["ts"], 1, json.dumps(ghost).encode()))
    produce(kafka_tools, topics, first_part)
    times = fed_times(first_part)
    mark = expected_watermark(times)
    genuine = [t for t in times if t < T0 + 30 * MIN]
    assert len(genuine) == len(times) - 2 and mark <= max(genuine) - LATENESS

    first = instances("a")
    wait_until(lambda: first.lag_zero(1), 120, "the first instance to catch up")
    wait_until(lambda: watermark_s(first) == mark / 1000, 60, "the expected watermark")
    dlq = kafka_tools.read(topics["dlq"])
    assert [(r.value, dict(r.headers)["evald-reason"]) for r in dlq] == [
        (poison, b"implausible_timestamp")
    ]
    first.kill()

    second = instances("a")
    wait_until(lambda: second.get("/readyz")[0] == 200, 90, "readiness after the restart")
    # the restored watermark is the checkpointed one: neither 9999 nor a time ahead
    wait_until(lambda: watermark_s(second) > 0, 60, "the restored watermark on /metrics")
    assert watermark_s(second) <= mark / 1000
    second_part = traffic(120, 180)
    produce(kafka_tools, topics, second_part)
    times += fed_times(second_part)
    wait_until(lambda: second.lag_zero(1), 60, "the restarted instance to catch up")
    # the restored block continues where the checkpoint left it: the uninterrupted watermark
    final = expected_watermark(times)
    wait_until(lambda: watermark_s(second) == final / 1000, 60, "the expected watermark")
    assert late_finalized(second) == 0
    assert second.terminate() == 0
    # every impression the watermark closed scored as if the outliers were absent: each kept
    # its click (the rest stay pending for the next start)
    window = load_config(ENGINE).window
    closed = [k for k in range(180) if T0 + k * 10 * SECOND + window <= final]
    assert len(closed) > 140
    assert scored(kafka_tools, topics["results"]) == {f"r{k}": 0.5 for k in closed}


def test_the_input_rule_on_kafka_records(
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
) -> None:
    """The rule shared with replay and score: a BOM is ignored, t/z are T/Z, a repeated key
    and an over-long value are dead-lettered with their reason and the raw bytes."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    bom = b"\xef\xbb\xbf"
    impressions = [
        bom + b'{"request_id":"a","ts":"2024-05-01t12:00:00z","items":["x","y"]}',
        b'{"request_id":"d","ts":1714564801000,"items":["x"],"labels":{"m":"1","m":"2"}}',
        b'{"request_id":"big","ts":1714564802000,"items":["' + b"z" * 70_000 + b'"]}',
        b'{"request_id":"b","ts":1714564803000,"items":["x","y"]}',
        b'{"request_id":"c","ts":1714564830000,"items":["x","y"]}',
        b'{"request_id":"z","ts":1714565100000,"items":["x"]}',  # 5 min on: closes the rest
    ]
    feedback = [
        b'{"request_id":"a","ts":1714564805000,"item":"y","action":"click"}',
        b'{"request_id":"b","ts":1714564806000,"item":"x","item":"y","action":"click"}',
        b'{"request_id":"c","ts":1714564831000,"item":"x","action":"click"}',
        b'{"request_id":"z","ts":1714565100000,"item":"x","action":"click"}',
    ]
    # record timestamps in event-time order, as the producers would stamp them
    stamps = [0, 1_000, 2_000, 3_000, 30_000, 300_000]
    for value, stamp in zip(impressions, stamps, strict=True):
        kafka_tools.produce_raw(topics["impressions"], [value], timestamp_ms=T0 + stamp)
    for value, stamp in zip(feedback, [5_000, 6_000, 31_000, 300_000], strict=True):
        kafka_tools.produce_raw(topics["feedback"], [value], timestamp_ms=T0 + stamp)
    # each event confirms its time, so "z" closes the rest (the rule is about input, not time)
    instance = instances("a", extra=("--set", "engine.watermark_quorum=1"))
    wait_until(lambda: len(kafka_tools.read(topics["dlq"])) >= 3, 90, "three dead letters")
    wait_until(lambda: len(scored(kafka_tools, topics["results"])) >= 3, 60, "three results")
    assert instance.terminate() == 0
    dlq = {
        (
            dict(r.headers)["evald-source-topic"].decode(),
            int(dict(r.headers)["evald-source-offset"]),
        ): (
            dict(r.headers)["evald-reason"],
            r.value,
        )
        for r in kafka_tools.read(topics["dlq"])
    }
    assert dlq == {
        (topics["impressions"], 1): (b"duplicate_key", impressions[1]),
        (topics["impressions"], 2): (b"too_large", impressions[2]),
        (topics["feedback"], 1): (b"duplicate_key", feedback[1]),
    }
    # a: BOM and lowercase time accepted, its click on the 2nd item; b lost its click
    assert scored(kafka_tools, topics["results"]) == {"a": 0.5, "b": 0.0, "c": 1.0}  # z: open
