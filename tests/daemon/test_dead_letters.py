"""Dead letters fitted to the DLQ topic's size limit (pure: no broker)."""

from __future__ import annotations

import hashlib

import pytest

from evald.daemon.dead_letters import (
    DEFAULT_MAX_MESSAGE_BYTES,
    build_letter,
    max_message_bytes,
    record_size,
)

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
        (RuntimeError("no DescribeConfigs"), DEFAULT_MAX_MESSAGE_BYTES),
    ],
)
def test_the_dlq_limit_is_the_topics_or_kafkas_default(answer: object, limit: int) -> None:
    assert max_message_bytes(_Admin(answer), "dlq") == limit
