"""`evald run --mapping ubi` on Apache Kafka with UBI as its writers write it: query records
(without hits, several per search) on the queries topic, per-item ``impression`` events and
clicks on the events topic, times spelt every way. Lists are assembled across records and
topics, and exactly once through kill -9: results read_committed equal one uninterrupted
engine's over the same records (every list once), and each equals the oracle of the UBI
schema's meaning (tests/ubi_fixture.py).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from kafka_harness import ENGINE, KafkaTools, wait_until
from kafka_instances import Instance, make_settings, names
from kafka_oracle import (
    assert_consumed_to_the_end,
    assert_exactly_once,
    assert_no_transaction_left_open,
    assert_windows_equal,
    read_windows,
    results_by_id,
)
from ubi_fixture import EVENTS, Search, all_records, oracle, searches, time_of

from evald.durations import parse_duration
from evald.engine import Engine
from evald.mapping import decoder_for

pytestmark = pytest.mark.kafka

MAPPING = ("--mapping", "ubi")


def produce(tools: KafkaTools, unique: str, found: list[Search], seed: int) -> None:
    """Every record of ``found`` in time order, keyed by query_id, timestamped with its time."""
    from kafka import KafkaProducer

    topics = names(unique)
    recs = sorted(all_records(found, seed), key=lambda r: time_of(r[1]))
    producer = KafkaProducer(bootstrap_servers=tools.bootstrap, linger_ms=10)
    try:
        for index, doc in recs:
            topic = topics["feedback" if index == EVENTS else "impressions"]
            key, value = doc["query_id"].encode(), json.dumps(doc).encode()
            producer.send(topic, key=key, value=value, timestamp_ms=time_of(doc))
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def uninterrupted(tools: KafkaTools, unique: str) -> tuple[dict[str, Any], Engine]:
    """One engine with the ubi mapping fed every record in the daemon's documented order per
    partition (timestamp, impressions first, offset)."""
    topics = names(unique)
    config = make_settings(tools.bootstrap, unique).engine_config()
    results: list[Any] = []
    engine = Engine(config, on_result=results.append, decoder=decoder_for("ubi", config))
    records = [(r, "impression") for r in tools.read(topics["impressions"])]
    records += [(r, "feedback") for r in tools.read(topics["feedback"])]
    records.sort(key=lambda x: (x[0].partition, x[0].timestamp, x[1] != "impression", x[0].offset))
    for record, kind in records:
        engine.feed(
            record.value,
            partition=record.partition,
            kind=kind,
            offset=record.offset,
            timestamp=record.timestamp,
        )
    engine.tick()
    return {r.request_id: r.to_json() for r in results}, engine


def assert_exact_and_meaningful(
    tools: KafkaTools, unique: str, found: list[Search], last: Instance
) -> int:
    """The daemon's results: exactly once and equal to the uninterrupted engine's, windows
    equal, inputs consumed to the end, no transaction open; and each list's measures equal
    the schema oracle's. Returns how many lists were checked."""
    expected, reference = uninterrupted(tools, unique)
    assert_exactly_once(results_by_id(tools, names(unique)["results"]), expected)
    assert_windows_equal(read_windows(last.windows), reference)
    assert_consumed_to_the_end(tools, unique)
    assert_no_transaction_left_open(tools, unique)
    assembled = [s for s in found if s.shape in ("shown", "events") and s.query_id in expected]
    assert len(assembled) > 50, "too few lists of impression events scored: not effective"
    want = oracle(found, parse_duration(ENGINE["window"]))
    by_id = {s.query_id: s for s in found}
    for query_id, doc in expected.items():
        for name, value in want[query_id].items():
            assert doc["measures"][name] == pytest.approx(value, abs=1e-9), (query_id, name)
        assert doc["labels"] == by_id[query_id].labels()
    return len(expected)


def test_lists_of_impression_events_are_assembled_exactly_once_through_a_kill_9(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    found = searches(31, 300, gap_ms=4_000, scroll_ms=20_000)
    produce(kafka_tools, unique, found, 31)
    # a static member: the restart takes its partitions back without waiting out the session
    first = instances("a", static=True, extra=MAPPING)
    wait_until(
        lambda: first.metric("evald_results_produced_total") > 60, 120, "results before the kill"
    )
    first.kill()
    second = instances("a", static=True, extra=MAPPING)
    wait_until(lambda: second.lag_zero(2), 150, "the restarted daemon to catch up")
    time.sleep(1.0)  # one more commit interval
    assert second.terminate() == 0
    checked = assert_exact_and_meaningful(kafka_tools, unique, found, second)
    print(f"kill -9 with ubi lists assembling: {checked} lists exactly once, equal to the oracle")


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_lists_of_impression_events_through_seeded_random_kill_9s(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """Six kill -9s at seeded random times while the daemon works through the UBI records
    (items shown up to a minute after their query, so lists stay open across commits)."""
    rng = random.Random(32)
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 3, topics["feedback"]: 3})
    found = searches(32, 1500, gap_ms=2_000, scroll_ms=60_000)
    produce(kafka_tools, unique, found, 32)
    live = instances("a", extra=MAPPING)
    for _ in range(6):
        wait_until(lambda live=live: live.get("/readyz")[0] == 200, 150, "readiness")
        time.sleep(rng.uniform(0.5, 4.0))
        live.kill()
        live = instances("a", extra=MAPPING)
    wait_until(lambda: live.lag_zero(3), 240, "the last restart to catch up")
    time.sleep(1.0)
    assert live.terminate() == 0
    checked = assert_exact_and_meaningful(kafka_tools, unique, found, live)
    print(f"six seeded kill -9s with ubi lists assembling: {checked} lists exactly once")
