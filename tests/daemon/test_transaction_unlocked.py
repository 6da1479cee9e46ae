"""A commit waiting on the broker lets go of the engine: a scrape meanwhile gets the engine's
series, and the commit still finishes exactly once (Apache Kafka, in-process daemon).

The commit is held inside its flush (flush_gate.py): a real broker outage leaves the loop in the
same wait, but at a moment the test cannot choose.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flush_gate import FlushGate, gate_flushes
from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import make_settings, names, running, settled
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families as parse_text
from test_kafka import assert_exactly_once, results_by_id

from evald.daemon.scrape import ScrapeLock
from evald.exposition import build_registry

pytestmark = pytest.mark.kafka

#: long enough for the loop to let go of a free lock on a loaded machine; the old loop held it
#: until the test let the flush go, so a scrape waiting this long failed
SCRAPE_WAIT_S = 20.0


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[FlushGate]:
    held = gate_flushes(monkeypatch)
    yield held
    held.release.set()


def series(registry: Any) -> set[str]:
    return {family.name for family in parse_text(generate_latest(registry).decode())}


def test_a_scrape_during_a_commit_waiting_on_the_broker_gets_the_engine(
    broker: Broker, kafka_tools: KafkaTools, unique: str, gate: FlushGate
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=1500, seed=12)
    settings = make_settings(broker.bootstrap, unique)
    engines: list[Any] = []
    with running(settings, on_engine=engines.append) as daemon:
        registry, collector = build_registry(
            None, lock=ScrapeLock(daemon.lock, wait_s=SCRAPE_WAIT_S), process=False
        )
        wait_until(lambda: settled(daemon, kafka_tools, unique), 90, "the daemon to settle")
        collector.engine = engines[-1]
        gate.armed.set()
        # new records: the next cycle feeds them and its commit flushes
        kafka_tools.produce_sim(
            topics["impressions"], topics["feedback"], events=1500, seed=12, skip=1500
        )
        assert gate.entered.wait(60), "no commit flushed the new records"
        try:
            # the loop is inside a commit, waiting on the broker: the scrape is not refused
            assert "evald_events" in series(registry)
        finally:
            gate.release.set()
        wait_until(lambda: settled(daemon, kafka_tools, unique), 90, "the commit to finish")
    expected, _ = kafka_tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(kafka_tools, topics["results"]), expected)
