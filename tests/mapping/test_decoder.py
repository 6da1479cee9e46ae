"""The mapping decoder: fields from any paths, the same reasons as the native decoder with
details naming the JSON Pointer, unmapped actions skipped and counted, times by declared unit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from evald.config import load_config
from evald.decode import Rejection, Skipped
from evald.engine import Engine, Result
from evald.events import Feedback, Impression, Limits, Shown
from evald.mapping import MappingDecoder, MappingSpec, decoder_for
from evald.stats import MAX_SKIPPED_ACTIONS, OTHER, Stats

NOW = 1_714_564_800_000  # 2024-05-01T12:00:00Z
HOUR = 3_600_000

NESTED: dict[str, Any] = {
    "kind": {"field": "/type", "impression": "serve", "feedback": "act"},
    "impression": {
        "request_id": "/ctx/req",
        "time": {"path": "/at", "format": "epoch_s"},
        "items": {"path": "/hits", "id": "/doc/id"},
        "labels": [{"path": "/exp"}, {"path": "/ctx/model", "name": "model"}],
        "user_id": "/ctx/user",
    },
    "feedback": {
        "request_id": "/ctx/req",
        "time": {"path": "/at", "format": "epoch_s"},
        "item": "/doc~1id",
        "action": "/what",
        "actions": {"click": 1, "buy": 3},
        "grade": "/stars",
        "position": "/rank",
    },
}


def decoder(tree: dict[str, Any] = NESTED, **limits: int) -> MappingDecoder:
    return MappingDecoder(
        MappingSpec.model_validate(tree), Limits(**limits), min_ts=NOW - 24 * HOUR, max_lead=HOUR
    )


def raw(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


def serve(**extra: Any) -> dict[str, Any]:
    record = {
        "type": "serve",
        "at": NOW // 1000,
        "ctx": {"req": "r1", "model": "v2", "user": "u9"},
        "hits": [{"doc": {"id": "a"}}, {"doc": {"id": "b"}}],
        "exp": {"bucket": 3, "on": True, "ratio": 0.5, "arm": {"name": "B"}, "gone": None},
    }
    return {**record, **extra}


def act(**extra: Any) -> dict[str, Any]:
    return {"type": "act", "at": NOW // 1000 + 5, "ctx": {"req": "r1"}, "doc/id": "b",
            "what": "click", "rank": 1, **extra}  # fmt: skip


def test_an_impression_from_nested_paths_with_labels_flattened_to_strings() -> None:
    event = decoder().decode(raw(serve()), None, NOW)
    assert isinstance(event, Impression)
    assert (event.request_id, event.ts, event.items, event.user_id) == ("r1", NOW, ["a", "b"], "u9")
    assert event.labels == {
        "bucket": "3",
        "on": "true",
        "ratio": "0.5",
        "arm_name": "B",
        "model": "v2",
    }


def test_feedback_with_the_action_grade_an_explicit_grade_and_a_position() -> None:
    d = decoder()
    event = d.decode(raw(act()), None, NOW)
    assert isinstance(event, Feedback)
    assert (event.item, event.action, event.grade, event.position) == ("b", "click", 1.0, 1)
    assert event.ts == NOW + 5000
    starred = d.decode(raw(act(what="rate", stars=4)), None, NOW)
    assert isinstance(starred, Feedback) and starred.grade == 4.0  # explicit grade wins


def test_a_grade_above_100_is_bad_grade_on_both_paths_and_in_the_mapping() -> None:
    """A record's grade of 1e308 overflowed the measures' sums: it is ``bad_grade`` as a
    negative one is, on the fast path and the exact one; 100 is a grade."""
    d = decoder()
    for stars, accepted in ((100.0, True), (100.5, False), (1e308, False)):
        record = raw(act(what="rate", stars=stars))
        exact, fast = d.decode(record, None, NOW), d.decode_fast(record, None, NOW, None)
        if accepted:
            assert isinstance(exact, Feedback) and exact.grade == stars and fast == exact
        else:  # the fast path steps aside (None) for what it does not accept
            assert isinstance(exact, Rejection) and exact.reason == "bad_grade"
            assert fast is None or fast == exact
    tree = {**NESTED, "feedback": {**NESTED["feedback"], "actions": {"click": 1e308}}}
    with pytest.raises(ValueError, match="a grade is a number from 0 to 100"):
        MappingSpec.model_validate(tree)


def test_unmapped_actions_are_skipped_not_rejected() -> None:
    d = decoder()
    assert d.decode(raw(act(what="hover")), None, NOW) == Skipped("hover")
    # nothing else is read: a skipped record needs no item or time
    assert d.decode(raw({"type": "act", "what": "scroll"}), None, NOW) == Skipped("scroll")


def test_skipped_action_names_are_bounded() -> None:
    stats = Stats()
    for n in range(MAX_SKIPPED_ACTIONS + 5):
        stats.count_skipped(f"a{n}", 100)
    stats.count_skipped("a0", 100)
    stats.count_skipped("x" * 150, 100)
    assert len(stats.skipped) == MAX_SKIPPED_ACTIONS + 1 and stats.skipped[OTHER] == 6
    assert stats.skipped["a0"] == 2
    fresh = Stats()
    fresh.count_skipped("y" * 150, 100)
    assert fresh.skipped == {"y" * 100: 1}


@pytest.mark.parametrize(
    ("record", "reason", "detail"),
    [
        (serve(ctx={"model": "v2"}), "missing_field", "/ctx/req: missing"),
        (serve(hits=[{"doc": {"id": "a"}}, {"doc": {}}]), "missing_field", "/hits/1/doc/id"),
        (serve(hits="a"), "wrong_type", "/hits: expected a list of objects"),
        (serve(hits=[{"doc": {"id": 7}}]), "wrong_type", "/hits/0:"),
        (serve(ctx={"req": 5}), "wrong_type", "/ctx/req:"),
        (serve(exp={"tags": ["x"]}), "wrong_type", "/exp/tags: a list cannot be a label value"),
        (serve(at="soon"), "bad_timestamp", "/at: expected a number of epoch seconds"),
        (serve(at=NOW), "implausible_timestamp", "/at: "),
        (serve(at=NOW // 1000 // 1000), "implausible_timestamp", "read as epoch seconds"),
        (serve(type="other"), "unknown_kind", "/type: 'other', expected 'serve' or 'act'"),
        (act(what=3), "wrong_type", "/what: an action is text"),
        (act(stars=-1), "bad_grade", "/stars:"),
        (act(rank=-1), "wrong_type", "/rank:"),
    ],
)
def test_unreadable_records_are_rejected_with_a_reason_and_the_pointer(
    record: dict[str, Any], reason: str, detail: str
) -> None:
    got = decoder().decode(raw(record), None, NOW)
    assert isinstance(got, Rejection), got
    assert (got.reason, got.raw) == (reason, raw(record))
    assert detail in got.detail
    assert got.kind == ("feedback" if record.get("type") == "act" else got.kind)


def test_a_time_far_ahead_names_the_declared_unit() -> None:
    got = decoder().decode(raw(serve(at=NOW // 1000 + 2 * 3600)), None, NOW)
    assert isinstance(got, Rejection) and got.reason == "implausible_timestamp"
    assert "ahead of the reference time" in got.detail and "epoch seconds" in got.detail


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{oops", "invalid_json"),
        (b"[1, 2]", "not_an_object"),
        (b'{"type": "serve", "type": "act"}', "duplicate_key"),
        (b'{"type": "act", "at": NaN}', "invalid_json"),
        (b"x" * 70_000, "too_large"),
    ],
)
def test_the_native_input_rule_holds(data: bytes, reason: str) -> None:
    got = decoder().decode(data, None, NOW)
    assert isinstance(got, Rejection) and got.reason == reason and got.raw == data


def test_a_bom_is_ignored_and_nested_duplicates_are_caught() -> None:
    d = decoder()
    assert isinstance(d.decode(b"\xef\xbb\xbf" + raw(serve()), None, NOW), Impression)
    nested = raw(serve())[:-1] + b', "ctx": {"req": "r1", "req": "r2"}}'
    got = d.decode(nested, None, NOW)
    assert isinstance(got, Rejection) and got.reason == "duplicate_key"


def test_limits_apply_as_in_the_native_schema() -> None:
    many = serve(hits=[{"doc": {"id": str(n)}} for n in range(4)])
    got = decoder(max_items=3).decode(raw(many), None, NOW)
    assert isinstance(got, Rejection) and got.reason == "too_many_items"
    got = decoder(max_labels=2).decode(raw(serve()), None, NOW)
    assert isinstance(got, Rejection) and got.reason == "too_many_labels"


def test_the_source_kind_wins_and_a_missing_section_is_unknown_kind() -> None:
    only = {"impression": NESTED["impression"]}
    d = decoder(only)
    assert isinstance(d.decode(raw(serve(type="whatever")), None, NOW), Impression)
    got = d.decode(raw(act()), "feedback", NOW)
    assert isinstance(got, Rejection) and got.reason == "unknown_kind"
    both = {k: v for k, v in NESTED.items() if k != "kind"}
    got = decoder(both).decode(raw(act()), None, NOW)
    assert isinstance(got, Rejection) and "by topic only" in got.detail
    assert isinstance(decoder(both).decode(raw(act()), "feedback", NOW), Feedback)


def test_presence_tells_the_kind() -> None:
    tree = {**NESTED, "kind": {"present": "/what", "means": "feedback"}}
    d = decoder(tree)
    assert isinstance(d.decode(raw(act(type=None)), None, NOW), Feedback)
    assert isinstance(d.decode(raw(serve(type=None)), None, NOW), Impression)


def test_decode_many_matches_decode_record_by_record() -> None:
    records = [raw(serve()), raw(act()), raw(act(what="hover")), b"{", raw(act(rank=-2))]
    d = decoder()
    one = [d.decode(r, None, NOW) for r in records]
    rejected: list[tuple[int, Rejection]] = []
    skips: list[tuple[int, Skipped]] = []
    many = dict(decoder().decode_many(records, None, rejected, NOW, None, skips))
    assert many == {i: e for i, e in enumerate(one) if isinstance(e, (Impression, Feedback))}
    assert rejected == [(i, e) for i, e in enumerate(one) if isinstance(e, Rejection)]
    assert skips == [(2, Skipped("hover"))]


def test_the_engine_counts_skips_in_its_stats() -> None:
    config = load_config({"measures": "RR", "min_event_time": "2024-01-01T00:00:00Z"})
    results: list[Result] = []
    engine = Engine(config, on_result=results.append, decoder=decoder_for("ubi", config))
    query = {"query_id": "q", "timestamp": "2024-05-01T12:00:00Z", "query_response_hit_ids": ["a"]}
    hover = {"query_id": "q", "timestamp": "2024-05-01T12:00:01Z", "action_name": "hover"}
    assert engine.feed(raw(query)) is not None
    assert engine.feed(raw(hover)) is None
    engine.feed_batch([raw(hover)])
    assert engine.stats.skipped == {"hover": 2}
    assert sum(engine.stats.rejected.values()) == 0


def test_skips_re_fed_by_a_restore_are_not_counted_again() -> None:
    """A restore re-reads records from the committed offsets: the skips among them were
    counted before the restart, as were the rejections; the total matches one uninterrupted run."""
    config = load_config({"measures": "RR", "min_event_time": "2024-01-01T00:00:00Z"})
    query = {"query_id": "q", "timestamp": "2024-05-01T12:00:00Z", "query_response_hit_ids": ["a"]}
    hover = {"query_id": "q", "timestamp": "2024-05-01T12:00:01Z", "action_name": "hover"}
    clicks = {"query_id": "q", "timestamp": "2024-05-01T12:00:02Z", "action_name": "click",
              "event_attributes": {"object": {"object_id": "a"}}}  # fmt: skip
    feedback = [raw(hover), raw(clicks), b"{", raw(hover), raw(hover)]
    whole = Engine(config, decoder=decoder_for("ubi", config), clock=lambda: NOW / 1000)
    whole.feed(raw(query), kind="impression", offset=0)
    whole.feed_batch(feedback, kinds="feedback", offsets=range(5))
    assert whole.stats.skipped == {"hover": 3}

    first = Engine(config, decoder=decoder_for("ubi", config), clock=lambda: NOW / 1000)
    first.feed(raw(query), kind="impression", offset=0)
    first.feed_batch(feedback[:4], kinds="feedback", offsets=range(4))  # then a crash
    restarted = Engine(config, decoder=decoder_for("ubi", config), clock=lambda: NOW / 1000)
    # what the first life counted travels in its checkpoint; the state is re-fed
    consumed = {"impression": 1, "feedback": 4}
    restarted.resume(0, first.state(0, consumed), consumed)
    restarted.feed(raw(query), kind="impression", offset=0)
    restarted.feed_batch(feedback[:2], kinds="feedback", offsets=range(2))
    restarted.feed(feedback[2], kind="feedback", offset=2)
    restarted.feed(feedback[3], kind="feedback", offset=3)  # feed path, re-fed
    restarted.feed_batch(feedback[4:], kinds="feedback", offsets=[4])  # new
    assert restarted.stats.skipped == {"hover": 1}  # only the record the replay did not re-feed
    assert restarted.counted(0) == whole.counted(0)
    assert whole.stats.skipped == {"hover": 3} and whole.counted(0)["rejected/invalid_json"] == 1


RECORD_TIME: dict[str, Any] = {
    "impression": {"request_id": "/req", "time": {"source": "record"}, "items": "/hits"},
    "feedback": {
        "request_id": "/req",
        "time": {"source": "record"},
        "item": "/doc",
        "action": "/what",
        "actions": {"click": 1},
    },
}


def test_the_time_from_the_kafka_record_timestamp() -> None:
    d = decoder(RECORD_TIME)
    assert d.reads_record_time and not decoder().reads_record_time
    event = d.decode(raw({"req": "r", "hits": ["a"]}), "impression", NOW, NOW - 7)
    assert isinstance(event, Impression) and event.ts == NOW - 7
    click = d.decode(raw({"req": "r", "doc": "a", "what": "click"}), "feedback", NOW, NOW + 9)
    assert isinstance(click, Feedback) and click.ts == NOW + 9
    many = list(d.decode_many([raw({"req": "r", "hits": ["a"]})] * 2, "impression", [], NOW,
                              [NOW - 1, NOW - 2]))  # fmt: skip
    assert [e.ts for _, e in many] == [NOW - 1, NOW - 2]


@pytest.mark.parametrize(
    ("record_time", "reason", "detail"),
    [
        (None, "missing_field", "the record timestamp: missing"),
        (-1, "missing_field", "the record timestamp: missing"),
        (NOW - 48 * HOUR, "implausible_timestamp", "the record timestamp: 2024-04-29"),
        (NOW + 2 * HOUR, "implausible_timestamp", "ahead of the reference time"),
    ],
)
def test_a_missing_or_implausible_record_timestamp_is_rejected(
    record_time: int | None, reason: str, detail: str
) -> None:
    got = decoder(RECORD_TIME).decode(
        raw({"req": "r", "hits": ["a"]}), "impression", NOW, record_time
    )
    assert isinstance(got, Rejection) and got.reason == reason and detail in got.detail


def test_the_engine_hands_the_record_timestamp_to_the_decoder() -> None:
    config = load_config({"measures": "RR", "min_event_time": "2024-01-01T00:00:00Z"})
    results: list[Result] = []
    engine = Engine(config, on_result=results.append, decoder=decoder(RECORD_TIME),
                    clock=lambda: NOW / 1000)  # fmt: skip
    engine.feed_batch([raw({"req": "r1", "hits": ["a"]})], kinds="impression", timestamps=[NOW])
    engine.feed(raw({"req": "r2", "hits": ["a"]}), kind="impression", timestamp=NOW + 1)
    clicks = [raw({"req": "r1", "doc": "a", "what": "click"})] * 2
    rejected = engine.feed_batch(clicks, kinds="feedback", timestamps=[NOW + 2, None])
    assert [(p, r.reason) for p, r in rejected] == [(1, "missing_field")]  # no wall-clock stand-in
    engine.drain()
    assert sorted((r.request_id, r.ts, r.measures["RR"]) for r in results) == [
        ("r1", NOW, 1.0),
        ("r2", NOW + 1, 0.0),
    ]


# -- UBI as its writers write it ----------------------------------------------------------

UBI_NOW = "2024-05-01T12:00:00.000Z"


def ubi_event(action: str, ordinal: int | None = 0, **extra: Any) -> bytes:
    attributes: dict[str, Any] = {"object": {"object_id": "sku-1", "object_id_field": "sku"}}
    if ordinal is not None:
        attributes["position"] = {"ordinal": ordinal}
    doc = {"action_name": action, "query_id": "q1", "timestamp": UBI_NOW}
    return raw({**doc, "event_attributes": attributes, **extra})


def test_a_ubi_impression_event_is_an_item_shown_at_its_position() -> None:
    ubi = decoder_for("ubi", load_config({}))
    assert ubi.decode(ubi_event("impression", 4), None, NOW) == Shown("q1", NOW, "sku-1", 4)
    missing = ubi.decode(ubi_event("impression", None), None, NOW)
    assert isinstance(missing, Rejection) and missing.reason == "missing_field"
    assert missing.detail == "/event_attributes/position/ordinal: missing"
    negative = ubi.decode(ubi_event("impression", -1), None, NOW)
    assert isinstance(negative, Rejection) and negative.reason == "wrong_type"
    assert negative.detail.startswith("/event_attributes/position/ordinal")


def test_a_ubi_query_record_without_hits_is_a_list_with_no_items_yet() -> None:
    ubi = decoder_for("ubi", load_config({}))
    for hits in ({}, {"query_response_hit_ids": None}, {"query_response_hit_ids": []}):
        doc = {"query_id": "q1", "timestamp": UBI_NOW, "application": "shop", **hits}
        got = ubi.decode(raw(doc), None, NOW)
        assert isinstance(got, Impression) and got.items == []
        assert got.labels == {"application": "shop"}
    # without repeats: merge a record without its items is refused, as before
    plain = decoder({**NESTED, "impression": {**NESTED["impression"], "repeats": "duplicate"}})
    refused = plain.decode(raw(serve(hits=None)), None, NOW)
    assert isinstance(refused, Rejection) and refused.reason == "missing_field"


@pytest.mark.parametrize(
    "spelt",
    [
        UBI_NOW,
        "2024-05-01T12:00:00+00:00",
        "2024-05-01T14:00:00+0200",
        "2024-05-01T07:00:00-0500",
        NOW,
    ],
)
def test_ubi_times_are_read_in_every_form_its_writers_use(spelt: object) -> None:
    ubi = decoder_for("ubi", load_config({}))
    for doc in (
        {"query_id": "q1", "timestamp": spelt, "query_response_hit_ids": ["a"]},
        {"query_id": "q1", "timestamp": spelt, "action_name": "click",
         "event_attributes": {"object": {"object_id": "a"}}},
    ):  # fmt: skip
        got = ubi.decode(raw(doc), None, NOW)
        assert not isinstance(got, Rejection), got
        assert got.ts == NOW  # type: ignore[union-attr]


def test_a_declared_format_still_restricts_and_a_wrong_unit_is_caught() -> None:
    ms_only = decoder(
        {
            **NESTED,
            "impression": {**NESTED["impression"], "time": {"path": "/at", "format": "epoch_ms"}},
        }
    )
    text = ms_only.decode(raw(serve(at=UBI_NOW)), None, NOW)
    assert isinstance(text, Rejection) and text.reason == "bad_timestamp"
    ubi = decoder_for("ubi", load_config({}))
    seconds = ubi.decode(
        raw({"query_id": "q", "timestamp": NOW // 1000, "query_response_hit_ids": []}), None, NOW
    )
    assert isinstance(seconds, Rejection) and seconds.reason == "implausible_timestamp"
    assert "read as epoch milliseconds: is that its unit?" in seconds.detail
    listed = ubi.decode(raw({"query_id": "q", "timestamp": [NOW]}), None, NOW)
    assert isinstance(listed, Rejection) and listed.reason == "bad_timestamp"
    assert "expected RFC 3339 text or a number of epoch milliseconds, got a list" in listed.detail


def test_an_empty_user_id_is_none_and_the_next_source_is_read() -> None:
    """ubi.js writes ``user_id: ""`` beside the ``client_id``: the client is the user."""
    ubi = decoder_for("ubi", load_config({}))
    doc = {"query_id": "q", "timestamp": UBI_NOW, "user_id": "", "client_id": "c-7"}
    got = ubi.decode(raw(doc), None, NOW)
    assert isinstance(got, Impression) and got.user_id == "c-7"
    alone = ubi.decode(raw({**doc, "client_id": ""}), None, NOW)
    assert isinstance(alone, Impression) and alone.user_id is None
    assert ubi.decode_fast(raw(doc), None, NOW) == got
