from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from evald.events import (
    MAX_TS_MS,
    Feedback,
    Impression,
    Limits,
    format_timestamp,
    limited_models,
    parse_timestamp,
)


def test_rfc3339_with_offsets_and_fraction():
    assert parse_timestamp("1970-01-01T00:00:01Z") == 1000
    assert parse_timestamp("1970-01-01T01:00:00.250+01:00") == 250
    assert (
        parse_timestamp("2024-05-01t12:00:00.123456Z")
        == int(datetime(2024, 5, 1, 12, tzinfo=timezone.utc).timestamp() * 1000) + 123
    )


@pytest.mark.parametrize(
    "bad",
    ["2024-05-01T12:00:00", "2024-05-01", "yesterday", "1714560000000", -1, MAX_TS_MS + 1],
)
def test_bad_timestamps(bad):
    with pytest.raises(ValueError):
        parse_timestamp(bad)


@given(st.integers(min_value=0, max_value=MAX_TS_MS))
def test_format_then_parse_is_identity(ms):
    text = format_timestamp(ms)
    assert text.endswith("Z") and len(text) == 24
    assert parse_timestamp(text) == ms


def test_an_instant_past_9999_is_spelt_with_a_five_digit_year():
    """The end of a window holding an event of 9999-12-31 is in year 10000, which Python's
    dates cannot hold: it is spelt, not a ValueError (a replay of such events crashed)."""
    assert format_timestamp(MAX_TS_MS + 1) == "10000-01-01T00:00:00.000Z"
    day = 86_400_000
    assert format_timestamp(MAX_TS_MS + 1 + 59 * day + 3_723_456) == "10000-02-29T01:02:03.456Z"
    assert format_timestamp(MAX_TS_MS + 1 + 366 * day) == "10001-01-01T00:00:00.000Z"


def test_models_normalise_ts_to_int_ms():
    imp = Impression.model_validate_json(
        b'{"request_id":"r","ts":"1970-01-01T00:00:02Z","items":["a"],"labels":{"arm":"b"}}'
    )
    assert imp.ts == 2000 and imp.labels == {"arm": "b"}
    fb = Feedback.model_validate_json(b'{"request_id":"r","ts":5,"item":"a","action":"click"}')
    assert fb.ts == 5 and fb.grade is None


def test_limited_models_enforce_limits_and_stay_subclasses():
    imp_cls, fb_cls = limited_models(Limits(max_items=2, max_labels=1, max_string_length=3))
    assert issubclass(imp_cls, Impression) and issubclass(fb_cls, Feedback)
    ok = imp_cls.model_validate_json(b'{"request_id":"r","ts":1,"items":["a","b"]}')
    assert isinstance(ok, Impression)
    for raw in (
        b'{"request_id":"r","ts":1,"items":["a","b","c"]}',
        b'{"request_id":"r","ts":1,"items":["a"],"labels":{"x":"1","y":"2"}}',
        b'{"request_id":"long","ts":1,"items":["a"]}',
    ):
        with pytest.raises(ValidationError):
            imp_cls.model_validate_json(raw)
    with pytest.raises(ValidationError):
        fb_cls.model_validate_json(b'{"request_id":"r","ts":1,"item":"abcd","action":"click"}')


def test_grade_must_be_a_finite_non_negative_number():
    base = '{"request_id":"r","ts":1,"item":"a","action":"judgment","grade":%s}'
    assert Feedback.model_validate_json(base % "2").grade == 2.0
    for bad in ("-1", "NaN", "true", '"2"', "Infinity"):
        with pytest.raises(ValidationError):
            Feedback.model_validate_json(base % bad)
