"""A restore whose offset fetch the broker keeps answering "unstable" ends the session instead of
hanging the loop (Apache Kafka, in-process daemon).

A restore reads the group's committed offset on the checkpoint topic with ``require_stable``:
while another producer's open transaction holds offsets of the group, the broker answers
UNSTABLE_OFFSET_COMMIT, and kafka-python retried that without end, with the loop holding the
engine (no cycle, no heartbeat, scrapes without the engine, a stop request not honoured) until
the transaction timed out; it retries the same way while the group coordinator is away. Now the
restore gives up after kafka.request_timeout_ms + kafka.transaction_timeout_ms and the session
is retried. Here the open transaction is a second producer's, left open by the test.
"""

from __future__ import annotations

import logging

import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import make_settings, names, running, settled
from test_kafka import assert_exactly_once, results_by_id

pytestmark = pytest.mark.kafka

#: the bound on the offset fetch is kafka.request_timeout_ms + kafka.transaction_timeout_ms:
#: 6 s + 10 s here
REQUEST_TIMEOUT_MS = 6_000
#: the open transaction outlives the test's wait by far: only the bound can end the fetch
OPEN_TRANSACTION_MS = 300_000


def test_a_restore_waiting_on_an_open_transactions_offsets_gives_up_and_retries(
    broker: Broker, kafka_tools: KafkaTools, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="evald.daemon")
    topics = names(unique)
    checkpoints = f"{topics['results']}.checkpoints"
    scratch = f"scratch-{unique}"
    kafka_tools.create(
        {topics["impressions"]: 1, topics["feedback"]: 1, checkpoints: 1, scratch: 1}
    )
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=800, seed=13)
    settings = make_settings(
        broker.bootstrap, unique, kafka={"request_timeout_ms": REQUEST_TIMEOUT_MS}
    )
    other = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        transactional_id=f"other-{unique}",
        transaction_timeout_ms=OPEN_TRANSACTION_MS,
    )
    try:
        other.init_transactions()
        other.begin_transaction()
        other.send(scratch, b"x", partition=0).get(timeout=30)
        other.send_offsets_to_transaction(
            {TopicPartition(checkpoints, 0): OffsetAndMetadata(0, "", -1)},
            settings.daemon.group_id,
        )
        with running(settings) as daemon:
            # the old loop waited in the fetch for the open transaction's 300 s
            wait_until(
                lambda: "RestoreError: the group's committed offset" in caplog.text,
                60,
                "the session to give up on the offset fetch",
            )
            assert daemon.lock.acquire(timeout=30), "the loop kept the engine"
            daemon.lock.release()
            other.abort_transaction()
            wait_until(lambda: settled(daemon, kafka_tools, unique), 90, "the daemon to settle")
    finally:
        other.close(timeout=5)
    expected, _ = kafka_tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(kafka_tools, topics["results"]), expected)
