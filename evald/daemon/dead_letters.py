"""Dead letters that always fit the DLQ topic.

A record rejected as ``too_large`` can be as large as the input topic allows, and its dead
letter (the original bytes plus evald's headers) is then larger than the DLQ topic, or the
producer, accepts. Such a letter is written truncated: its value is cut so that the whole
record fits, and headers keep what is needed to find and verify the original (its size, a
SHA-256 of it, and the source coordinates every letter carries). A letter that the broker
rejects all the same is written once more as headers only (``minimal``), see docs/design.md.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer
from kafka.errors import (
    InvalidProducerEpochError,
    KafkaError,
    MessageSizeTooLargeError,
    ProducerFencedError,
)
from kafka.record.default_records import DefaultRecordBatchBuilder

from evald.daemon.broker_config import described_int
from evald.daemon.fatal import Fatal
from evald.decode import Rejection

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "RESULT_TOO_LARGE",
    "DeadLetters",
    "Letter",
    "build_letter",
    "max_message_bytes",
]

log = logging.getLogger("evald.daemon")

#: Kafka's default ``message.max.bytes`` (broker) and ``max.message.bytes`` (topic)
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
#: room left under the limit for what the size estimate does not see (varint widths)
SLACK_BYTES = 64
#: the longest key kept on a truncated letter (keys are request ids)
MAX_TRUNCATED_KEY = 1024
#: more than one record, in a batch of its own, adds to its key and value (a 61-byte batch
#: header, the record's varints) plus the slack: a result this much under the limit fits
RECORD_OVERHEAD = 192
#: the reason of a result record the results topic would refuse (DeadLetters.divert_result)
RESULT_TOO_LARGE = "result_too_large"

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Letter:
    """One dead letter ready for ``producer.send``."""

    key: bytes | None
    value: bytes
    headers: Headers
    truncated: bool


def record_size(key: bytes | None, value: bytes, headers: Headers) -> int:
    """Bytes one record takes in a batch of its own, as the producer counts them."""
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers))


def build_letter(
    key: bytes | None, value: bytes, headers: Headers, limit: int, *, minimal: bool = False
) -> Letter:
    """The letter for ``value`` with ``headers``, truncated to fit ``limit`` bytes if needed.

    A truncated (or ``minimal``: value dropped) letter gets ``evald-original-size`` (bytes of
    the original value), ``evald-original-sha256`` (hex) and ``evald-truncated`` (bytes kept);
    a key longer than 1 KiB is cut too, with ``evald-original-key-size``.
    """
    if not minimal and record_size(key, value, headers) + SLACK_BYTES <= limit:
        return Letter(key, value, headers, truncated=False)
    extra: Headers = [
        ("evald-original-size", str(len(value)).encode()),
        ("evald-original-sha256", hashlib.sha256(value).hexdigest().encode()),
    ]
    if key is not None and len(key) > MAX_TRUNCATED_KEY:
        extra.append(("evald-original-key-size", str(len(key)).encode()))
        key = key[:MAX_TRUNCATED_KEY]
    # the kept length is written last; its digits are counted at their widest
    fixed = record_size(key, b"", [*headers, *extra, ("evald-truncated", b"0" * 10)])
    keep = 0 if minimal else max(0, min(len(value), limit - SLACK_BYTES - fixed))
    extra.append(("evald-truncated", str(keep).encode()))
    return Letter(key, value[:keep], [*headers, *extra], truncated=True)


#: where a record came from: (topic, partition, offset); for a result that did not fit the
#: results topic, (results topic, partition, request id)
Source = tuple[str, int, int | str]

#: a failed send that says nothing about the letter: the producer itself was fenced (a newer
#: incarnation, or the broker bumped its epoch); the commit fails with it and the session retries
PRODUCER_ERRORS = (ProducerFencedError, InvalidProducerEpochError)


class DeadLetters:
    """The dead letters of the open transaction, and what the DLQ topic refused.

    A letter the producer refuses before it leaves (too large for it) is sent again at once as
    headers only; any other error of ``send`` (the producer's transaction gone after a broker
    restart bumped its epoch, a metadata timeout) is the session's to retry. One
    the broker refuses (seen by :meth:`check` after a flush) fails the transaction, and the
    next session, re-reading the record, writes it as headers only. A headers-only letter
    refused too stops the daemon (exit 2): no retry can fix that.
    """

    def __init__(self, topic: str) -> None:
        self.topic = topic
        #: the DLQ topic's ``max.message.bytes`` (see :func:`max_message_bytes`)
        self.limit = DEFAULT_MAX_MESSAGE_BYTES
        #: the results topic's: a larger result is dead-lettered (:meth:`divert_result`)
        self.results_limit = DEFAULT_MAX_MESSAGE_BYTES
        #: the reasons of the letters sent in the open transaction (counted once it commits)
        self._reasons: list[str] = []
        #: futures of the dead letters sent in the open transaction, with their source
        self._sent: list[tuple[Any, Source]] = []
        #: sources whose dead letter the broker refused: written as headers only from now on
        #: (kept across sessions, so the re-read record does not fail the same way again)
        self._minimal: set[Source] = set()

    def send(self, producer: KafkaProducer, rejection: Rejection, record: Any, kind: str) -> None:
        """Send a rejected record's dead letter, truncated if it would not fit the DLQ topic
        (``producer`` has the transaction open)."""
        reason, detail = rejection.reason, rejection.detail
        source = (record.topic, record.partition, record.offset)
        value = record.value if record.value is not None else b""
        headers = [
            ("evald-reason", reason.encode()),
            ("evald-detail", detail.encode()[:4096]),
            ("evald-source-topic", record.topic.encode()),
            ("evald-source-partition", str(record.partition).encode()),
            ("evald-source-offset", str(record.offset).encode()),
            ("evald-kind", kind.encode()),
        ]
        self._post(producer, source, record.key, value, headers, reason)

    def divert_result(
        self, producer: KafkaProducer, topic: str, partition: int, key: bytes, value: bytes
    ) -> bool:
        """Dead-letter a result record larger than the results topic accepts (True), else
        nothing (False). The broker would refuse it and with it the transaction, and the
        session replaying the same input would fail on it again, forever: the letter carries
        the whole result (``evald-reason: result_too_large``), in the same transaction."""
        limit = self.results_limit
        if len(key) + len(value) + RECORD_OVERHEAD <= limit:
            return False
        size = record_size(key, value, [])
        if size + SLACK_BYTES <= limit:
            return False
        detail = f"a result record of {size} bytes; {topic} accepts {limit} (max.message.bytes)"
        headers = [
            ("evald-reason", RESULT_TOO_LARGE.encode()),
            ("evald-detail", detail.encode()),
            ("evald-source-topic", topic.encode()),
            ("evald-source-partition", str(partition).encode()),
            ("evald-kind", b"result"),
        ]
        request_id = key.decode(errors="replace")
        log.warning(
            "the result of request %.200r (partition %d) is %d bytes, over %s's "
            "max.message.bytes %d: dead-lettered to %s (%s); raise the topic's "
            "max.message.bytes, or lower limits.max_labels and limits.max_string_length",
            request_id,
            partition,
            size,
            topic,
            limit,
            self.topic,
            RESULT_TOO_LARGE,
        )
        self._post(producer, (topic, partition, request_id), key, value, headers, RESULT_TOO_LARGE)
        return True

    def _post(
        self,
        producer: KafkaProducer,
        source: Source,
        key: bytes | None,
        value: bytes,
        headers: Headers,
        reason: str,
    ) -> None:
        """Send one letter, fitted to the DLQ topic (headers only once it was refused)."""
        minimal = source in self._minimal
        letter = build_letter(key, value, headers, self.limit, minimal=minimal)
        try:
            future = producer.send(
                self.topic, key=letter.key, value=letter.value, headers=letter.headers
            )
        except MessageSizeTooLargeError as exc:
            if minimal:
                raise self._refused(source, exc) from exc
            # refused before it left (the producer's own size check): headers only, at once
            self._minimal.add(source)
            self._post(producer, source, key, value, headers, reason)
            return
        if letter.truncated:
            log.warning(
                "dead letter for %s/%s@%s truncated to %d of %d bytes (DLQ limit %d)",
                *source,
                len(letter.value),
                len(value),
                self.limit,
            )
        self._sent.append((future, source))
        self._reasons.append(reason)

    def check(self) -> None:
        """After a flush: a dead letter the broker refused for good is written as headers
        only by the next session (this transaction is lost: the failed batch aborts it)."""
        for future, source in self._sent:
            exc = future.exception if future.failed() else None
            if exc is None or getattr(exc, "retriable", False) or isinstance(exc, PRODUCER_ERRORS):
                continue
            if source in self._minimal:
                raise self._refused(source, exc)
            self._minimal.add(source)
            raise KafkaError(
                f"the DLQ topic refused the dead letter of {source[0]}/{source[1]}@{source[2]} "
                f"({type(exc).__name__}); writing it as headers only"
            )

    def committed(self) -> list[str]:
        """The transaction committed: the reasons of its letters (to count), then forget them."""
        reasons = self._reasons
        self.forget()
        return reasons

    def forget(self) -> None:
        """The transaction is gone (committed, aborted or abandoned)."""
        self._reasons = []
        self._sent = []

    def _refused(self, source: Source, exc: Exception) -> Fatal:
        from evald.daemon.record_limits import DLQ_NEED  # it sizes the letters of this module

        topic = self.topic
        return Fatal(
            2,
            f"evald run: stopping: the DLQ topic {topic} refused even a headers-only dead letter "
            f"(for {source[0]}/{source[1]}@{source[2]}: {type(exc).__name__}: {exc}); no retry "
            f"can fix that. Check that {topic} exists, is writable by evald and that its "
            f"max.message.bytes (and the broker's message.max.bytes) are at least {DLQ_NEED:,} "
            "bytes (the largest headers-only letter), then restart evald",
        )


def max_message_bytes(admin: Any, topic: str) -> int:
    """The topic's ``max.message.bytes``; Kafka's default when the broker does not say (tansu
    answers with no configs) or the topic does not exist yet."""
    limit = described_int(admin, "topic", topic, "max.message.bytes")
    return DEFAULT_MAX_MESSAGE_BYTES if limit is None else limit
