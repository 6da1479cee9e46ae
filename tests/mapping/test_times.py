"""Declared time formats: every unit read exactly, wrong ones refused in words."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.events import format_timestamp, parse_timestamp
from evald.mapping.times import (
    TimeValueError,
    check_formats,
    chosen,
    millis_reader,
    read_time,
    to_millis,
)

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


@settings(max_examples=400, derandomize=True)
@given(
    st.integers(0, 253_402_300_799_999),
    st.sampled_from(["", ".", ".0", ".00", ".000000"]),
    st.sampled_from("TtZz"),
)
def test_the_fast_rfc3339_path_agrees_with_the_general_parser(ms: int, frac: str, t: str) -> None:
    """The canonical UTC spelling is read without datetime; it must give the same instant."""
    text = format_timestamp(ms)  # 2024-05-01T12:00:00.250Z
    head, millis = text[:19], text[20:23]
    spelt = head + ("" if frac == "" else frac[:1] + millis + frac[2:]) + "Z"
    spelt = spelt.replace("T", t if t in "Tt" else "T").replace("Z", t if t in "Zz" else "Z")
    assert to_millis(spelt, "rfc3339") == parse_timestamp(spelt)


@pytest.mark.parametrize(
    "text",
    ["2024-02-30T00:00:00Z", "2024-05-01T24:00:00Z", "2024-05-01T12:60:00Z",
     "2024-05-01T12:00:60Z", "1969-12-31T23:59:59Z", "٢٠٢٤-05-01T12:00:00Z",
     "2024-05-01T12:00:00.٢٥٠Z", "2024-05-01 12:00:00Z", "2024-05-01T12:00:00.2500",
     "2024-05-01T12-00:00Z", "2024-05-01T12:00:0xZ"],
)  # fmt: skip
def test_what_the_fast_path_refuses_the_general_parser_judges(text: str) -> None:
    try:
        expected: int | None = parse_timestamp(text)
    except ValueError:
        expected = None
    if expected is None:
        with pytest.raises(TimeValueError):
            to_millis(text, "rfc3339")
    else:
        assert to_millis(text, "rfc3339") == expected


@pytest.mark.parametrize("value", [1e306, -1e306, 1.7e308])
def test_a_finite_number_scaled_past_the_float_range_is_implausible_not_a_crash(
    value: float,
) -> None:
    """1e306 seconds is infinite milliseconds: refused in words like any far time."""
    with pytest.raises(TimeValueError, match="another unit") as caught:
        to_millis(value, "epoch_s")
    assert caught.value.implausible
    assert millis_reader("epoch_s")(value) is None


@settings(max_examples=600, derandomize=True)
@given(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=30)
    | st.builds(format_timestamp, st.integers(0, 253_402_300_799_999))
    | st.lists(st.integers(), max_size=2),
    st.sampled_from(["rfc3339", "epoch_s", "epoch_ms", "epoch_us", "epoch_ns"]),
)
def test_the_fast_path_reader_agrees_with_to_millis(value: object, fmt: str) -> None:
    try:
        expected: int | None = to_millis(value, fmt)
    except TimeValueError:
        expected = None
    assert millis_reader(fmt)(value) == expected


def test_two_declared_formats_read_each_value_as_its_json_type_says() -> None:
    both = ("rfc3339", "epoch_ms")
    assert read_time("2024-05-01T12:00:00.250Z", both) == MS
    assert read_time("2024-05-01T14:00:00.250+0200", both) == MS  # +HHMM, no colon
    assert read_time(MS, both) == MS
    assert chosen("x", both) == "rfc3339" and chosen(1, both) == chosen(True, both) == "epoch_ms"
    with pytest.raises(TimeValueError, match="RFC 3339 text or a number of epoch milliseconds"):
        read_time(True, both)
    with pytest.raises(TimeValueError, match="got text"):
        read_time("2024-05-01T12:00:00Z", ("epoch_ms",))  # one declared format restricts


@pytest.mark.parametrize(
    ("formats", "ok"),
    [
        (("rfc3339",), True),
        (("epoch_ms", "rfc3339"), True),
        (("rfc3339", "rfc3339"), False),
        (("epoch_s", "epoch_ms"), False),
        ((), False),
    ],
)
def test_which_formats_a_field_can_declare(formats: tuple[str, ...], ok: bool) -> None:
    if ok:
        assert check_formats(formats) == formats
    else:
        with pytest.raises(ValueError):
            check_formats(formats)
