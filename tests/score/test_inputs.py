"""The input adapters: items in order, then notes that account for every skip."""

from __future__ import annotations

from evald.score.inputs import JsonlInput, TrecInput
from evald.score.records import Query, Rejection


def lines(text: str) -> list[bytes]:
    return [row.encode() for row in text.splitlines(keepends=True)]


def test_jsonl_input_streams_and_has_nothing_to_note() -> None:
    source = JsonlInput([b'{"qid": "a", "ranking": [], "qrels": {}}\n', b"nope\n"], "<stdin>")
    items = list(source.items())
    assert items[0] == Query("a", [], {})
    assert isinstance(items[1], Rejection) and str(items[1]).startswith("<stdin>:2: not JSON")
    assert source.notes() == []


def test_trec_input_reports_run_then_qrels_rejections_then_queries() -> None:
    source = TrecInput(
        (lines("q1 Q0 a 1 1 t\nq2 Q0 b 1\nq3 Q0 c 1 1 t\n"), "run"),
        (lines("q1 0 a 1\nq2 0 b 1\nq3 0 c\nq4 0 d -1\nq5 0 e 1\n"), "qrels"),
        complete=False,
    )
    items = list(source.items())
    assert [str(i).split(":")[:2] for i in items if isinstance(i, Rejection)] == [
        ["run", "2"],
        ["qrels", "3"],
    ]
    assert items[2:] == [Query("q1", ["a"], {"a": 1.0})]
    assert source.notes() == [
        "2 qrels queries are not in the run and were skipped (as trec_eval does); "
        "--complete scores them as empty rankings (trec_eval -c)",
        "2 queries were not scored because of rejected lines",
        "1 judgments with a negative grade were read as unjudged (trec_eval's convention)",
    ]


def test_trec_input_notes_completed_and_unjudged_queries() -> None:
    source = TrecInput(
        (lines("q1 Q0 a 1 1 t\nq9 Q0 a 1 1 t\n"), "run"),
        (lines("q1 0 a 1\nq2 0 b 1\n"), "qrels"),
        complete=True,
    )
    assert [i.qid for i in source.items() if isinstance(i, Query)] == ["q1", "q2"]
    assert source.notes() == [
        "1 run queries have no qrels and were skipped (as trec_eval does)",
        "1 qrels queries missing from the run were scored as empty rankings (--complete)",
    ]


def test_trec_chunks_carry_the_items_in_order_as_columns() -> None:
    def source() -> TrecInput:
        return TrecInput(
            (lines("q1 Q0 a 1 1 t\nq2 Q0 b 1\nq3 Q0 c 1 1 t\nq5 Q0 e 1 1 t\n"), "run"),
            (lines("q1 0 a 1\nq2 0 b 1\nq3 0 c 1\nq5 0 e 2\n"), "qrels"),
            complete=False,
        )

    items = list(source().items())
    chunks = list(source().chunks(2))
    assert [len(c) + len(c.rejections) for c in chunks] == [2, 2]
    assert [q for c in chunks for q in c.queries()] == [i for i in items if isinstance(i, Query)]
    assert [r for c in chunks for r in c.rejections] == [
        i for i in items if isinstance(i, Rejection)
    ]


def test_jsonl_chunks_match_its_items() -> None:
    raw = [b'{"qid": "a", "ranking": ["x"], "qrels": {"x": 1}}\n', b"nope\n", b"\n"]
    (chunk,) = JsonlInput(raw, "<stdin>").chunks(10)
    items = list(JsonlInput(raw, "<stdin>").items())
    assert chunk.queries() == items[:1] and chunk.rejections == items[1:]
