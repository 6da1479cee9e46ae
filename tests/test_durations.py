import pytest
from hypothesis import given
from hypothesis import strategies as st

from evald.durations import MAX_MS, DurationError, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("30m", 1_800_000),
        ("2m", 120_000),
        ("1h30m", 5_400_000),
        ("500ms", 500),
        ("90s", 90_000),
        ("1d", 86_400_000),
        ("1500", 1500),
        (" 1H ", 3_600_000),
        (0, 0),
        (250, 250),
        ("36500d", 36_500 * 86_400_000),
        (MAX_MS, MAX_MS),
    ],
)
def test_parse(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("bad", ["", "m", "30", "3x", "-5m", "1.5m", "m30", True, 1.5, None, -1])
def test_parse_rejects(bad):
    if bad == "30":  # digit-only strings are milliseconds, not an error
        assert parse_duration(bad) == 30
        return
    with pytest.raises(DurationError):
        parse_duration(bad)


# past a century: a bucket of 10**400 ms ended `evald replay` with an OverflowError; a
# superscript digit or 5,000 digits raised int()'s ValueError, a traceback where the
# command catches DurationError
@pytest.mark.parametrize(
    "bad",
    [
        MAX_MS + 1,
        10**400,
        "36501d",
        "1" * 21,
        "1" * 5000,
        "1" * 5000 + "d",
        "\u00b2",
        "\u0661\u0660\u0660",
        "\uff11h",
    ],  # Arabic-Indic and fullwidth: int() reads 100, 1h
)
def test_parse_rejects_what_is_too_long_or_not_ascii_digits(bad):
    with pytest.raises(DurationError, match="duration"):
        parse_duration(bad)


@given(st.integers(min_value=0, max_value=MAX_MS))
def test_format_round_trips(ms):
    assert parse_duration(format_duration(ms)) == ms


def test_format_examples():
    assert format_duration(5_400_000) == "1h30m"
    assert format_duration(0) == "0ms"
    assert format_duration(1_001) == "1s1ms"
