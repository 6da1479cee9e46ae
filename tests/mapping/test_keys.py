"""The cheap repeated-key test never clears a record that repeats a key (the exact check is
the oracle), whatever the nesting, spacing or escapes; and it clears ordinary records."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import from_json

from evald.decode import duplicate_key
from evald.mapping.keys import encode, maybe_repeated

#: a tree of pairs, so a key can be written twice in one object (a dict cannot hold that)
keys = st.sampled_from(["a", "b", "id", 'q":', "a\\", "é"])
scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=6)
trees = st.recursive(
    scalars,
    lambda inner: (
        st.tuples(st.just("array"), st.lists(inner, max_size=4))
        | st.tuples(st.just("object"), st.lists(st.tuples(keys, inner), max_size=4))
    ),
    max_leaves=16,
)


def write(tree: Any, spaced: bool, escape_quotes: bool) -> str:
    """JSON text of ``tree``; ``escape_quotes``: quotes and colons in strings as \\u escapes."""
    if isinstance(tree, tuple) and tree[0] == "array":
        return "[" + ",".join(write(item, spaced, escape_quotes) for item in tree[1]) + "]"
    if isinstance(tree, tuple):
        colon = " : " if spaced else ":"
        pairs = [
            write(key, spaced, escape_quotes) + colon + write(value, spaced, escape_quotes)
            for key, value in tree[1]
        ]
        return "{" + ",".join(pairs) + "}"
    text = json.dumps(tree, ensure_ascii=False)
    if escape_quotes and isinstance(tree, str):
        text = '"' + text[1:-1].replace('\\"', "\\u0022").replace(":", "\\u003A") + '"'
    return text


@settings(max_examples=1500, derandomize=True)
@given(st.lists(st.tuples(keys, trees), max_size=5), st.booleans(), st.booleans())
def test_records_cleared_by_either_cheap_test_repeat_no_key(
    pairs: list[tuple[str, Any]], spaced: bool, escape_quotes: bool
) -> None:
    """Both cheap tests on each drawn tree (one test of the two drew trees each way before:
    drawing them was nearly all of its time): ``maybe_repeated`` on the record written with
    the drawn spacing and escapes; and the fast path's first test, a compact record that
    msgspec writes back byte for byte, on the same pairs written compact as they are."""
    raw = write(("object", pairs), spaced, escape_quotes).encode()
    if not maybe_repeated(raw, from_json(raw)):
        assert duplicate_key(raw) is None, "cleared by maybe_repeated"
    compact = write(("object", pairs), False, False).encode()
    if encode(from_json(compact)) == compact:
        assert duplicate_key(compact) is None, "cleared as its document written back"


def test_a_quote_written_as_an_escape_cannot_hide_a_repeated_key() -> None:
    """Each written \\u0022: is one '":' when written back, none in the raw bytes: the counts
    would match although a key repeats."""
    raw = b'{"x":[{"a":"\\u0022:"}],"a":1,"a":2}'
    assert duplicate_key(raw) == "a"
    assert maybe_repeated(raw, from_json(raw))


def test_ordinary_records_are_cleared_without_the_exact_check() -> None:
    records = [
        {"query_id": "q1", "query_response_hit_ids": ["a", "b"], "query_attributes": {"m": "x"}},
        {"results": [{"doc": {"id": "a"}, "score": 1.5}, {"doc": {"id": 'b":'}}], "n": None},
        {"deep": {"er": {"still": {"more": [[{"k": 1}], []]}}}},
    ]
    for record in records:
        raw = json.dumps(record, separators=(",", ":")).encode()
        assert not maybe_repeated(raw, from_json(raw))


def test_a_compact_record_is_its_document_written_back() -> None:
    """The common case the first test exists for: compact, UTF-8 as is, arrays of objects."""
    raw = '{"a":[{"doc":{"id":"é"}},{"doc":{"id":"x"}}],"at":1763683200.25,"n":-3}'.encode()
    assert encode(from_json(raw)) == raw
    assert encode(from_json(b'{"a":1,"a":1}')) != b'{"a":1,"a":1}'
