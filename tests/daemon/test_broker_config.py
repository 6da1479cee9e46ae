"""A limit the broker enforces, read from DescribeConfigs one way by every reader."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import ClusterAuthorizationFailedError, UnsupportedVersionError

from evald.daemon.broker_config import described_int
from evald.daemon.connect_check import _broker_max_transaction_ms
from evald.daemon.dead_letters import DEFAULT_MAX_MESSAGE_BYTES, max_message_bytes
from evald.daemon.topics import topic_configs

CLUSTER = {"brokers": [{"node_id": 1}]}


class Admin:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def describe_configs(self, resources: Any, config_filter: str) -> object:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ({"broker": {"1": {"transaction.max.timeout.ms": {"value": "900000"}}}}, 900_000),
        ({"broker": {"1": {"transaction.max.timeout.ms": "60000"}}}, 60_000),
        ({"broker": {"1": {}}}, None),  # tansu: no configs
        ({"broker": {"1": {"transaction.max.timeout.ms": "soon"}}}, None),
        (ClusterAuthorizationFailedError(), None),
        (UnsupportedVersionError(), None),  # an old broker
        (ValueError("broker id"), None),
    ],
)
def test_what_the_broker_does_not_say_is_none(answer: object, value: int | None) -> None:
    assert described_int(Admin(answer), "broker", "1", "transaction.max.timeout.ms") == value
    assert _broker_max_transaction_ms(Admin(answer), CLUSTER) == value


def test_a_bug_is_raised_by_every_reader_not_taken_for_the_brokers_default() -> None:
    """Before, the DLQ limit turned any exception into Kafka's default (and check-config's
    transaction timeout raised it): a bug looked like an answer in one of the two."""
    bug = Admin(AttributeError("describe_configs changed shape"))
    with pytest.raises(AttributeError):
        max_message_bytes(bug, "dlq")
    with pytest.raises(AttributeError):
        _broker_max_transaction_ms(bug, CLUSTER)
    assert max_message_bytes(Admin(UnsupportedVersionError()), "dlq") == DEFAULT_MAX_MESSAGE_BYTES


@pytest.mark.parametrize("failure", [UnsupportedVersionError(), ValueError("broker id")])
def test_the_statistics_topics_policy_reader_takes_the_same_failures_as_unknown(
    failure: Exception,
) -> None:
    """``topics.topic_configs`` (the statistics topic's cleanup policy) read DescribeConfigs on
    its own and let a ValueError through, which failed the session, where the limits' reader
    took it as "the broker does not say"."""
    assert topic_configs(Admin(failure), "stats") is None  # type: ignore[arg-type]
    answer = {"topic": {"stats": {"cleanup.policy": {"value": "compact"}, "x": {"value": None}}}}
    assert topic_configs(Admin(answer), "stats") == {"cleanup.policy": "compact"}  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        topic_configs(Admin(AttributeError("a bug")), "stats")  # type: ignore[arg-type]
