"""A session that owns no partition is ready only as a standby of a group with more members
than partitions (real broker: the group's size comes from DescribeGroups)."""

from __future__ import annotations

import pytest
from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import make_settings, names, running

pytestmark = pytest.mark.kafka


def test_the_member_left_without_a_partition_is_a_ready_standby(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    with (
        running(make_settings(broker.bootstrap, unique, "a")) as a,
        running(make_settings(broker.bootstrap, unique, "b")) as b,
    ):
        wait_until(lambda: a.ready()[0] and b.ready()[0], 120, "both instances ready")
        owners = [d for d in (a, b) if d.inputs.parts]
        assert len(owners) == 1, "one partition, one owner"
        assert (a if owners[0] is b else b).health.standby
