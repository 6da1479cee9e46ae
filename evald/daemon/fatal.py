"""Which Kafka errors no retry can fix, and what the operator should do about each.

Every other error ends the session and is retried with backoff (the state is in Kafka); these
would fail the same way forever, so `evald run` exits 2 with the advice instead of looping.
"""

from __future__ import annotations

from kafka.errors import (
    AuthorizationError,
    SaslAuthenticationFailedError,
    UnsupportedCodecError,
)

__all__ = ["Fatal", "unrecoverable"]


class Fatal(Exception):
    """Ends the daemon with an exit status (e.g. topics not co-partitioned: 2)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def unrecoverable(exc: BaseException) -> str | None:
    """What to do about ``exc`` (or the error it was raised from) if retrying cannot help,
    else None (a transient error)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        advice = _advice(cause)
        if advice is not None:
            return advice
        cause = cause.__cause__ or cause.__context__
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
            "both input topics, Write and Describe on the results, checkpoint and dead-letter "
            "topics, Read on its consumer group and Write on its transactional id "
            "(evald/<group>/<instance>); see docs/daemon.md"
        )
    if isinstance(exc, SaslAuthenticationFailedError):
        return f"the broker rejected evald's credentials ({exc}): check the kafka.sasl_* settings"
    return None
