"""The chunked JSONL reader: the same queries and rejections as the per-line reader, faster."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.score.jsonl import read_jsonl
from evald.score.jsonl_chunks import SKIP_AFTER_MISS, Chunk, read_chunk, read_chunks
from evald.score.records import Query, Rejection

from .test_jsonl import _json_fragments, line


def per_line(raws: list[bytes]) -> tuple[list[Query], list[Rejection]]:
    """The reference: the per-line reader's queries and rejections, each in input order."""
    items = list(read_jsonl(raws, "in.jsonl"))
    return (
        [i for i in items if isinstance(i, Query)],
        [i for i in items if isinstance(i, Rejection)],
    )


def chunked(raws: list[bytes], size: int) -> tuple[list[Query], list[Rejection]]:
    chunks = list(read_chunks(raws, "in.jsonl", size))
    return (
        [q for c in chunks for q in c.queries()],
        [r for c in chunks for r in c.rejections],
    )


def typed(queries: list[Query]) -> list[tuple[object, ...]]:
    """Queries with the type of every value, so an int grade read as a float would differ."""
    return [
        (type(q.qid), q.qid, q.ranking, [(d, type(g), g) for d, g in q.qrels.items()])
        for q in queries
    ]


valid_lines = st.builds(
    lambda qid, docs, grades, extra: json.dumps(
        {
            "qid": qid,
            "ranking": docs,
            "qrels": dict(zip(docs[::-1], grades, strict=False)),
            **extra,
        },
        ensure_ascii=False,
    ),
    st.one_of(st.text(max_size=5), st.integers(-(2**70), 2**70)),
    st.lists(st.text(alphabet='ab:é\\"\u2028', max_size=4), max_size=5, unique=True),
    st.lists(
        st.one_of(st.integers(0, 2**1100), st.floats(min_value=0, allow_infinity=False)),
        max_size=5,
    ),
    st.dictionaries(st.sampled_from(["query", "x:y"]), st.text(max_size=3), max_size=1),
)
any_line = st.one_of(valid_lines, _json_fragments(), st.sampled_from(["", "  ", "[]", "{"]))


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(any_line, max_size=8),
    size=st.sampled_from([1, 2, 3, 256]),
    bom=st.booleans(),
)
def test_chunks_read_exactly_what_the_per_line_reader_reads(
    texts: list[str], size: int, bom: bool
) -> None:
    raws = [t.encode("utf-8", "surrogatepass") + b"\n" for t in texts]
    if bom and raws:
        raws[0] = "\ufeff".encode() + raws[0]
    queries, rejections = per_line(raws)
    got_queries, got_rejections = chunked(raws, size)
    assert typed(got_queries) == typed(queries)
    assert got_rejections == rejections


def test_ordinary_lines_never_reach_the_per_line_reader() -> None:
    """The speed claim: plain lines, docids with colons and integer qids are accepted here."""
    raws = [
        line(qid="q:1", ranking=["sku:1", "sku:2", "a"], qrels={"sku:2": 2, "z:z": 0.5}).encode(),
        line(qid=7, ranking=["c", "a"], qrels={"a": 1}).encode() + b"\r\n",
        line(ranking=[], qrels={}).encode(),
    ]
    with mock.patch("evald.score.jsonl_chunks.read_line", side_effect=AssertionError):
        chunk = read_chunk(raws, 0, "in.jsonl")
    assert chunk.queries() == per_line(raws)[0]
    assert [type(g) for g in chunk.qrels[0].values()] == [int, float]


@pytest.mark.parametrize(
    "text",
    [
        '{"qid": "q", "ranking": [], "qrels": {"a": 1, "a": 2}}',
        '{"qid": "q", "qid": "r", "ranking": [], "qrels": {}}',
        '{"qid": "q", "ranking": ["s:1"], "qrels": {"s:1": 1, "s:1": 2}}',
        '{"qid": "q", "ranking": [], "qrels": {"s\\u003a1": 1, "s:1": 2}}',
        '{"qid": "q", "ranking": [], "qrels": {"a": 1, "a": 2, "\\u003a": 3}}',
        '{"qid": "q", "ranking": [], "qrels": {}, "x": "a:b", "x": "c:d"}',
    ],
)
def test_repeated_keys_are_rejected_even_among_good_lines(text: str) -> None:
    good = line(ranking=["a:b"], qrels={"a:b": 1}).encode()
    raws = [good, text.encode(), good]
    queries, rejections = chunked(raws, 3)
    assert len(queries) == 2
    assert [(r.line, r.reason.split(" ")[:2]) for r in rejections] == [(2, ["duplicate", "key"])]


def test_grades_too_large_for_a_float_and_repeated_docids_are_rejected() -> None:
    raws = [
        b'{"qid": "q", "ranking": [], "qrels": {"a": 1' + b"0" * 400 + b"}}",
        line(ranking=["a", "b", "a"]).encode(),
        line().encode(),
    ]
    queries, rejections = chunked(raws, 3)
    assert queries == [Query("q1", ["a", "b"], {"a": 1})]
    assert [str(r) for r in rejections] == [
        'in.jsonl:1: grade of "a" must be finite, got an integer too large for a float',
        'in.jsonl:2: duplicate docid "a" in "ranking" (ranks 1 and 3)',
    ]


def test_lines_are_numbered_across_chunks_and_blank_lines_skipped() -> None:
    raws = [line(qid=f"q{i}").encode() for i in range(5)] + [b"\n", b"nope\n", line().encode()]
    chunks = list(read_chunks(raws, "f", 3))
    assert [len(c) for c in chunks] == [3, 2, 1]
    assert [str(r) for c in chunks for r in c.rejections] == [
        "f:7: not JSON: Expecting value: line 1 column 1 (char 0)"
    ]


def test_chunk_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="size"):
        list(read_chunks([], "f", 0))
    assert list(read_chunks([], "f", 5)) == []
    assert Chunk().queries() == []


def test_after_a_chunk_of_unknown_keys_the_per_line_reader_takes_the_next_chunks() -> None:
    """Files whose lines all carry extra keys skip the typed decode that cannot accept them."""
    extra = [line(qid=f"q{i}", query="red shoes").encode() for i in range(4)]
    plain = [line(qid=f"p{i}").encode() for i in range(2 * (SKIP_AFTER_MISS + 1))]
    chunks = list(read_chunks(extra + plain, "f", 2))
    assert [q.qid for c in chunks for q in c.queries()] == [f"q{i}" for i in range(4)] + [
        f"p{i}" for i in range(len(plain))
    ]
    fallbacks = [c.fallbacks for c in chunks]
    # the first chunk tried the typed path and missed; the next SKIP_AFTER_MISS chunks went
    # straight to the per-line reader; then the typed path took the plain lines again
    assert fallbacks[0] == 2
    assert fallbacks[1 : 1 + SKIP_AFTER_MISS] == [2] * SKIP_AFTER_MISS
    assert fallbacks[1 + SKIP_AFTER_MISS :] == [0] * (len(chunks) - 1 - SKIP_AFTER_MISS)
