"""The zero-feedback signals through `evald run` on Apache Kafka with a kill -9 mid-stream
(the chaos tier: a minute of Kafka; the engine-level restore is tested at three cut points in
tests/zerofeedback/test_engine_signals.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import Instance, make_settings, names
from kafka_oracle import assert_exactly_once, results_by_id

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]

ON = ("--set", "engine.zero_feedback.depth=10")


def test_kill_9_mid_stream_the_signals_equal_an_uninterrupted_run(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """Every result record, its ``zero_feedback`` values included, equals one engine fed every
    record: the judged pairs and reference lists came back from the checkpoint."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 3, topics["feedback"]: 3})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=4000, seed=5)
    first = instances("a", extra=ON)
    wait_until(
        lambda: first.metric("evald_results_produced_total") > 300, 90, "results before the kill"
    )
    first.kill()
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=4000, seed=5, skip=4000
    )
    second = instances("a", extra=ON)
    wait_until(lambda: second.get("/readyz")[0] == 200, 90, "readiness after restart")
    wait_until(lambda: second.lag_zero(3), 120, "the restarted daemon to catch up")
    time.sleep(1.0)  # one more commit interval
    assert second.terminate() == 0
    config = make_settings(kafka_tools.bootstrap, unique).engine_config()
    config = config.model_copy(
        update={"zero_feedback": config.zero_feedback.model_copy(update={"depth": 10})}
    )
    expected, _ = kafka_tools.expected(config, topics["impressions"], topics["feedback"])
    got = results_by_id(kafka_tools, topics["results"])
    differ = [(rid, d[0], expected.get(rid)) for rid, d in got.items() if d[0] != expected.get(rid)]
    assert not differ, f"{len(differ)} results differ, first: {differ[0]}"
    assert_exactly_once(got, expected)
    rbo = [d[0]["zero_feedback"]["rbo"] for d in got.values() if d[0]["zero_feedback"]["rbo"]]
    unjudged = [d[0]["zero_feedback"]["unjudged"] for d in got.values()]
    assert len(rbo) > 100 and any(u is not None and u < 1 for u in unjudged), "vacuous"
