"""`evald run` set up wrong in the ways a first hour gets it wrong, on the test broker: what no
retry can fix exits 2 saying which setting to change, what may fix itself is retried with
evald's own line, and data that cannot be written is dead-lettered, never looped on."""

from __future__ import annotations

from kafka_harness import Broker, KafkaTools
from kafka_instances import names, run_argv, run_to_exit

import pytest

pytestmark = pytest.mark.kafka


def test_a_transaction_timeout_above_the_brokers_maximum_exits_2_naming_both_settings(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """The broker refuses the producer's InitProducerId (INVALID_TRANSACTION_TIMEOUT) the same
    way every time; before, evald retried it forever with a session a second."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    # the test broker keeps Kafka's default transaction.max.timeout.ms, 900000
    argv = [
        *run_argv(broker.bootstrap, unique, "127.0.0.1:0"),
        "--set",
        "kafka.transaction_timeout_ms=900001",
    ]
    proc = run_to_exit(argv)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "kafka.transaction_timeout_ms" in proc.stderr
    assert "transaction.max.timeout.ms" in proc.stderr
