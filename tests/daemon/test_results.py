"""The results-topic record encoder: same document and timestamps as the shared, slower code."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from hypothesis import given
from hypothesis import strategies as st

from evald.daemon.main.results import ResultEncoder, TimestampFormatter
from evald.engine import Result
from evald.events import MAX_TS_MS, format_timestamp, parse_timestamp


def _ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=timezone.utc).timestamp() * 1000)  # type: ignore[misc]


BOUNDARIES = [
    _ms(2024, 5, 1, 12, 0, 0),  # top of an hour
    _ms(2024, 12, 31, 23, 0, 0),  # last hour of a year
    _ms(2025, 1, 1, 0, 0, 0),  # first instant of a year
    _ms(2024, 2, 29, 0, 0, 0),  # leap day
    _ms(2024, 3, 1, 0, 0, 0),  # day after a leap day
    _ms(2000, 1, 1, 0, 0, 0),
    0,  # the epoch
]


def test_formatter_matches_format_timestamp_around_hour_day_and_year_boundaries() -> None:
    fmt = TimestampFormatter()
    offsets = [-3_600_001, -60_001, -1_001, -1, 0, 1, 999, 1_000, 59_999, 60_000, 3_599_999]
    checked = 0
    for base in BOUNDARIES:
        for delta in offsets:
            ms = base + delta
            if ms < 0:
                continue
            assert fmt(ms) == format_timestamp(ms), ms
            checked += 1
    assert checked > 60


def test_formatter_walks_a_stream_across_many_hours_and_a_tiny_cache() -> None:
    """Every ms value of a stream crossing hours and days, with the cache cleared often."""
    fmt = TimestampFormatter(max_hours=2)
    start = _ms(2024, 12, 31, 21, 59, 58)
    for ms in range(start, start + 5 * 3_600_000, 7_919):  # a prime step: all ms residues
        assert fmt(ms) == format_timestamp(ms)
    # out of order, back and forth between hours
    for ms in (start + 3_600_000, start, start + 7_200_000, start + 1):
        assert fmt(ms) == format_timestamp(ms)


@given(st.integers(min_value=0, max_value=MAX_TS_MS))
def test_formatter_equals_format_timestamp_on_any_valid_time(ms: int) -> None:
    fmt = TimestampFormatter()
    assert fmt(ms) == format_timestamp(ms)
    assert fmt(ms) == format_timestamp(ms)  # the cached path
    assert parse_timestamp(fmt(ms)) == ms


def _result(**overrides: object) -> Result:
    fields: dict[str, object] = {
        "request_id": "r-1",
        "ts": _ms(2025, 11, 21, 6, 59, 59) + 999,
        "labels": {"model": "m1", "arm": "b", "surface": "wéb"},
        "measures": {"nDCG@10": 0.5, "RR": 1.0, "P@10": 0.1},
        "partition": 3,
    }
    fields.update(overrides)
    return Result(**fields)  # type: ignore[arg-type]


def test_encoded_record_is_the_result_document_keyed_by_request_id() -> None:
    encoder = ResultEncoder()
    result = _result()
    key, value = encoder.encode(result)
    assert key == b"r-1"
    assert json.loads(value) == result.to_json()
    assert encoder.document(result) == result.to_json()
    assert value.isascii() and b" " not in value  # compact and ASCII-escaped, as before


def test_request_ids_and_labels_that_need_escaping_round_trip() -> None:
    encoder = ResultEncoder()
    result = _result(request_id='id "quoted" \\ ünï', labels={"arm": "a\nb"})
    key, value = encoder.encode(result)
    assert key == 'id "quoted" \\ ünï'.encode()
    assert json.loads(value) == result.to_json()


def test_a_result_with_a_user_carries_its_cluster_key_as_the_shared_document() -> None:
    """The topic record has ``"cluster"`` (16 hex digits, leading zeros kept) exactly when
    the result has a user's key, as ``Result.to_json``: a restart reads it back."""
    encoder = ResultEncoder()
    for key in (1, 0x00FF_0000_0000_00AB, (1 << 64) - 1):
        result = _result(cluster=key)
        _, value = encoder.encode(result)
        doc = json.loads(value)
        assert doc == result.to_json() == encoder.document(result)
        assert int(doc["cluster"], 16) == key and len(doc["cluster"]) == 16
    assert "cluster" not in json.loads(encoder.encode(_result())[1])


def test_an_interleaved_result_carries_its_credit_as_the_shared_document() -> None:
    """The topic record has ``"interleaving"`` exactly when the result was a credited
    interleaved list, as ``Result.to_json`` (the offline check of docs/semantics.md §9)."""
    encoder = ResultEncoder()
    field = {"method": "team_draft", "credit": {"A": 2.0, "B": 0.0}, "order": ["B", "A"]}
    result = _result(interleaving=field)
    doc = json.loads(encoder.encode(result)[1])
    assert doc == result.to_json() == encoder.document(result)
    assert doc["interleaving"] == field
    assert "interleaving" not in json.loads(encoder.encode(_result())[1])


def test_a_result_with_zero_feedback_values_carries_them_as_the_shared_document() -> None:
    """The topic record has ``"zero_feedback"`` when the signals are on, as ``Result.to_json``:
    a restore absorbs the window sums from it (docs/drilldown.md, Zero-feedback signals)."""
    encoder = ResultEncoder()
    field = {"empty": 0.0, "unjudged": 0.4, "rbo": None}
    result = _result(zero_feedback=field)
    doc = json.loads(encoder.encode(result)[1])
    assert doc == result.to_json() == encoder.document(result)
    assert doc["zero_feedback"] == field
    assert "zero_feedback" not in json.loads(encoder.encode(_result())[1])
