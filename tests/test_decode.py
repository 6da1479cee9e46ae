import json

import pytest

from evald.decode import REASONS, Decoder, Rejection
from evald.events import Feedback, Impression, Limits

GRADES = {"click": 1.0, "add_to_cart": 2.0, "purchase": 3.0}


@pytest.fixture
def decoder() -> Decoder:
    return Decoder(
        Limits(max_items=5, max_labels=2, max_string_length=16, max_event_bytes=400), GRADES
    )


def imp(**kw) -> bytes:
    body = {"request_id": "r1", "ts": 1000, "items": ["a", "b"], **kw}
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


def fb(**kw) -> bytes:
    body = {"request_id": "r1", "ts": 1000, "item": "a", "action": "click", **kw}
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


def test_mixed_stream_is_told_apart(decoder):
    assert isinstance(decoder.decode(imp()), Impression)
    assert isinstance(decoder.decode(fb()), Feedback)
    # an item literally named "items" must not fool the sniffing
    got = decoder.decode(fb(item="items"))
    assert isinstance(got, Feedback) and got.item == "items"
    assert isinstance(decoder.decode(imp(kind="impression")), Impression)
    assert isinstance(decoder.decode(fb(kind="feedback")), Feedback)


def test_source_kind_is_trusted(decoder):
    assert isinstance(decoder.decode(imp(), kind="impression"), Impression)
    got = decoder.decode(fb(), kind="impression")
    assert isinstance(got, Rejection) and got.reason == "missing_field"
    assert got.kind == "impression"


def test_grade_of_uses_mapping_and_explicit_grade_wins(decoder):
    assert decoder.grade_of(decoder.decode(fb(action="purchase"))) == 3.0
    assert decoder.grade_of(decoder.decode(fb(action="click", grade=0.5))) == 0.5
    assert decoder.grade_of(decoder.decode(fb(action="judgment", grade=4))) == 4.0


CASES: dict[str, bytes] = {
    "too_large": imp(items=["x" * 10] * 5, query="q" * 16, labels={"a": "b" * 16}) + b" " * 300,
    "invalid_json": b'{"request_id": ',
    "not_an_object": b'["r1", 1000]',
    "unknown_kind": b'{"request_id": "r1", "ts": 1000}',
    "wrong_kind": imp(kind="feedback"),
    "missing_field": fb(request_id=...),
    "wrong_type": imp(items="a"),
    "bad_timestamp": fb(ts="2024-01-01T00:00:00"),
    "bad_grade": fb(grade=-1),
    "missing_grade": fb(action="judgment"),
    "unknown_action": fb(action="like"),
    "too_many_items": imp(items=list("abcdef")),
    "too_many_labels": imp(labels={"a": "1", "b": "2", "c": "3"}),
    "string_too_long": imp(request_id="r" * 17),
}


def test_an_item_served_twice_is_accepted(decoder):
    # the metric engine credits a repeated item at its first rank; nothing to reject
    got = decoder.decode(imp(items=["a", "b", "a"]))
    assert isinstance(got, Impression) and got.items == ["a", "b", "a"]


def test_every_reason_has_a_case():
    assert set(CASES) == set(REASONS)


@pytest.mark.parametrize("reason", REASONS)
def test_every_rejection_reason(decoder, reason):
    raw = CASES[reason]
    got = decoder.decode(raw, kind="impression" if reason == "wrong_kind" else None)
    assert isinstance(got, Rejection), got
    assert got.reason == reason, got.detail
    assert got.raw == raw and got.detail
    line = got.to_json()
    assert line["reason"] == reason


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xff\xfe\x00", b"null", b"1e999", b'{"items": null}', b'{"kind": 3}', b"{" * 300],
)
def test_garbage_never_raises(decoder, raw):
    assert isinstance(decoder.decode(raw), Rejection)


def test_wrong_kind_for_a_record_that_says_it_is_the_other_kind(decoder):
    got = decoder.decode(imp(kind="feedback"), kind="impression")
    assert isinstance(got, Rejection) and got.reason == "wrong_kind"


def test_record_is_judged_as_the_kind_it_claims(decoder):
    got = decoder.decode(fb(kind="impression"))
    assert isinstance(got, Rejection) and got.reason == "missing_field" and "items" in got.detail
    got = decoder.decode(fb(kind="click"))
    assert isinstance(got, Rejection) and got.reason == "unknown_kind"


def test_unknown_source_kind(decoder):
    got = decoder.decode(imp(), kind="clicks")
    assert isinstance(got, Rejection) and got.reason == "unknown_kind"


def test_nan_grade_and_bool_ts(decoder):
    assert (
        decoder.decode(b'{"request_id":"r","ts":1,"item":"a","action":"click","grade":NaN}').reason
        == "bad_grade"
    )
    assert decoder.decode(fb(ts=True)).reason == "bad_timestamp"
