"""Which errors end `evald run` with status 2 instead of being retried (evald.daemon.fatal)."""

from __future__ import annotations

import pytest
from kafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaTimeoutError,
    NotCoordinatorError,
    ProducerFencedError,
    SaslAuthenticationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    UnsupportedCodecError,
)

from evald.daemon.fatal import unrecoverable


@pytest.mark.parametrize(
    ("exc", "says"),
    [
        (UnsupportedCodecError("Libraries for lz4 compression codec not found"), "pip install"),
        (TopicAuthorizationFailedError({"evald.results"}), "grant evald's principal"),
        (GroupAuthorizationFailedError(), "Read on its consumer group"),
        (TransactionalIdAuthorizationFailedError(), "transactional id"),
        (SaslAuthenticationFailedError(), "kafka.sasl_"),
    ],
)
def test_errors_no_retry_can_fix_come_with_what_to_do(exc: Exception, says: str) -> None:
    advice = unrecoverable(exc)
    assert advice is not None and says in advice


@pytest.mark.parametrize(
    "exc",
    [
        KafkaConnectionError("no bootstrap server answered"),
        KafkaConnectionError("reset"),
        KafkaTimeoutError("flush"),
        NotCoordinatorError(),
        # a zombie fenced by its successor: a new session (new producer epoch) is the cure
        ProducerFencedError(),
        TimeoutError("restore"),
        OSError("network unreachable"),
    ],
)
def test_transient_errors_are_left_to_the_retry_loop(exc: Exception) -> None:
    assert unrecoverable(exc) is None


def test_the_cause_of_a_wrapping_error_counts() -> None:
    try:
        try:
            raise UnsupportedCodecError("Libraries for zstd compression codec not found")
        except UnsupportedCodecError as inner:
            raise RuntimeError("fetch failed") from inner
    except RuntimeError as outer:
        assert unrecoverable(outer) is not None
