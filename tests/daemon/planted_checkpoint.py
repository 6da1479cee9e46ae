"""A checkpoint planted for partition 0 as if an earlier evald had published its statistics
shares up to an hour ago: what the tests of a statistics topic lost while evald was stopped
start from (comparisons: test_kafka_statistics.py; interleaving: test_kafka_interleaving.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import names

from evald.daemon.main.comparisons import statistics_topic
from evald.daemon.settings import TopicSettings

#: the share windows' width (ms) the planted checkpoint names
WIDTH = 300_000


def plant(
    broker: Broker,
    kafka_tools: KafkaTools,
    unique: str,
    statistics: Callable[[int], dict[str, Any]],
) -> tuple[str, int]:
    """Create the inputs, a compacted statistics topic and, on the checkpoint topic, partition
    0's checkpoint naming that topic's id, with ``statistics(final)`` as its statistics field;
    the group's offsets point past it. Returns the statistics topic and ``final``, the mark
    (an hour ago, on a window boundary) up to which its shares were published."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic
    from kafka.structs import OffsetAndMetadata

    from evald.daemon.main.checkpoint import Checkpoint

    topics = names(unique)
    stats = statistics_topic(TopicSettings(**topics))
    checkpoints = f"{topics['results']}.checkpoints"
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1, checkpoints: 1})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic(stats, 1, 1, topic_configs={"cleanup.policy": "compact"})])
        first_id = wait_until(
            lambda: admin.describe_topics([stats])[0].get("topic_id"), 30, "the topic's id"
        )
    finally:
        admin.close()
    final = (int(time.time() * 1000) // WIDTH - 12) * WIDTH
    checkpoint = Checkpoint.of(
        partition=0,
        watermark=final,
        committed={"impression": 0, "feedback": 0},
        consumed={"impression": 0, "feedback": 0},
        extra={"topic_ids": {stats: str(first_id)}},
        statistics=statistics(final),
    )
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    at = producer.send(checkpoints, key=b"0", value=checkpoint.encode(), partition=0)
    offset = at.get(timeout=30).offset
    producer.close(timeout=5)
    group = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=f"g-{unique}")
    tps = [TopicPartition(t, 0) for t in (checkpoints, topics["impressions"], topics["feedback"])]
    group.assign(tps)
    group.commit(
        {tp: OffsetAndMetadata(offset + 1 if tp.topic == checkpoints else 0, "", -1) for tp in tps}
    )
    group.close()
    return stats, final
