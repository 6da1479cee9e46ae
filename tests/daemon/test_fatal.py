"""Which errors end `evald run` with status 2 instead of being retried (evald.daemon.fatal)."""

from __future__ import annotations

import pytest
from kafka.errors import (
    GroupAuthorizationFailedError,
    InvalidTransactionTimeoutError,
    KafkaConnectionError,
    KafkaError,
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
        (InvalidTransactionTimeoutError(), "transaction.max.timeout.ms"),
        # as kafka-python's producer reports it: the error's name inside a plain KafkaError
        (
            KafkaError(
                "Unexpected error in InitProducerIdResponse: [Error 50] "
                "InvalidTransactionTimeoutError"
            ),
            "kafka.transaction_timeout_ms",
        ),
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


def test_an_error_carried_in_a_wrapping_errors_arguments_counts() -> None:
    """kafka-python reports a failed transactional request on the next send as a plain
    KafkaError whose second argument is the broker's error; it used to be retried forever."""
    from kafka.errors import KafkaError

    wrapped = KafkaError(
        "Cannot perform send because at least one previous transactional or idempotent "
        "request has failed with errors.",
        TopicAuthorizationFailedError({"evald.results"}),
    )
    advice = unrecoverable(wrapped)
    assert advice is not None and "TopicAuthorizationFailedError" in advice
    # the daemon words a denial itself (permissions.py): it gets the broker's error
    seen: list[Exception] = []
    assert unrecoverable(wrapped, lambda error: seen.append(error) or "grant it") == "grant it"
    assert [type(error) for error in seen] == [TopicAuthorizationFailedError]
    assert unrecoverable(KafkaError("transient", KafkaTimeoutError("x"))) is None
