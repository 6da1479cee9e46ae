"""Hostile event times through `evald run` on the test broker, across a kill -9 restart.

The issue's case: a year-9999 impression (a client clock bug) used to set the partition's
watermark for good. Every later impression was late and scored 0, and the poisoned watermark
came back from the checkpoint after a restart. Now it is dead-lettered as
``implausible_timestamp``; a feedback 3 h ahead whose record timestamp is just as far ahead
(its producer's clock is wrong too, so it passes the lead bound) is one unconfirmed event and
moves nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kafka_harness import KafkaTools, wait_until
from kafka_instances import Instance, names
from kafka_oracle import results_by_id

pytestmark = pytest.mark.kafka

T0 = 1_714_564_800_000  # 2024-05-01T12:00:00Z
MIN = 60_000
HOUR = 60 * MIN


def produce_traffic(tools: KafkaTools, topics: dict[str, str], first: int, last: int) -> None:
    """Impressions r{k} one minute apart, each clicked on its second item 5 s later; the
    record timestamp is the event time, as a producer stamping its own events would."""
    for k in range(first, last):
        ts = T0 + k * MIN
        body = {"request_id": f"r{k}", "ts": ts, "items": ["x", "y"]}
        tools.produce_raw(topics["impressions"], [json.dumps(body).encode()], timestamp_ms=ts)
        click = {"request_id": f"r{k}", "ts": ts + 5_000, "item": "y", "action": "click"}
        tools.produce_raw(topics["feedback"], [json.dumps(click).encode()], timestamp_ms=ts + 5_000)


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


def test_far_future_times_never_poison_the_watermark_even_after_kill_9(
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    produce_traffic(kafka_tools, topics, 0, 20)
    # last on their topics: within a partition the daemon merges the two topics by record
    # timestamp, so a record stamped 3 h ahead holds back the records behind it
    poison = b'{"request_id":"p","ts":"9999-12-31T23:59:59Z","items":["x"]}'
    kafka_tools.produce_raw(topics["impressions"], [poison], timestamp_ms=T0 + 20 * MIN)
    ahead = T0 + 20 * MIN + 3 * HOUR
    ghost = {"request_id": "ghost", "ts": ahead, "item": "x", "action": "click"}
    kafka_tools.produce_raw(topics["feedback"], [json.dumps(ghost).encode()], timestamp_ms=ahead)

    first = instances("a")
    # window 1m, lateness 10s: r0..r17 close once r19's click (19m05s) is in
    wait_until(lambda: len(scored(kafka_tools, topics["results"])) >= 18, 120, "18 results")
    wait_until(lambda: first.lag_zero(1), 60, "the first instance to catch up")
    wait_until(lambda: watermark_s(first) >= (T0 + 19 * MIN - 10_000) / 1000, 60, "watermark")
    assert watermark_s(first) <= (T0 + 19 * MIN + 5_000 - 10_000) / 1000
    dlq = kafka_tools.read(topics["dlq"])
    assert [(r.value, dict(r.headers)["evald-reason"]) for r in dlq] == [
        (poison, b"implausible_timestamp")
    ]
    first.kill()

    second = instances("a")
    wait_until(lambda: second.get("/readyz")[0] == 200, 90, "readiness after the restart")
    # the restored watermark is the checkpointed one: neither 9999 nor the ghost's time
    wait_until(lambda: watermark_s(second) > 0, 60, "the restored watermark on /metrics")
    assert watermark_s(second) <= (T0 + 19 * MIN + 5_000 - 10_000) / 1000
    produce_traffic(kafka_tools, topics, 20, 30)
    wait_until(lambda: len(scored(kafka_tools, topics["results"])) >= 28, 120, "28 results")
    wait_until(lambda: second.lag_zero(1), 60, "the restarted instance to catch up")
    # r29 (29m) is in; its click may still wait in the merge for the next impression
    wait_until(lambda: watermark_s(second) >= (T0 + 29 * MIN - 10_000) / 1000, 60, "watermark")
    assert watermark_s(second) <= (T0 + 29 * MIN + 5_000 - 10_000) / 1000
    assert late_finalized(second) == 0
    assert second.terminate() == 0
    # every impression before and after the outliers scored as if they were absent (the
    # draining shutdown may add the last two, perhaps before their clicks were merged in)
    got = scored(kafka_tools, topics["results"])
    assert set(got) - {"r28", "r29"} == {f"r{k}" for k in range(28)}
    assert {k: got[f"r{k}"] for k in range(28)} == dict.fromkeys(range(28), 0.5)


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
    instance = instances("a")
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
