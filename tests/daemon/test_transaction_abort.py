"""A session that fails with its transaction open and the broker unreachable is torn down and
retried, not hung on the abort (Apache Kafka behind a loopback proxy, in-process daemon).

Closing the consumer of a failed session revokes its partitions; the revocation found the
session abandoned and aborted the open transaction, and kafka-python's
``abort_transaction()`` waits for the coordinator's answer with no limit. With the broker away
the teardown never ended, on the consumer's I/O thread holding the engine: no new session, no
results, scrapes without the engine (seen on three brokers with two of them killed). A failed
session now leaves the transaction to the next session's ``init_transactions()``.

The commit is held inside its flush (flush_gate.py) until the proxy is cut, so the session fails
with its transaction open; a real outage does that at a moment the test cannot choose.
"""

from __future__ import annotations

import logging

import pytest
from flush_gate import gate_flushes
from kafka_harness import Broker, KafkaTools, TcpProxy, wait_until
from kafka_instances import make_settings, names, running, settled
from test_kafka import assert_exactly_once, results_by_id

pytestmark = pytest.mark.kafka

#: a flush cut off from the broker fails after this, and so does the next session's start
REQUEST_TIMEOUT_MS = 6_000
FAILED = "kafka session failed"


def failures(caplog: pytest.LogCaptureFixture) -> int:
    return sum(FAILED in record.getMessage() for record in list(caplog.records))


def test_a_session_failing_with_its_transaction_open_and_the_broker_away_is_retried(
    proxied_broker: tuple[Broker, TcpProxy],
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="evald.daemon")
    gate = gate_flushes(monkeypatch)
    broker, proxy = proxied_broker
    tools = KafkaTools(broker.bootstrap)
    topics = names(unique)
    tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    tools.produce_sim(topics["impressions"], topics["feedback"], events=1500, seed=14)
    settings = make_settings(
        broker.bootstrap, unique, kafka={"request_timeout_ms": REQUEST_TIMEOUT_MS}
    )
    with running(settings) as daemon:
        wait_until(lambda: settled(daemon, tools, unique), 90, "the daemon to settle")
        gate.armed.set()
        try:
            tools.produce_sim(
                topics["impressions"], topics["feedback"], events=1500, seed=14, skip=1500
            )
            assert gate.entered.wait(60), "no commit flushed the new records"
            assert daemon.transaction.open, "the commit holds no open transaction"
            proxy.cut()
            gate.release.set()
            # the first failure is the commit's; a second one means the teardown ended and a
            # new session tried (and failed: the broker is still away)
            wait_until(lambda: failures(caplog) >= 2, 60, "a second session to be tried")
        finally:
            gate.release.set()
            proxy.restore()
        wait_until(lambda: settled(daemon, tools, unique), 120, "recovery after the outage")
    expected, _ = tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(tools, topics["results"]), expected)
