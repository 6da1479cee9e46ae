"""Interleaving credit through `evald run` on Apache Kafka with a kill -9: every result on the
results topic (read_committed, no de-duplication) carries the credit the plain computation
gives for its list, and no list is credited twice (docs/semantics.md §9)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable

import pytest
from interleaved_stream import T0, events, plain_credit
from kafka_harness import KafkaTools, wait_until
from kafka_instances import Instance, names

pytestmark = pytest.mark.kafka

TEAMS = ("--set", 'engine.interleaving={"teams": ["A", "B"]}')


def test_credit_through_a_kill_9_equals_the_plain_computation(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    shift = int(time.time() * 1000) - 40 * 60_000 - T0
    stream = events(seed=5, n=2400)
    for event in stream:
        event["ts"] += shift
    rows = [
        ("impression" if "items" in e else "feedback", e["ts"], json.dumps(e).encode())
        for e in stream
    ]
    half = len(rows) // 2
    kafka_tools.produce_rows(topics["impressions"], topics["feedback"], {0: rows[:half]})
    first = instances("a", extra=TEAMS)
    wait_until(lambda: first.lag_zero(1), 120, "the first run to consume its half")
    time.sleep(1.0)  # a commit interval
    first.kill()
    kafka_tools.produce_rows(topics["impressions"], topics["feedback"], {0: rows[half:]})
    second = instances("a", extra=TEAMS)
    wait_until(lambda: second.lag_zero(1), 120, "the second run to catch up")
    time.sleep(1.0)
    assert second.terminate() == 0
    results = [json.loads(r.value) for r in kafka_tools.read(topics["results"], committed=True)]
    seen = Counter(r["request_id"] for r in results)
    assert max(seen.values()) == 1  # exactly once
    expected = plain_credit(stream)
    credited = {
        r["request_id"]: r["interleaving"]["credit"] for r in results if "interleaving" in r
    }
    assert len(credited) >= 0.9 * len(expected)  # the tail may still wait for its window
    assert credited == {rid: expected[rid] for rid in credited}
    plain = [r for r in results if "interleaving" not in r]
    assert all(int(r["request_id"][1:]) % 10 == 9 for r in plain)  # the lists not interleaved
