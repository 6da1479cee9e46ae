"""The kafka-python pause/resume work-around, against the real broker."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka_harness import Broker, KafkaTools

from evald.daemon.kafka_compat import unpark_resumed

pytestmark = pytest.mark.kafka


def test_a_resumed_partition_is_fetched_to_its_end(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    imp, fb = f"cimp-{unique}", f"cfb-{unique}"
    kafka_tools.create({imp: 1, fb: 1})
    kafka_tools.produce_sim(imp, fb, events=3000, seed=3, rate=2000, clean=True)
    ends = {imp: kafka_tools.end_offsets(imp)[0], fb: kafka_tools.end_offsets(fb)[0]}
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=f"compat-{unique}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=50,
        # tansu's first join of a group waits about half the session timeout
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    try:
        consumer.subscribe([imp, fb])
        tp = TopicPartition(imp, 0)
        seen = {imp: 0, fb: 0}
        paused_at: int | None = None
        polls_paused = 0
        resumed = False
        deadline = time.monotonic() + 30
        while seen != ends:
            assert time.monotonic() < deadline, f"stuck at {seen} of {ends}"
            unpark_resumed(consumer)
            for part, records in consumer.poll(timeout_ms=200).items():
                seen[part.topic] += len(records)
            if paused_at is None and seen[imp] >= 100:
                consumer.pause(tp)
                paused_at = seen[imp]
            elif paused_at is not None and not resumed:
                polls_paused += 1
                if polls_paused == 5:  # the other partition's records were drained meanwhile
                    assert seen[imp] == paused_at
                    consumer.resume(tp)
                    resumed = True
        assert resumed and seen == ends
    finally:
        consumer.close(autocommit=False)
