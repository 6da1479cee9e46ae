"""Declared time formats: every unit read exactly, wrong ones refused in words."""

from __future__ import annotations

import pytest

from evald.mapping.times import TimeValueError, to_millis

MS = 1_714_564_800_250  # 2024-05-01T12:00:00.250Z


@pytest.mark.parametrize(
    ("value", "fmt"),
    [
        ("2024-05-01T12:00:00.250Z", "rfc3339"),
        ("2024-05-01T14:00:00.250+02:00", "rfc3339"),
        (1_714_564_800.25, "epoch_s"),
        (MS, "epoch_ms"),
        (MS * 1_000 + 999, "epoch_us"),
        (MS * 1_000_000 + 999_999, "epoch_ns"),
    ],
)
def test_each_format_reads_the_same_instant(value: object, fmt: str) -> None:
    assert to_millis(value, fmt) == MS


def test_whole_and_fractional_epoch_seconds() -> None:
    assert to_millis(1_714_564_800, "epoch_s") == 1_714_564_800_000
    assert to_millis(1_714_564_800.123, "epoch_s") == 1_714_564_800_123


@pytest.mark.parametrize(
    ("value", "fmt", "words"),
    [
        ("2024-05-01T12:00:00", "rfc3339", "no UTC offset"),
        ("yesterday", "rfc3339", "not RFC 3339 text"),
        (MS, "rfc3339", "got a number"),
        ("1714564800", "epoch_s", "expected a number of epoch seconds, got text"),
        (True, "epoch_ms", "got a boolean"),
        (None, "epoch_ms", "got null"),
    ],
)
def test_unreadable_values_are_explained_in_words(value: object, fmt: str, words: str) -> None:
    with pytest.raises(TimeValueError, match=words) as caught:
        to_millis(value, fmt)
    assert not caught.value.implausible
    assert "validation" not in str(caught.value).lower()


def test_milliseconds_declared_as_seconds_fall_outside_the_calendar_not_rescaled() -> None:
    with pytest.raises(TimeValueError, match="another unit") as caught:
        to_millis(MS, "epoch_s")
    assert caught.value.implausible
