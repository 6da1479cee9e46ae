"""JSONL parsing: accepted shapes, and every rejection reason with its line number."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.score.jsonl import accept_line, parse_line, read_jsonl
from evald.score.records import Query, Rejection


def line(**fields: object) -> str:
    base: dict[str, object] = {"qid": "q1", "ranking": ["a", "b"], "qrels": {"a": 1}}
    base.update(fields)
    return json.dumps(base)


def test_valid_line_keeps_order_and_grades() -> None:
    parsed = parse_line(line(ranking=["c", "a", "b"], qrels={"a": 2, "z": 0.5, "y": 100.0}))
    assert parsed == Query(qid="q1", ranking=["c", "a", "b"], qrels={"a": 2, "z": 0.5, "y": 100.0})
    assert isinstance(parsed, Query)


def test_integer_qid_is_kept_as_an_integer() -> None:
    parsed = parse_line(line(qid=17))
    assert isinstance(parsed, Query) and parsed.qid == 17


def test_unknown_keys_are_ignored_and_empty_lists_are_fine() -> None:
    parsed = parse_line(line(ranking=[], qrels={}, query="shoes", arm="B"))
    assert parsed == Query(qid="q1", ranking=[], qrels={})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON: "),
        ("[1, 2]", "expected a JSON object, got array"),
        ('"q1"', "expected a JSON object, got string"),
        ('{"ranking": [], "qrels": {}}', 'missing "qid"'),
        ('{"qid": "q", "qrels": {}}', 'missing "ranking"'),
        ('{"qid": "q", "ranking": []}', 'missing "qrels"'),
        (line(qid=True), '"qid" must be a string or an integer, got boolean'),
        (line(qid=1.5), '"qid" must be a string or an integer, got number'),
        (line(qid=None), '"qid" must be a string or an integer, got null'),
        (line(ranking="a b"), '"ranking" must be an array of strings, got string'),
        (line(ranking={"a": 1}), '"ranking" must be an array of strings, got object'),
        (line(ranking=["a", 3]), '"ranking"[1] must be a string, got number'),
        (line(ranking=["a", None]), '"ranking"[1] must be a string, got null'),
        (line(ranking=["a", "b", "a"]), 'duplicate docid "a" in "ranking" (ranks 1 and 3)'),
        (line(qrels=["a"]), '"qrels" must be an object, got array'),
        (line(qrels={"a": -1}), 'grade of "a" must be ≥ 0, got -1'),
        (line(qrels={"a": -0.5}), 'grade of "a" must be ≥ 0, got -0.5'),
        (line(qrels={"a": True}), 'grade of "a" must be a number, got boolean'),
        (line(qrels={"a": "2"}), 'grade of "a" must be a number, got string'),
        (line(qrels={"a": None}), 'grade of "a" must be a number, got null'),
        (line(qrels={"a": [1]}), 'grade of "a" must be a number, got array'),
        ('{"qid": "q", "ranking": [], "qrels": {"a": NaN}}', 'grade of "a" must be finite'),
        ('{"qid": "q", "ranking": [], "qrels": {"a": Infinity}}', 'grade of "a" must be finite'),
        ('{"qid": "q", "ranking": [], "qrels": {"a": 1e999}}', 'grade of "a" must be finite'),
        ('{"qid": "q", "ranking": [], "qrels": {"a": 1, "a": 2}}', 'duplicate key "a"'),
        (
            '{"qid": "q", "ranking": [], "qrels": {"a": 1' + "0" * 400 + "}}",
            'grade of "a" must be finite, got an integer too large for a float',
        ),
        ('{"qid": "q", "ranking": [], "qrels": {"a": 1' + "0" * 5000 + "}}", "not JSON: "),
        (line(qrels={"a": 1, "b": 1e308}), 'grade of "b" must be ≤ 100, got 1e+308'),
        (line(qrels={"a": 100.5}), 'grade of "a" must be ≤ 100, got 100.5'),
        (line(qrels={"a": 101}), 'grade of "a" must be ≤ 100, got 101'),
        ('{"qid": "q", "qid": "r", "ranking": [], "qrels": {}}', 'duplicate key "qid"'),
    ],
)
def test_rejection_reasons(text: str, reason: str) -> None:
    parsed = parse_line(text)
    assert isinstance(parsed, str)
    assert parsed.startswith(reason)


def test_reader_numbers_lines_from_one_skips_blank_lines_and_keeps_order() -> None:
    raw = [
        line(qid="a").encode(),
        b"\n",
        b"   \n",
        b"oops\n",
        line(qid="b").encode() + b"\n",
        b"\xff\xfe{}\n",
        line(qid="c", ranking=["x", "x"]).encode(),
    ]
    items = list(read_jsonl(raw, "in.jsonl"))
    assert [type(i).__name__ for i in items] == [
        "Query",
        "Rejection",
        "Query",
        "Rejection",
        "Rejection",
    ]
    assert [i.qid for i in items if isinstance(i, Query)] == ["a", "b"]
    rejections = [i for i in items if isinstance(i, Rejection)]
    assert [(r.source, r.line) for r in rejections] == [
        ("in.jsonl", 4),
        ("in.jsonl", 6),
        ("in.jsonl", 7),
    ]
    assert rejections[1].reason == "not valid UTF-8 (byte 0)"
    assert str(rejections[0]).startswith("in.jsonl:4: not JSON: ")


def test_byte_order_mark_is_ignored_on_any_line() -> None:
    bom = "\ufeff".encode()
    items = list(read_jsonl([bom + line(qid="a").encode(), bom + line(qid="b").encode()], "x"))
    assert [item.qid for item in items if isinstance(item, Query)] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"qid": "\\ud800", "ranking": [], "qrels": {}}', '"qid"'),
        ('{"qid": "q", "ranking": ["a", "x\\udfff"], "qrels": {}}', '"ranking"[1]'),
        ('{"qid": "q", "ranking": [], "qrels": {"\\udc00": 1}}', 'a key of "qrels"'),
        ('{"qid": "q", "ranking": [], "qrels": {}, "note": {"k": ["\\uD83D"]}}', '"note"["k"][0]'),
        ('{"\\ud800": 1, "qid": "q", "ranking": [], "qrels": {}}', 'the key "\\ud800"'),
        ('"\\ud800"', "the line"),
    ],
)
def test_a_lone_surrogate_anywhere_is_rejected_with_its_place(text: str, where: str) -> None:
    assert parse_line(text) == (
        f"lone surrogate in {where}: not Unicode text (an unpaired \\ud800-\\udfff escape)"
    )
    assert accept_line(text.encode()) is None


def test_a_surrogate_pair_is_one_character_and_accepted() -> None:
    parsed = parse_line('{"qid": "\\ud83d\\ude00", "ranking": ["\\uD83D\\uDE00"], "qrels": {}}')
    assert parsed == Query(qid="\U0001f600", ranking=["\U0001f600"], qrels={})


def test_crlf_line_endings_parse() -> None:
    items = list(read_jsonl([line().encode() + b"\r\n"], "x"))
    assert isinstance(items[0], Query)


def test_grades_stop_at_100_as_in_events_on_either_path() -> None:
    """Finite grades as large as 1e308 overflowed the measures' sums of squares."""
    top = line(qrels={"a": 100, "b": 100.0})
    assert (
        parse_line(top)
        == accept_line(top.encode())
        == Query("q1", ["a", "b"], {"a": 100, "b": 100.0})
    )
    for grade in (100.000001, 101, 1e308):
        above = line(qrels={"a": grade})
        assert parse_line(above) == f'grade of "a" must be ≤ 100, got {grade}'
        assert accept_line(above.encode()) is None


# --- the fast path: accept_line may only ever accept what parse_line accepts, as the same Query


@pytest.mark.parametrize(
    "text",
    [
        line(ranking=["c", "a", "b"], qrels={"a": 2, "z": 0.5}, query="shoes", qid=17),
        line(ranking=["sku:1", "sku:2"], qrels={"sku:1": 1}, qid="q:1", note={"a:b": "c:d"}),
    ],
)
def test_fast_path_accepts_an_ordinary_line_as_the_exact_path_does(text: str) -> None:
    assert accept_line(text.encode()) == parse_line(text)
    assert isinstance(accept_line(text.encode()), Query)


@pytest.mark.parametrize(
    "text",
    [
        '{"qid": "q", "ranking": [], "qrels": {"a": 1, "a": 2}}',
        '{"qid": "q", "ranking": [], "qrels": {"a" : 1, "a":2}}',  # space before one colon
        '{"qid": "q", "qid" : "r", "ranking": [], "qrels": {}}',
        '{"qid": "q", "ranking": [], "qrels": {}, "x": {"y": [{"k": 1, "k": 2}]}}',  # nested
        '{"qid": "q", "ranking": [], "qrels": {}, "x": {"k": 1}, "x": {"k": 1}}',
        '{"qid": "q", "ranking": ["s:1"], "qrels": {"s:1": 1, "s:1": 2}}',  # colons in keys
        '{"qid": "q:", "ranking": [], "qrels": {"a": 1, "a": 2, "b:c": 1}}',
        '{"qid": "q", "ranking": [], "qrels": {"s\\u003a1": 1, "s:1": 2}}',  # escaped colon
        '{"qid": "q", "ranking": [], "qrels": {"a": 1, "a": 2, "\\u003a": 3}}',  # one hides one
        '{"qid": "q", "ranking": [], "qrels": {}, "x": "a:b", "x": "c:d"}',
    ],
)
def test_duplicate_keys_anywhere_never_pass_the_fast_path(text: str) -> None:
    assert accept_line(text.encode()) is None
    (item,) = read_jsonl([text.encode()], "in.jsonl")
    assert isinstance(item, Rejection) and item.reason.startswith("duplicate key ")


@pytest.mark.parametrize(
    "text",
    [
        "\ufeff" + line(),  # byte-order mark
        line(query={"deep": [[[{"a": 1}]]]}),  # nested ignored keys are counted, not refused
    ],
)
def test_lines_the_fast_path_leaves_out_are_still_read_exactly(text: str) -> None:
    (item,) = read_jsonl([text.encode()], "in.jsonl")
    assert item == parse_line(text.removeprefix("\ufeff"))
    assert isinstance(item, Query)


def _json_fragments() -> st.SearchStrategy[str]:
    """Text close to valid rows, with the shapes that separate the two parsers."""
    scalar = st.sampled_from(
        [
            "0",
            "-0",
            "1",
            "2.5",
            "-1",
            "1e999",
            "-1e999",
            "1" + "0" * 400,
            "1e308",
            "NaN",
            "Infinity",
            "true",
            "false",
            "null",
            '"2"',
            '"a"',
            '"a:b"',
            '"\\ud800"',
            "01",
            "1.",
            "[]",
            "{}",
            '{"a": 1}',
            '{"a": 1, "a": 1}',
            '[1, {"k": 2}]',
        ]
    )
    doc = st.sampled_from(
        ['"a"', '"b"', '"c"', '"a:b"', '"a\\u003ab"', '"\\u0061"', "1", "null", '"é"', '":"']
    )
    ranking = st.one_of(st.lists(doc, max_size=4).map(lambda d: "[" + ", ".join(d) + "]"), scalar)
    pair = st.tuples(
        doc.filter(lambda d: d.startswith('"')), scalar, st.sampled_from([":", " :", ": "])
    )
    qrels = st.one_of(
        st.lists(pair, max_size=4).map(
            lambda ps: "{" + ", ".join(k + c + v for k, v, c in ps) + "}"
        ),
        scalar,
    )
    field = st.one_of(
        st.tuples(st.just('"qid"'), st.one_of(scalar, doc)),
        st.tuples(st.just('"ranking"'), ranking),
        st.tuples(st.just('"qrels"'), qrels),
        st.tuples(st.sampled_from(['"query"', '"qid"', '"x:y"']), scalar),
    )
    required = st.tuples(
        st.tuples(st.just('"qid"'), st.one_of(doc, scalar)),
        st.tuples(st.just('"ranking"'), ranking),
        st.tuples(st.just('"qrels"'), qrels),
    )
    return st.tuples(required, st.lists(field, max_size=3), st.permutations(range(6))).map(
        lambda t: "{" + ", ".join(f"{k}: {v}" for k, v in _shuffled([*t[0], *t[1]], t[2])) + "}"
    )


def _shuffled(items: list[tuple[str, str]], order: list[int]) -> list[tuple[str, str]]:
    ranked = sorted(range(len(items)), key=lambda i: order[i] if i < len(order) else i)
    return [items[i] for i in ranked]


@settings(max_examples=400, deadline=None)
@given(text=_json_fragments())
def test_fast_path_never_disagrees_with_the_exact_path(text: str) -> None:
    exact = parse_line(text)
    fast = accept_line(text.encode("utf-8", "surrogatepass"))
    if fast is not None:
        assert isinstance(exact, Query) and fast == exact
        assert [type(v) for v in fast] == [type(v) for v in exact]


number_texts = st.one_of(
    st.floats(min_value=0, allow_infinity=False).map(repr),
    st.from_regex(r"\A(0|[1-9][0-9]{0,24})(\.[0-9]{1,25})?([eE][-+]?[0-9]{1,3})?\Z"),
)


@settings(max_examples=300, deadline=None)
@given(grades=st.lists(number_texts, min_size=1, max_size=4))
def test_fast_path_reads_every_number_to_the_same_value_as_json(grades: list[str]) -> None:
    """Both parsers must round a decimal to the same float (or keep the same integer)."""
    pairs = ", ".join(f'"d{i}": {g}' for i, g in enumerate(grades))
    text = f'{{"qid": "q", "ranking": ["d0"], "qrels": {{{pairs}}}}}'
    exact = parse_line(text)
    fast = accept_line(text.encode())
    if isinstance(exact, Query):  # grades from 0 to 100: nothing sends it to the exact path
        assert fast is not None
    if fast is not None:
        assert isinstance(exact, Query)
        assert [(type(g), g) for g in fast.qrels.values()] == [
            (type(g), g) for g in exact.qrels.values()
        ]
