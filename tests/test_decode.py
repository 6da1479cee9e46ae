import json

import pytest

from evald.decode import BOM, JOIN_REASONS, REASONS, Decoder, Rejection, duplicate_key
from evald.events import Feedback, Impression, Limits

GRADES = {"click": 1.0, "add_to_cart": 2.0, "purchase": 3.0}


@pytest.fixture
def decoder() -> Decoder:
    return Decoder(
        Limits(max_items=5, max_labels=2, max_string_length=16, max_event_bytes=400),
        GRADES,
        min_ts=500,
        max_lead=1000,
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
    "duplicate_key": b'{"request_id": "r1", "ts": 1000, "items": ["a"], "items": ["b"]}',
    "unknown_kind": b'{"request_id": "r1", "ts": 1000}',
    "wrong_kind": imp(kind="feedback"),
    "missing_field": fb(request_id=...),
    "wrong_type": imp(items="a"),
    "empty_id": fb(request_id=""),
    "bad_timestamp": fb(ts="2024-01-01T00:00:00"),
    "implausible_timestamp": fb(ts=499),
    "bad_grade": fb(grade=-1),
    "missing_grade": fb(action="judgment"),
    "unknown_action": fb(action="like"),
    "too_many_items": imp(items=list("abcdef")),
    "too_many_labels": imp(labels={"a": "1", "b": "2", "c": "3"}),
    "string_too_long": imp(request_id="r" * 17),
    "unknown_interleaving": imp(teams=["A", "B"], interleaving="coin_flip"),
    "bad_teams": imp(teams=["A"], interleaving="team_draft"),
}


def test_an_item_served_twice_is_accepted(decoder):
    # the metric engine credits a repeated item at its first rank; nothing to reject
    got = decoder.decode(imp(items=["a", "b", "a"]))
    assert isinstance(got, Impression) and got.items == ["a", "b", "a"]


DECODER_REASONS = [reason for reason in REASONS if reason not in JOIN_REASONS]


def test_every_reason_has_a_case():
    assert set(CASES) == set(DECODER_REASONS)


@pytest.mark.parametrize("reason", DECODER_REASONS)
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


# ---------------------------------------------------------------- the input rule (semantics §1)


def test_a_leading_bom_is_ignored_and_kept_in_the_raw_of_a_rejection(decoder):
    got = decoder.decode(BOM + imp())
    assert isinstance(got, Impression) and got.request_id == "r1"
    bad = BOM + fb(action="like")
    got = decoder.decode(bad)
    assert isinstance(got, Rejection) and got.reason == "unknown_action" and got.raw == bad
    got = decoder.decode(BOM + b"{oops")
    assert got.reason == "invalid_json" and got.raw == BOM + b"{oops"
    # only a leading BOM: one inside the document is not JSON whitespace
    assert decoder.decode(b" " + BOM + imp()).reason == "invalid_json"


def test_rfc3339_t_and_z_in_either_case(decoder):
    upper = decoder.decode(fb(ts="2024-05-01T12:00:00.250Z"))
    for spelling in ("2024-05-01t12:00:00.250z", "2024-05-01T12:00:00.250z"):
        got = decoder.decode(fb(ts=spelling))
        assert isinstance(got, Feedback) and got.ts == upper.ts == 1_714_564_800_250


@pytest.mark.parametrize(
    "raw",
    [
        b'{"request_id": "r1", "ts": 1000, "items": ["a"], "labels": {"m": "1", "m": "2"}}',
        b'{"request_id": "r1", "request_id": "r2", "ts": 1000, "item": "a", "action": "click"}',
        # the same key spelt with an escape
        b'{"request_id": "r1", "ts": 1000, "items": ["a"], "\\u0069tems": ["b"]}',
        # repeated in an ignored (unknown) field's object too
        b'{"request_id": "r1", "ts": 1000, "items": ["a"], "x": {"k": 1, "k": 2}}',
    ],
)
def test_a_repeated_key_in_any_object_is_rejected(decoder, raw):
    got = decoder.decode(raw)
    assert isinstance(got, Rejection) and got.reason == "duplicate_key", got
    assert got.raw == raw and "appears twice" in got.detail
    rejected: list[tuple[int, Rejection]] = []
    assert list(decoder.decode_many([raw], None, rejected)) == []
    assert [r.reason for _, r in rejected] == ["duplicate_key"]


@pytest.mark.parametrize(
    "raw",
    [
        # the same key in different objects, and key-like text inside values
        b'{"request_id": "r1", "ts": 1000, "items": ["a"], "labels": {"items": "x"}}',
        b'{"request_id": "r1:", "ts": 1000, "items": ["\\"ts\\":", "ts", "\\\\"], "q": ":"}',
        b'{"request_id": "r1", "ts": 1000, "items": ["a"], "x": [{"k": 1}, {"k": 2}]}',
    ],
)
def test_no_false_duplicate_keys(decoder, raw):
    assert duplicate_key(raw) is None
    assert isinstance(decoder.decode(raw), Impression)


def test_event_time_plausibility_floor_and_lead(decoder):
    assert decoder.decode(fb(ts=500)).ts == 500  # the floor itself is plausible
    got = decoder.decode(fb(ts=499))
    assert got.reason == "implausible_timestamp" and "earliest plausible" in got.detail
    assert got.kind == "feedback"
    # lead over the reference: at most max_lead (1000 ms) ahead
    assert isinstance(decoder.decode(imp(ts=3000), reference=2000), Impression)
    got = decoder.decode(imp(ts=3001), reference=2000)
    assert got.reason == "implausible_timestamp" and "ahead of the reference" in got.detail
    assert got.kind == "impression"
    far = imp(ts="9999-12-31T23:59:59Z")
    assert decoder.decode(far, reference=1_714_564_800_000).reason == "implausible_timestamp"
    assert isinstance(decoder.decode(far), Impression)  # no reference: no lead bound
    # a reference no clock can spell still gives a message, not an exception
    assert decoder.decode(imp(ts=3001), reference=-(10**18)).reason == "implausible_timestamp"


def test_decode_many_equals_decode_with_per_record_references(decoder):
    raws = [*CASES.values(), imp(), fb(), BOM + imp(), imp(ts=3001), imp(ts=3000)]
    refs = [2000] * len(raws)
    refs[-2] = 2001  # makes 3001 plausible for this record only
    kinds = [None] * len(raws)
    kinds[list(CASES).index("wrong_kind")] = "impression"
    rejected: list[tuple[int, Rejection]] = []
    got = dict(decoder.decode_many(raws, kinds, rejected, refs))
    for position, raw in enumerate(raws):
        one = decoder.decode(raw, kinds[position], refs[position])
        if isinstance(one, Rejection):
            assert (position, one) in rejected
        else:
            assert got[position] == one


def test_an_over_long_record_from_an_unknown_source_kind_is_of_unknown_kind(decoder):
    # found by tests/test_fuzz_inputs.py: the engine counted it under kind "clicks" and failed
    got = decoder.decode(b"x" * 500, kind="clicks")
    assert (got.reason, got.kind) == ("too_large", "unknown")
    assert decoder.decode(b"x" * 500, kind="feedback").kind == "feedback"


def test_a_key_made_of_json_punctuation_is_still_compared(decoder):
    raw = b'{"request_id": "r1", "ts": 1000, "items": ["a"], "x": "v", ":": 1, ":": 2}'
    assert duplicate_key(raw) == ":"
    assert decoder.decode(raw).reason == "duplicate_key"


@pytest.mark.parametrize(
    ("ts", "detail"),
    [
        ("2024-05-01T12:00:00+02", None),  # accepted
        ("2024-05-01T12:00:00.000", "ts: timestamp has no UTC offset: '2024-05-01T12:00:00.000'"),
        ("yesterday", "ts: not an RFC 3339 timestamp: 'yesterday'"),
        (1.5e12, "ts: expected RFC 3339 text with an offset or integer epoch milliseconds"),
        (True, "ts: expected RFC 3339 text with an offset or integer epoch milliseconds"),
        (-1, "ts: Input should be greater than or equal to 0"),
    ],
)
def test_a_bad_time_is_explained_by_what_its_value_is(decoder, ts, detail):
    # the union's first branch is the integer: a text time without an offset was reported as
    # "ts.constrained-int: Input should be a valid integer", hiding what is wrong with it
    for raw, kind in ((imp(ts=ts), None), (fb(ts=ts), "feedback")):
        got = decoder.decode(raw, kind=kind)
        if detail is None:
            assert not isinstance(got, Rejection)
        else:
            assert isinstance(got, Rejection) and (got.reason, got.detail) == (
                "bad_timestamp",
                detail,
            )


def test_epoch_seconds_read_as_milliseconds_are_said_to_be_in_the_wrong_unit():
    """Seconds in ``ts`` read as January 1970: the rejection now says what the likely mistake
    is, as a mapping's does; an RFC 3339 time before the bound gets no such hint."""
    decoder = Decoder(Limits(), GRADES, min_ts=946_684_800_000, max_lead=None)
    got = decoder.decode(imp(ts=1_714_564_800))
    assert isinstance(got, Rejection) and got.reason == "implausible_timestamp"
    assert got.detail.endswith("(a number in ts is epoch milliseconds: is it in seconds?)")
    old = decoder.decode(imp(ts="1999-12-31T00:00:00Z"))
    assert isinstance(old, Rejection) and old.reason == "implausible_timestamp"
    assert "seconds" not in old.detail
    # the batch path says the same
    rejections: list[tuple[int, Rejection]] = []
    assert list(decoder.decode_many([imp(ts=1_714_564_800)], None, rejections)) == []
    assert [r.detail for _, r in rejections] == [got.detail]
