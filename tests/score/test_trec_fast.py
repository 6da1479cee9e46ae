"""The whole-file TREC readers accept only what the line readers accept, as the same values."""

from __future__ import annotations

import io

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evald.score.trec import Run, read_qrels, read_qrels_lines, read_run, read_run_lines
from evald.score.trec_fast import fast_qrels, fast_run

qids = st.sampled_from(["1", "2", "q3", "#4", "10"])
docs = st.sampled_from(["d1", "d2", "d3", "doc-4", "é5", "d6"])
scores = st.sampled_from(
    ["1", "2.5", "-0.5", "1e3", ".5", "3.", "inf", "-inf", "nan", "abc", "1e", "--1", "1_0", "+2"]
)
seps = st.sampled_from([" ", " ", " ", "\t", "  ", " \x0b", "\xa0"])


@st.composite
def run_text(draw: st.DrawFn) -> bytes:
    lines = []
    for _ in range(draw(st.integers(0, 14))):
        fields = [draw(qids), "Q0", draw(docs), str(draw(st.integers(1, 9))), draw(scores), "t"]
        fields = fields[: draw(st.sampled_from([6, 6, 6, 6, 5]))]
        if draw(st.integers(0, 9)) == 0:
            fields.append("extra")
        sep = draw(seps)
        lines.append(sep.join(fields))
        if draw(st.integers(0, 19)) == 0:
            lines.append(draw(st.sampled_from(["", "  ", "# comment", "\ufeffq Q0 d 1 1 t"])))
    end = draw(st.sampled_from(["\n", "\r\n"]))
    text = end.join(lines) + draw(st.sampled_from([end, ""]))
    return text.encode()


def same_run(fast: Run, slow: Run) -> None:
    assert list(fast.queries) == list(slow.queries)
    for qid in fast.queries:
        assert fast.ranking(qid) == slow.ranking(qid)
        assert fast.duplicates(qid) == slow.duplicates(qid)
        a, b = fast.queries[qid], slow.queries[qid]
        assert list(a.lines) == list(b.lines)
        np.testing.assert_array_equal(np.asarray(a.scores), np.asarray(b.scores))


@settings(max_examples=400, deadline=None)
@given(data=run_text())
@example(data=b"1 Q0 d1 1 2 t\n1 Q0 d2 2 1 t\n2 Q0 d1 1 1 t\n")
@example(data=b"1 Q0 d1 1 2 t\n2 Q0 d1 1 1 t\n1 Q0 d2 2 1 t\n")  # a query in two places
@example(data=b"1 Q0 d1 1 2 t t\n1 Q0 d2 2 1\n")  # 7 + 5 fields: 12 in all
def test_fast_run_reader_agrees_with_the_line_reader(data: bytes) -> None:
    slow, slow_rejected = read_run_lines(io.BytesIO(data), "run")
    fast = fast_run(data)
    if fast is not None:
        assert slow_rejected == [] and not slow.bad
    got, rejected = read_run([data], "run")
    assert rejected == slow_rejected
    assert got.bad == slow.bad
    same_run(got, slow)


@st.composite
def qrels_text(draw: st.DrawFn) -> bytes:
    grades = st.sampled_from(["0", "1", "2", "-1", "1.5", "abc", "1e999", "3e0"])
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        fields = [draw(qids), "0", draw(docs), draw(grades)][: draw(st.sampled_from([4, 4, 4, 3]))]
        lines.append(draw(seps).join(fields))
    return ("\n".join(lines) + draw(st.sampled_from(["\n", ""]))).encode()


@settings(max_examples=400, deadline=None)
@given(data=qrels_text())
@example(data=b"1 0 d1 1\n1 0 d1 2\n")
def test_fast_qrels_reader_agrees_with_the_line_reader(data: bytes) -> None:
    slow, slow_rejected = read_qrels_lines(io.BytesIO(data), "qrels")
    if fast_qrels(data) is not None:
        assert slow_rejected == [] and not slow.bad and slow.negative == 0
    got, rejected = read_qrels([data], "qrels")
    assert rejected == slow_rejected
    assert (got.judgments, got.bad, got.negative) == (slow.judgments, slow.bad, slow.negative)
    assert list(got.judgments) == list(slow.judgments)


def test_ordinary_files_take_the_fast_path() -> None:
    run = b"".join(
        f"{q} Q0 d{d} {d} {10 - d / 3:.2f} tag\n".encode() for q in range(3) for d in range(9)
    )
    qrels = b"".join(f"{q} 0 d{d} {d % 3}\n".encode() for q in range(3) for d in range(0, 9, 2))
    assert fast_run(run) is not None
    assert fast_qrels(qrels) is not None
