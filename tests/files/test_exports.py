"""OpenSearch / Elasticsearch export wrappers taken off, line by line."""

from __future__ import annotations

import json

from evald.files.exports import Line, Record, Unwrapped, unwrap


def lines(*texts: str, name: str = "f") -> list[Line]:
    return [Line(name, n, t.encode(), len(t), len(t)) for n, t in enumerate(texts, start=1)]


def records(*texts: str) -> tuple[list[tuple[int, bytes, str | None]], Unwrapped]:
    skipped = Unwrapped()
    out = []
    for item in unwrap(lines(*texts), skipped, 1000):
        assert isinstance(item, Record)
        out.append((item.number, item.raw, item.index))
    return out, skipped


def test_bulk_documents_come_with_their_index_and_actions_are_skipped_and_counted() -> None:
    got, skipped = records(
        '{"index": {"_index": "ubi_queries", "_id": "1"}}',
        '{"query_id": "q"}',
        '{ "create" : { "_index" : "ubi_events" } }',
        '{"action_name": "click"}',
        '{"delete": {"_index": "ubi_events", "_id": "7"}}',
        '{"update": {"_index": "ubi_events", "_id": "8"}}',
        '{"doc": {"action_name": "click"}}',
        '{"index": {}}',
        '{"plain": true}',
        '{"plain": "again"}',
    )
    assert got == [
        (2, b'{"query_id": "q"}', "ubi_queries"),
        (4, b'{"action_name": "click"}', "ubi_events"),
        (9, b'{"plain": true}', None),  # after an index action without _index: no index
        (10, b'{"plain": "again"}', None),
    ]
    assert (skipped.actions, skipped.bodies) == (5, 1)
    assert skipped.by_action == {"index": 2, "create": 1, "delete": 1, "update": 1}


def test_a_search_hit_gives_its_source_written_back_compactly() -> None:
    source = {"query_id": "q", "timestamp": 1714564800000, "n": 2**70, "s": "é"}
    hit = json.dumps({"_index": "ubi_queries", "_id": "x", "_score": 1.0, "_source": source})
    got, _ = records(hit)
    ((_, raw, index),) = got
    assert index == "ubi_queries" and json.loads(raw) == source
    assert b" " not in raw  # compact: the mapping's fast path reads it


def test_what_only_looks_like_a_wrapper_is_passed_on_whole() -> None:
    texts = (
        '{"index": "not an object"}',
        '{"index": {"_index": "a"}, "and": 1}',
        '{"_source": {"a": 1}}',  # no _index: not a hit
        '{"_index": "a", "_source": [1]}',
        '{"index": {"_index": "a"}',  # not JSON
    )
    got, skipped = records(*texts)
    assert [raw for _, raw, _ in got] == [t.encode() for t in texts]
    assert skipped.actions == 0


def test_a_wrapper_repeating_a_key_is_passed_on_whole_for_the_decoder_to_refuse() -> None:
    hit = '{"_index": "e", "_source": {"a": 1, "a": 2}}'
    action = '{"index": {"_index": "e", "_index": "f"}}'
    got, skipped = records(hit, action)
    assert [raw for _, raw, _ in got] == [hit.encode(), action.encode()]
    assert skipped.actions == 0


def test_a_document_is_the_line_after_its_action_in_the_same_file_only() -> None:
    skipped = Unwrapped()
    both = [*lines('{"index": {"_index": "a"}}', name="one"), *lines('{"x": 1}', name="two")]
    got = list(unwrap(both, skipped, 1000))
    assert [(r.name, r.index) for r in got if isinstance(r, Record)] == [("two", None)]


def test_blank_and_over_long_lines_are_handed_back_as_lines() -> None:
    long = Line("f", 2, b"x" * 10, 30, 30)
    got = list(unwrap([Line("f", 1, b"", 1, 0), long], Unwrapped(), 10))
    assert got == [Line("f", 1, b"", 1, 0), long]


def test_a_wrapper_after_a_leading_bom_is_still_taken_off() -> None:
    # a file saved with a UTF-8 BOM: its first line is an action or a hit all the same, and
    # its record is not lost to a rejection
    bom = "\ufeff"
    hit = json.dumps({"_index": "ubi_queries", "_source": {"query_id": "q"}})
    got, skipped = records(bom + '{"index": {"_index": "ubi_events"}}', '{"a": 1}', bom + hit)
    assert got == [(2, b'{"a": 1}', "ubi_events"), (3, b'{"query_id":"q"}', "ubi_queries")]
    assert skipped.actions == 1
