"""TREC run/qrels reading and joining: trec_eval's ordering, skips and the rejections."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.score.records import Query, Rejection
from evald.score.trec import JoinStats, join, parse_grade, parse_score, read_qrels, read_run


def lines(text: str) -> list[bytes]:
    """UTF-8 lines; a lone surrogate such as \\udcff stands for an invalid byte (0xff)."""
    return [row.encode("utf-8", "surrogateescape") for row in text.splitlines(keepends=True)]


def scored(run_text: str, qrels_text: str, *, complete: bool = False) -> tuple[list, JoinStats]:
    run, run_rejected = read_run(lines(run_text), "run")
    qrels, qrels_rejected = read_qrels(lines(qrels_text), "qrels")
    stats = JoinStats()
    items = [*run_rejected, *qrels_rejected, *join(run, qrels, complete=complete, stats=stats)]
    return items, stats


def test_ranking_is_score_descending_then_docid_descending_ignoring_rank() -> None:
    run, rejected = read_run(
        lines(
            "q1 Q0 b 1 2.0 t\n"
            "q1 Q0 a 2 3.5 t\n"  # highest score, listed second with rank 2
            "q1 Q0 c 3 2.0 t\n"  # ties with b: docid descending puts c before b
            "q1 Q0 d 4 2 t\n"  # "2" equals "2.0" numerically: ties too
            "q1 Q0 e 9 -1e3 t\n"
        ),
        "run",
    )
    assert rejected == []
    assert run.ranking("q1") == ["a", "d", "c", "b", "e"]


def test_scores_are_doubles_like_trec_eval_10_not_single_floats_like_9() -> None:
    # in single precision 1.00000001 == 1.0, and the docid tie-break would put b first
    run, _ = read_run(lines("q Q0 a 1 1.00000001 t\nq Q0 b 2 1.0 t\n"), "run")
    assert run.ranking("q") == ["a", "b"]


def test_docid_tie_break_is_by_code_point_like_strcmp_on_utf8() -> None:
    run, _ = read_run(lines("q Q0 B 1 1 t\nq Q0 a 1 1 t\nq Q0 é 1 1 t\nq Q0 Z 1 1 t\n"), "run")
    # strcmp order of the UTF-8 bytes: "B" < "Z" < "a" < "é"; descending reverses it
    assert run.ranking("q") == ["é", "a", "Z", "B"]


def test_comments_blank_lines_extra_fields_and_tabs_are_accepted() -> None:
    run, rejected = read_run(
        lines("# a comment\n\n  \nq1\tQ0\td1\t1\t0.5\trun tag extra\n  # indented comment\n"),
        "run",
    )
    assert rejected == []
    assert run.ranking("q1") == ["d1"]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("q1 Q0 d1 1 0.5", "expected 6 fields (qid Q0 docid rank score tag), got 5"),
        ("q1 Q0 d1 1 high t", "score 'high' is not a number"),
        ("q1 Q0 d1 1 nan t", "score 'nan' is not a number"),
        ("q1 Q0 d1 1 1_000 t", "score '1_000' is not a number"),
        ("q1 Q0 d1 1 ٣ t", "score '٣' is not a number"),
    ],
)
def test_malformed_run_lines_are_rejected_and_their_query_left_out(row: str, reason: str) -> None:
    items, stats = scored(f"q1 Q0 d0 1 9 t\n{row}\nq2 Q0 d2 1 1 t\n", "q1 0 d0 1\nq2 0 d2 1\n")
    rejection = items[0]
    assert isinstance(rejection, Rejection)
    assert (rejection.source, rejection.line) == ("run", 2)
    assert rejection.reason.startswith(reason)
    assert rejection.reason.endswith("query 'q1' is not scored")
    assert [i.qid for i in items if isinstance(i, Query)] == ["q2"]
    assert stats.not_scored == 1


def test_invalid_utf8_lines_are_rejected_with_their_query_when_it_can_be_read() -> None:
    items, stats = scored(
        "q1 Q0 a 1 2 t\nq1 Q0 d\udcff 1 1 t\nq2 Q0 b 1 1 t\n\udcff Q0 c 1 1 t\n",
        "q1 0 a 1\nq2 0 b 1\nq2 0 \udcff 1\n",
    )
    assert [str(i) for i in items if isinstance(i, Rejection)] == [
        "run:2: not valid UTF-8 (byte 7); query 'q1' is not scored",
        "run:4: not valid UTF-8 (byte 0)",
        "qrels:3: not valid UTF-8 (byte 5); query 'q2' is not scored",  # after "q2 0 "
    ]
    assert [i for i in items if isinstance(i, Query)] == []
    assert stats.not_scored == 2


def test_scores_accept_exponents_and_infinities() -> None:
    assert parse_score("1e-3") == 0.001
    assert parse_score("-Inf") == float("-inf")
    assert parse_score("+.5") == 0.5
    assert parse_score("0x10") is None
    assert parse_grade("inf") is None
    assert parse_grade("2") == 2.0
    assert parse_grade("-1") == -1.0


def test_duplicate_docid_in_a_run_query_rejects_that_query_only() -> None:
    items, stats = scored(
        "q1 Q0 a 1 3 t\nq1 Q0 b 2 2 t\nq2 Q0 a 1 1 t\nq1 Q0 a 3 1 t\n",
        "q1 0 a 1\nq2 0 a 1\n",
    )
    assert [str(i) for i in items if isinstance(i, Rejection)] == [
        "run:4: docid 'a' appears twice in query 'q1' (also line 1); the query is not scored"
    ]
    assert [i.qid for i in items if isinstance(i, Query)] == ["q2"]
    assert stats.not_scored == 1


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("q1 0 d1", "expected 4 fields (qid iter docid grade), got 3"),
        ("q1 0 d1 1 extra", "expected 4 fields (qid iter docid grade), got 5"),
        ("q1 0 d1 high", "grade 'high' is not a finite number"),
        ("q1 0 d1 nan", "grade 'nan' is not a finite number"),
        ("q1 0 d1 inf", "grade 'inf' is not a finite number"),
        ("q1 0 d1 101", "grade '101' is above 100, the largest grade"),
        ("q1 0 d1 1e308", "grade '1e308' is above 100, the largest grade"),
        ("q1 0 a 0", "docid 'a' is judged twice for query 'q1'"),
    ],
)
def test_malformed_qrels_lines_are_rejected_and_their_query_left_out(row: str, reason: str) -> None:
    items, stats = scored("q1 Q0 a 1 1 t\nq2 Q0 b 1 1 t\n", f"q1 0 a 2\n{row}\nq2 0 b 1\n")
    rejection = items[0]
    assert isinstance(rejection, Rejection)
    assert (rejection.source, rejection.line) == ("qrels", 2)
    assert rejection.reason.startswith(reason)
    assert [i.qid for i in items if isinstance(i, Query)] == ["q2"]
    assert stats.not_scored == 1


def test_negative_grades_are_unjudged_and_counted() -> None:
    qrels, rejected = read_qrels(lines("q1 0 a -1\nq1 0 b 2\nq1 0 c 0\nq2 0 z -2\n"), "qrels")
    assert rejected == []
    assert qrels.judgments == {"q1": {"b": 2.0, "c": 0.0}, "q2": {}}
    assert qrels.negative == 2


def test_docid_judged_negative_then_positive_is_a_duplicate() -> None:
    _, rejected = read_qrels(lines("q1 0 a -1\nq1 0 a 1\n"), "qrels")
    assert [r.line for r in rejected] == [2]


def test_join_skips_unjudged_run_queries_and_missing_qrels_queries_like_trec_eval() -> None:
    items, stats = scored(
        "q3 Q0 x 1 1 t\nq1 Q0 a 1 1 t\nq9 Q0 a 1 1 t\n",
        "q1 0 a 1\nq2 0 b 1\nq3 0 x 0\n",
    )
    assert items == [
        Query(qid="q3", ranking=["x"], qrels={"x": 0.0}),
        Query(qid="q1", ranking=["a"], qrels={"a": 1.0}),
    ]
    assert (stats.unjudged, stats.missing, stats.completed) == (1, 1, 0)


def test_complete_adds_qrels_only_queries_as_empty_rankings_after_the_run_queries() -> None:
    items, stats = scored("q3 Q0 x 1 1 t\n", "q2 0 b 1\nq3 0 x 0\nq1 0 a 1\n", complete=True)
    assert [(i.qid, i.ranking) for i in items] == [("q3", ["x"]), ("q2", []), ("q1", [])]
    assert (stats.missing, stats.completed) == (2, 2)


def test_complete_does_not_score_a_qrels_only_query_with_a_bad_line() -> None:
    items, stats = scored("q1 Q0 a 1 1 t\n", "q1 0 a 1\nq2 0 b x\n", complete=True)
    assert [i.qid for i in items if isinstance(i, Query)] == ["q1"]
    assert stats.not_scored == 1 and stats.completed == 0


def test_query_whose_only_run_line_is_malformed_counts_as_not_scored() -> None:
    items, stats = scored("q1 Q0 a 1\n", "q1 0 a 1\n", complete=True)
    assert [type(i) for i in items] == [Rejection]
    assert (stats.not_scored, stats.completed) == (1, 0)


def test_rejections_come_in_line_order_whatever_the_problem() -> None:
    """Scores are parsed per query after the whole file is read: their rejections still take
    their place by line number among the others."""
    run, rejected = read_run(
        lines("q1 Q0 a 1 abc t\nq2 Q0 b 1\nq1 Q0 c 2 inf t\nq3 Q0 d 1 1e-3 t\nq3 Q0 e 2 1_0 t\n"),
        "run",
    )
    assert [(r.line, r.reason.split(";")[0]) for r in rejected] == [
        (1, "score 'abc' is not a number"),
        (2, "expected 6 fields (qid Q0 docid rank score tag), got 4"),
        (5, "score '1_0' is not a number"),
    ]
    assert run.bad == {"q1", "q2", "q3"}
    assert list(run.queries["q1"].docs) == ["c"] and list(run.queries["q1"].scores) == [math.inf]


def test_plain_scores_are_read_in_bulk_with_the_same_values() -> None:
    run, rejected = read_run(lines("q Q0 a 1 -2.5e1 t\nq Q0 b 2 .5 t\nq Q0 c 3 +3. t\n"), "run")
    assert rejected == []
    assert list(run.queries["q"].scores) == [-25.0, 0.5, 3.0]


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet="0123456789.+-eE", min_size=1, max_size=8))
def test_bulk_score_check_accepts_exactly_what_parse_score_accepts(text: str) -> None:
    """Over the characters the bulk check lets through, float() and parse_score agree."""
    try:
        bulk: float | None = float(text)
    except ValueError:
        bulk = None
    assert bulk == parse_score(text)
