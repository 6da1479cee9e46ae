"""The statistics topic reader: records that are not statistics records are skipped, counted
on /metrics and the first one logged with its reason (on Apache Kafka, `evald run` a child)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from kafka_harness import KafkaTools, wait_until
from kafka_instances import Instance, names

from evald.daemon.main.comparisons import statistics_topic
from evald.daemon.settings import TopicSettings

pytestmark = pytest.mark.kafka

STATISTICS = {
    "window": "5m",
    "comparisons": [
        {
            "name": "ab",
            "label": "arm",
            "control": "control",
            "treatments": ["treatment"],
            "start": 0,
        }
    ],
}
COUNTER = "evald_statistics_records_malformed_total"


def test_malformed_statistics_records_are_counted_and_the_first_is_logged(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    inst = instances("a", extra=("--set", f"engine.statistics={json.dumps(STATISTICS)}"))

    def exported() -> float | None:
        status, text = inst.get("/metrics")
        for line in text.splitlines() if status == 200 else []:
            if line.startswith(COUNTER + " "):
                return float(line.rsplit(" ", 1)[1])
        return None

    # the reader starts with the first session, which creates the topic
    wait_until(lambda: exported() == 0.0, 90, "the counter at 0 once the reader runs")
    topic = statistics_topic(TopicSettings.model_validate(names(unique)))
    kafka_tools.produce_raw(topic, [b"not json", b'{"v": 99}'], key=b"foreign")
    wait_until(lambda: exported() == 2.0, 60, "both malformed records counted")
    inst.log.flush()
    logged = [
        line
        for line in inst.log_path.read_text(errors="replace").splitlines()
        if f"statistics topic {topic} offset" in line
    ]
    assert len(logged) == 1, logged
    assert "WARNING" in logged[0] and "offset 0 skipped: malformed statistics record" in logged[0]
    assert COUNTER in logged[0]
    assert inst.terminate() == 0
