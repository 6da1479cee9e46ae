"""Which Kafka errors no retry can fix, and what the operator should do about each.

Every other error ends the session and is retried with backoff (the state is in Kafka); these
would fail the same way forever, so `evald run` exits 2 with the advice instead of looping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from kafka.errors import (
    AuthorizationError,
    InvalidTransactionTimeoutError,
    KafkaError,
    SaslAuthenticationFailedError,
    UnsupportedCodecError,
)

__all__ = ["Fatal", "causes", "unrecoverable"]


class Fatal(Exception):
    """Ends the daemon with an exit status (e.g. topics not co-partitioned: 2)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the errors it was raised from, and errors carried in its arguments: kafka-python
    wraps the error of a failed transactional request in a plain ``KafkaError`` argument
    ("Cannot perform send because at least one previous transactional or idempotent request
    has failed with errors.", TopicAuthorizationFailedError(...))."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        cause = todo.pop(0)
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        yield cause
        todo.extend(arg for arg in cause.args if isinstance(arg, BaseException))
        for linked in (cause.__cause__, cause.__context__):
            if linked is not None:
                todo.append(linked)


def unrecoverable(
    exc: BaseException, denied: Callable[[AuthorizationError], str] | None = None
) -> str | None:
    """What to do about ``exc`` (or an error in :func:`causes`) if retrying cannot help, else
    None (a transient error). ``denied`` words an authorization failure (the resource, the
    operation and the grant: permissions.py); without it the advice lists every grant."""
    for cause in causes(exc):
        if denied is not None and isinstance(cause, AuthorizationError):
            return denied(cause)
        advice = _advice(cause)
        if advice is not None:
            return advice
    return None


def _advice(exc: BaseException) -> str | None:
    name = type(exc).__name__
    if isinstance(exc, UnsupportedCodecError):
        return (
            f"cannot decompress a record batch ({exc}): install the codec packages evald "
            "depends on (`pip install evald` installs lz4, python-snappy and zstandard; "
            "`pip install 'kafka-python[lz4,snappy,zstd]'` for a custom environment)"
        )
    if isinstance(exc, AuthorizationError):
        return (
            f"the broker denied an operation ({name}: {exc}): grant evald's principal Read on "
            "both input topics, Describe, Read and Write on the results and checkpoint "
            "topics, Describe and Write on the dead-letter topic, Read on its consumer group "
            "and Write and Describe on its transactional id (evald/<group>/<instance>); see "
            "docs/daemon.md"
        )
    if _is(exc, InvalidTransactionTimeoutError):
        return (
            "the broker refuses evald's transaction timeout (INVALID_TRANSACTION_TIMEOUT): "
            "kafka.transaction_timeout_ms is above the brokers' transaction.max.timeout.ms "
            "(900000, 15 minutes, unless changed); lower kafka.transaction_timeout_ms to at "
            "most that (--set kafka.transaction_timeout_ms=..., "
            "EVALD_KAFKA__TRANSACTION_TIMEOUT_MS), or raise transaction.max.timeout.ms on "
            "every broker"
        )
    if isinstance(exc, SaslAuthenticationFailedError):
        return f"the broker rejected evald's credentials ({exc}): check the kafka.sasl_* settings"
    return None


def _is(exc: BaseException, error: type[KafkaError]) -> bool:
    """``exc`` is ``error``, or kafka-python's plain ``KafkaError`` naming it: the producer
    reports an unexpected InitProducerId answer as ``KafkaError("Unexpected error in
    InitProducerIdResponse: [Error 50] InvalidTransactionTimeoutError")``."""
    return isinstance(exc, error) or (type(exc) is KafkaError and error.__name__ in str(exc))
