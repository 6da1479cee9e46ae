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
from kafka_harness import KafkaTools
from test_kafka import (  # noqa: F401 (instances is a fixture)
    Instance,
    instances,
    names,
    results_by_id,
    wait_until,
)

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
    instances: Callable[..., Instance],  # noqa: F811 (the fixture imported above)
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
