"""A limit the broker enforces, read from DescribeConfigs one way by every reader."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import ClusterAuthorizationFailedError, UnsupportedVersionError

from evald.daemon.broker_config import described_int
from evald.daemon.connect_check import _broker_max_transaction_ms
from evald.daemon.dead_letters import DEFAULT_MAX_MESSAGE_BYTES, max_message_bytes

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
