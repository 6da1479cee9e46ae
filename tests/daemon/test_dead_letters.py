"""Dead letters fitted to the DLQ topic's size limit (pure: no broker)."""

from __future__ import annotations

import hashlib
from collections import namedtuple
from typing import Any

import pytest
from kafka.errors import (
    IllegalStateError,
    InvalidProducerEpochError,
    KafkaError,
    MessageSizeTooLargeError,
    ProducerFencedError,
)

from evald.daemon.dead_letters import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DeadLetters,
    build_letter,
    max_message_bytes,
    record_size,
)
from evald.daemon.fatal import Fatal
from evald.daemon.record_limits import DLQ_NEED
from evald.decode import Rejection

HEADERS = [("evald-reason", b"too_large"), ("evald-source-offset", b"17")]


def test_a_letter_that_fits_is_the_original() -> None:
    letter = build_letter(b"k", b"v" * 1000, HEADERS, DEFAULT_MAX_MESSAGE_BYTES)
    assert not letter.truncated
    assert (letter.key, letter.value, letter.headers) == (b"k", b"v" * 1000, HEADERS)


@pytest.mark.parametrize("size", [1_048_400, 1_048_588, 5_000_000])
@pytest.mark.parametrize("limit", [DEFAULT_MAX_MESSAGE_BYTES, 200_000, 4096])
def test_a_letter_too_large_is_truncated_to_fit_with_what_identifies_the_original(
    size: int, limit: int
) -> None:
    value = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    letter = build_letter(b"k" * 5000, value, HEADERS, limit)
    assert letter.truncated
    assert record_size(letter.key, letter.value, letter.headers) <= limit
    headers = dict(letter.headers)
    assert headers["evald-reason"] == b"too_large"  # the existing headers are kept
    assert headers["evald-source-offset"] == b"17"
    assert headers["evald-original-size"] == str(size).encode()
    assert headers["evald-original-sha256"] == hashlib.sha256(value).hexdigest().encode()
    assert headers["evald-truncated"] == str(len(letter.value)).encode()
    assert headers["evald-original-key-size"] == b"5000"
    assert value.startswith(letter.value) and len(letter.value) > limit // 2
    assert letter.key == b"k" * 1024


def test_a_minimal_letter_keeps_only_the_headers() -> None:
    letter = build_letter(b"k", b"small", HEADERS, DEFAULT_MAX_MESSAGE_BYTES, minimal=True)
    assert letter.value == b""
    assert dict(letter.headers)["evald-truncated"] == b"0"
    assert dict(letter.headers)["evald-original-size"] == b"5"


class _Admin:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def describe_configs(self, resources: object, config_filter: str) -> object:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "limit"),
    [
        ({"topic": {"dlq": {"max.message.bytes": {"value": "5242880"}}}}, 5_242_880),
        ({"topic": {"dlq": {"max.message.bytes": "2000000"}}}, 2_000_000),
        ({"topic": {"dlq": {}}}, DEFAULT_MAX_MESSAGE_BYTES),  # tansu: no configs
        (KafkaError("no DescribeConfigs"), DEFAULT_MAX_MESSAGE_BYTES),
    ],
)
def test_the_dlq_limit_is_the_topics_or_kafkas_default(answer: object, limit: int) -> None:
    assert max_message_bytes(_Admin(answer), "dlq") == limit


class FakeFuture:
    def __init__(self, exc: Exception | None) -> None:
        self.exception = exc

    def failed(self) -> bool:
        return self.exception is not None


class FakeProducer:
    """Records what is sent; each send's future fails with the next of ``failures``."""

    def __init__(self, *failures: Exception | None) -> None:
        self.failures = list(failures)
        self.sent: list[tuple[bytes, list[tuple[str, bytes]]]] = []

    def send(self, topic: str, *, key: bytes | None, value: bytes, headers: Any) -> FakeFuture:
        self.sent.append((value, headers))
        return FakeFuture(self.failures.pop(0) if self.failures else None)


RECORD = namedtuple("RECORD", "topic partition offset key value")("imp", 1, 7, b"k", b"x" * 50)
REJECTION = Rejection("malformed_json", "bad", b"", "impression")


def test_a_letter_the_broker_refuses_is_written_headers_only_and_a_second_refusal_exits_2() -> None:
    letters = DeadLetters("dlq")
    producer = FakeProducer(MessageSizeTooLargeError("too large"), MessageSizeTooLargeError("no"))
    letters.send(producer, REJECTION, RECORD, "impression")  # type: ignore[arg-type]
    with pytest.raises(KafkaError, match="writing it as headers only"):
        letters.check()
    letters.forget()  # the transaction is lost; the next session reads the record again
    letters.send(producer, REJECTION, RECORD, "impression")  # type: ignore[arg-type]
    assert producer.sent[0][0] == RECORD.value and producer.sent[1][0] == b""
    with pytest.raises(Fatal) as refused:
        letters.check()
    assert refused.value.status == 2 and "refused even a headers-only dead letter" in str(
        refused.value
    )
    assert f"at least {DLQ_NEED:,} bytes" in str(refused.value)  # what evald checks at start


@pytest.mark.parametrize("exc", [ProducerFencedError(), InvalidProducerEpochError()])
def test_a_fenced_producer_is_not_the_dlq_refusing_the_letter(exc: Exception) -> None:
    """The commit fails with the fencing error itself; the letter keeps its value."""
    letters = DeadLetters("dlq")
    producer = FakeProducer(exc, exc)
    for _ in range(2):
        letters.send(producer, REJECTION, RECORD, "impression")  # type: ignore[arg-type]
        letters.check()
        assert letters.committed() == ["malformed_json"]
    assert [value for value, _ in producer.sent] == [RECORD.value, RECORD.value]


class RaisingProducer:
    """``send`` raises ``exc`` before anything leaves, as kafka-python's own checks do."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.calls = 0

    def send(self, topic: str, *, key: bytes | None, value: bytes, headers: Any) -> FakeFuture:
        self.calls += 1
        raise self.exc


def test_a_producer_whose_transaction_is_gone_fails_the_session_not_the_dlq() -> None:
    """After a broker restart kafka-python bumps the producer's epoch and drops the open
    transaction: ``send`` raises IllegalStateError ("Cannot call send in state READY"). That
    is the session's to retry (a new one restores), not the DLQ refusing the letter: it
    stopped the daemon with exit 2 in the broker-restart chaos test."""
    letters = DeadLetters("dlq")
    producer = RaisingProducer(IllegalStateError("Cannot call send in state READY"))
    with pytest.raises(IllegalStateError):
        letters.send(producer, REJECTION, RECORD, "impression")  # type: ignore[arg-type]
    assert producer.calls == 1  # not retried as headers only


def test_a_letter_too_large_for_the_producer_is_sent_again_headers_only() -> None:
    letters = DeadLetters("dlq")
    producer = RaisingProducer(MessageSizeTooLargeError("larger than max_request_size"))
    with pytest.raises(Fatal):
        letters.send(producer, REJECTION, RECORD, "impression")  # type: ignore[arg-type]
    assert producer.calls == 2  # the letter, then the headers only


def test_a_result_over_the_results_topics_limit_becomes_a_letter_of_it_whole() -> None:
    letters = DeadLetters("dlq")
    letters.results_limit = 4096
    producer = FakeProducer()
    small, large = b'{"request_id":"r"}', b'{"request_id":"r","labels":"' + b"v" * 5000 + b'"}'
    assert not letters.divert_result(producer, "res", 2, b"r", small)  # type: ignore[arg-type]
    assert producer.sent == []
    assert letters.divert_result(producer, "res", 2, b"r", large)  # type: ignore[arg-type]
    ((value, headers),) = producer.sent
    assert value == large
    assert dict(headers)["evald-reason"] == b"result_too_large"
    assert dict(headers)["evald-source-partition"] == b"2"
    assert letters.committed() == ["result_too_large"]  # counted when its transaction commits


def test_no_producer_batch_is_larger_than_an_output_topic_accepts() -> None:
    from evald.daemon.topics import OutputLimits

    assert OutputLimits(DEFAULT_MAX_MESSAGE_BYTES, 4096, 2**20).batch_bytes(512 * 1024) < 4096
    assert OutputLimits(*[DEFAULT_MAX_MESSAGE_BYTES] * 3).batch_bytes(512 * 1024) == 512 * 1024
