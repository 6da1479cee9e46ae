"""`evald score` end to end through ``evald.cli.main``, checked against pytrec_eval (trec_eval)."""

from __future__ import annotations

import ast
import gc
import gzip
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import numpy as np
import pytest
import pytrec_eval
from hypothesis import given, settings
from hypothesis import strategies as st

import evald.cli
import evald.score.inputs
import evald.score.trec_columns
from evald.metrics import DEFAULT_MEASURES
from evald.score.scoring import BatchScorer

if TYPE_CHECKING:  # fixture types only; conftest is never imported as a module
    from tests.score.conftest import Evald, WriteJsonl

#: the command table narrowed to `score`, as the evald_main fixture does
SCORE_ONLY = {"score": "evald.score.command"}

DATA = Path(__file__).resolve().parents[2] / "evald" / "data"

#: evald name -> (pytrec_eval measure, key in its results)
TREC_EQUIVALENTS = {
    "nDCG@10": ("ndcg_cut.10", "ndcg_cut_10"),
    "nDCG": ("ndcg", "ndcg"),
    "RR": ("recip_rank", "recip_rank"),
    "P@5": ("P.5", "P_5"),
    "R@5": ("recall.5", "recall_5"),
    "AP": ("map", "map"),
    "AP@5": ("map_cut.5", "map_cut_5"),
    "Success@5": ("success.5", "success_5"),
    "Bpref": ("bpref", "bpref"),
    "NumRet": ("num_ret", "num_ret"),
    "SetF": ("set_F", "set_F"),
}


def means(text: str) -> dict[str, object]:
    """A --mean JSON object without its intervals (tested on their own below)."""
    return {k: v for k, v in json.loads(text).items() if not k.startswith("ci95(")}


def row(qid: object, ranking: list[str], qrels: dict[str, object]) -> dict[str, object]:
    return {"qid": qid, "ranking": ranking, "qrels": qrels}


# --- JSONL input ---------------------------------------------------------------------------


def test_per_query_rows_in_input_order_with_canonical_keys(
    evald_main: Evald, jsonl_file: WriteJsonl
) -> None:
    path = jsonl_file(
        row("b", ["d1", "d2", "d3"], {"d2": 1, "d9": 1}),
        row(7, ["d1"], {"d1": 2}),
        row("a", [], {"d1": 1}),
    )
    result = evald_main("score", path, "--measures", "RR,P@2,MRR,Hit@1,R@3")
    assert result.status == 0 and result.err == ""
    rows = result.rows()
    assert [list(r) for r in rows] == [["qid", "RR", "P@2", "Success@1", "R@3"]] * 3
    assert rows == [
        {"qid": "b", "RR": 0.5, "P@2": 0.5, "Success@1": 0.0, "R@3": 0.5},
        {"qid": 7, "RR": 1.0, "P@2": 0.5, "Success@1": 1.0, "R@3": 1.0},
        {"qid": "a", "RR": 0.0, "P@2": 0.0, "Success@1": 0.0, "R@3": 0.0},
    ]


def test_default_measures_are_the_documented_set(evald_main: Evald, jsonl_file: WriteJsonl) -> None:
    result = evald_main("score", jsonl_file(row("q", ["a"], {"a": 1})))
    assert list(result.rows()[0])[1:] == DEFAULT_MEASURES.split(",")


def test_reads_stdin_when_no_file_or_dash(evald_main: Evald) -> None:
    data = (json.dumps(row("q1", ["x", "y"], {"y": 3})) + "\n").encode()
    for argv in (["score", "-m", "RR"], ["score", "-", "-m", "RR"]):
        result = evald_main(*argv, stdin=data)
        assert result.status == 0
        assert result.rows() == [{"qid": "q1", "RR": 0.5}]


def test_bad_lines_are_reported_skipped_and_make_the_status_1(
    evald_main: Evald, jsonl_file
) -> None:
    path = jsonl_file(
        row("ok1", ["a"], {"a": 1}),
        "this is not json",
        row("dup", ["a", "b", "a"], {"a": 1}),
        row("neg", ["a"], {"a": -1}),
        row("nan", ["a"], {"a": float("nan")}),
        row("boolean", ["a"], {"a": True}),
        row(["list"], ["a"], {"a": 1}),
        row("ok2", ["b", "a"], {"a": 1}),
    )
    result = evald_main("score", path, "-m", "RR")
    assert result.status == 1
    assert result.rows() == [{"qid": "ok1", "RR": 1.0}, {"qid": "ok2", "RR": 0.5}]
    err = result.err.splitlines()
    assert [line.split(": ", 1)[0] for line in err[:6]] == [f"{path}:{n}" for n in range(2, 8)]
    assert "not JSON" in err[0]
    # ranks as the user counts them, rank 1 first (docs/score.md), not list indices
    assert err[1] == f'{path}:3: duplicate docid "a" in "ranking" (ranks 1 and 3)'
    assert "must be ≥ 0" in err[2]
    assert "must be finite" in err[3]
    assert "got boolean" in err[4]
    assert '"qid" must be a string or an integer' in err[5]
    assert err[6] == "evald score: 6 line(s) rejected; 2 queries scored"


@pytest.mark.filterwarnings("error")  # numpy's overflow warning fails the test
@pytest.mark.parametrize("trec", [False, True])
def test_a_grade_above_100_is_rejected_by_line_and_field_as_in_events(
    evald_main: Evald, jsonl_file: WriteJsonl, tmp_path: Path, trec: bool
) -> None:
    """A finite grade of 1e308 overflowed the sums of squares of ``--mean``'s interval (numpy
    warned, the interval was null) and 2^grade gains; grades stop at 100, as in events."""
    measures = ["-m", "DCG@10,nDCG(dcg='exp-log2')@10", "--mean", "--format", "json"]
    if trec:
        (tmp_path / "run").write_text("q1 Q0 a 1 2 t\nq1 Q0 b 2 1 t\nq2 Q0 a 1 1 t\n")
        (tmp_path / "qrels").write_text("q1 0 a 1e308\nq1 0 b 1\nq2 0 a 100\nq3 0 a 2\n")
        files = ["--run", str(tmp_path / "run"), "--qrels", str(tmp_path / "qrels")]
        where = f"{tmp_path / 'qrels'}:1: grade '1e308' is above 100, the largest grade"
    else:
        path = jsonl_file(row("q1", ["a", "b"], {"a": 1e308, "b": 1}), row("q2", ["a"], {"a": 100}))
        files, where = [path], f'{path}:1: grade of "a" must be ≤ 100, got 1e+308'
    result = evald_main("score", *files, *measures)
    assert result.status == 1
    assert result.err.splitlines()[0].startswith(where)
    (mean,) = result.rows()
    assert mean["n"] == 1 and mean["DCG@10"] == 100.0  # q2 alone
    assert mean["nDCG(dcg='exp-log2')@10"] == 1.0


def test_gauc_is_only_in_the_mean(evald_main: Evald, jsonl_file: WriteJsonl) -> None:
    path = jsonl_file(
        row("a", ["r", "n"], {"r": 1, "n": 0}),
        row("b", ["n1", "n2", "r"], {"r": 1, "n1": 0, "n2": 0}),
    )
    rows = evald_main("score", path, "-m", "AUC,GAUC").rows()
    assert rows == [{"qid": "a", "AUC": 1.0}, {"qid": "b", "AUC": 0.0}]
    mean = json.loads(evald_main("score", path, "-m", "AUC,GAUC", "--mean").out)
    from scipy import stats

    # AUC 1 and 0: a binary measure, so the Wilson interval of 1 in 2 (docs/score.md)
    wilson = stats.binomtest(1, 2).proportion_ci(confidence_level=0.95, method="wilson")
    assert mean == {"n": 2, "AUC": 0.5, "ci95(AUC)": pytest.approx([wilson.low, wilson.high]),
                    "GAUC": pytest.approx(0.4)}  # fmt: skip


# --- means and output destinations ---------------------------------------------------------


def test_mean_is_json_when_not_a_terminal_and_a_table_on_one(
    evald_main: Evald, jsonl_file: WriteJsonl
) -> None:
    path = jsonl_file(row("a", ["x"], {"x": 1}), row("b", ["y", "x"], {"x": 1}))
    as_json = evald_main("score", path, "-m", "RR,P@1", "--mean")
    assert means(as_json.out) == {"n": 2, "RR": 0.75, "P@1": 0.5}
    table = evald_main("score", path, "-m", "RR,P@1", "--mean", tty=True)
    assert table.out.splitlines() == [
        "measure    mean            95% CI  n",
        "RR       0.7500  [0.0103, 0.9988]  2",  # tests/score/test_intervals.py checks these
        "P@1      0.5000  [0.0945, 0.9055]  2",
    ]
    forced = evald_main("score", path, "-m", "RR", "--mean", "--format", "table")
    assert forced.out.splitlines()[0].split() == ["measure", "mean", "95%", "CI", "n"]
    forced_json = evald_main("score", path, "-m", "RR", "--mean", "--format", "json", tty=True)
    assert means(forced_json.out) == {"n": 2, "RR": 0.75}


def test_output_file_gets_rows_while_the_mean_goes_to_stdout(
    evald_main: Evald, jsonl_file: WriteJsonl, tmp_path: Path
) -> None:
    out = tmp_path / "rows.jsonl"
    path = jsonl_file(row("a", ["x"], {"x": 1}), row("b", ["y"], {"x": 1}))
    result = evald_main("score", path, "-m", "RR", "--output", str(out), "--mean")
    assert means(result.out) == {"n": 2, "RR": 0.5}
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows == [{"qid": "a", "RR": 1.0}, {"qid": "b", "RR": 0.0}]


def test_batches_do_not_change_the_output(evald_main: Evald, jsonl_file: WriteJsonl) -> None:
    rows = [row(f"q{i}", [f"d{j}" for j in range(i % 7)], {f"d{i % 5}": i % 3}) for i in range(23)]
    path = jsonl_file(*rows)
    one = evald_main("score", path, "--batch-size", "100").rows()
    many = evald_main("score", path, "--batch-size", "4").rows()
    assert len(one) == len(many) == 23
    for a, b in zip(one, many, strict=True):
        assert list(a) == list(b) and a["qid"] == b["qid"]
        values = {k: v for k, v in a.items() if k != "qid"}
        assert values == pytest.approx({k: b[k] for k in values}, rel=1e-12, abs=1e-15)


def test_empty_input_scores_nothing(evald_main: Evald, jsonl_file: WriteJsonl) -> None:
    result = evald_main("score", jsonl_file(), "-m", "RR", "--mean")
    assert result.status == 0
    assert json.loads(result.out) == {"n": 0, "RR": None}


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_left_as_it_was(
    evald_main: Evald, jsonl_file: WriteJsonl, enabled: bool
) -> None:
    """Scoring pauses the cyclic collector; the caller's setting comes back, even after an error."""
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        seen: list[bool] = []
        real_add = BatchScorer.add_many

        def spy(self: BatchScorer, *columns: Any) -> None:
            seen.append(gc.isenabled())
            real_add(self, *columns)

        with mock.patch.object(BatchScorer, "add_many", spy):
            assert evald_main("score", jsonl_file(row("q1", ["a"], {"a": 1}))).status == 0
        assert seen == [False] and gc.isenabled() is enabled
        boom = mock.patch.object(BatchScorer, "flush", side_effect=RuntimeError("boom"))
        with boom, pytest.raises(RuntimeError, match="boom"):
            evald_main("score", jsonl_file(row("q1", ["a"], {"a": 1})))
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


# --- usage errors --------------------------------------------------------------------------


def test_bad_measure_is_a_usage_error_listing_valid_forms(
    evald_main: Evald, jsonl_file: WriteJsonl
) -> None:
    result = evald_main("score", jsonl_file(), "--measures", "nDCG@10,ndcg_cutt_10")
    assert result.status == 2
    assert result.out == ""
    assert result.err.startswith("evald score: error: ")
    assert "valid forms" in result.err and "nDCG@k" in result.err


def test_empty_measure_list_is_a_usage_error_not_the_default(
    evald_main: Evald, jsonl_file: WriteJsonl
) -> None:
    result = evald_main("score", jsonl_file(), "--measures", "")
    assert result.status == 2 and "no measure given" in result.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--run", "r.txt"], "--run and --qrels go together"),
        (["--qrels", "q.txt"], "--run and --qrels go together"),
        (["in.jsonl", "--example"], "give one input"),
        (["in.jsonl", "--run", "r", "--qrels", "q"], "give one input"),
        (["in.jsonl", "--complete"], "--complete applies to --run/--qrels input"),
        (["--run", "-", "--qrels", "-"], "cannot both read stdin"),
        (["does/not/exist.jsonl"], "cannot read does/not/exist.jsonl: No such file"),
    ],
)
def test_conflicting_options_and_missing_files_exit_2(
    evald_main: Evald, argv: list[str], message: str
) -> None:
    result = evald_main("score", *argv)
    assert result.status == 2
    assert message in result.err


def test_unwritable_output_is_a_usage_error(
    evald_main: Evald, jsonl_file: WriteJsonl, tmp_path: Path
) -> None:
    result = evald_main("score", jsonl_file(), "--output", str(tmp_path / "no" / "dir" / "x"))
    assert result.status == 2 and "cannot write" in result.err


def test_output_onto_an_input_is_refused_before_truncating_it(
    evald_main: Evald, jsonl_file: WriteJsonl
) -> None:
    path = jsonl_file(row("a", ["x"], {"x": 1}))
    before = Path(path).read_text()
    result = evald_main("score", path, "--output", path)
    assert result.status == 2 and "is also an input" in result.err
    assert Path(path).read_text() == before


def test_a_gzip_compressed_input_is_a_usage_error_saying_so(
    evald_main: Evald, jsonl_file: WriteJsonl, tmp_path: Path
) -> None:
    """It was rejected line by line as not UTF-8 (exit 1, "0 queries scored")."""
    packed = tmp_path / "in.jsonl.gz"
    packed.write_bytes(gzip.compress(Path(jsonl_file(row("a", ["x"], {"x": 1}))).read_bytes()))
    qrels = tmp_path / "q.txt"
    qrels.write_text("a 0 x 1\n")
    for argv in ([str(packed)], ["--run", str(packed), "--qrels", str(qrels)]):
        result = evald_main("score", *argv)
        assert result.status == 2, argv
        assert f"{packed} is gzip-compressed: evald score reads plain text" in result.err


@pytest.mark.parametrize(
    "argv",
    [
        ["--batch-size", "0"],
        # a traceback ("Too many decimal digits in format string"), or gigabytes of zeros
        ["--digits", "1" + "0" * 400, "--format", "trec"],
        ["--digits", "31", "--format", "trec"],
        ["--digits", "0"],
    ],
)
def test_counts_out_of_range_are_usage_errors(
    evald_main: Evald, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        evald_main("score", "--example", *argv)
    assert exc.value.code == 2
    assert f"argument {argv[0]}: " in capsys.readouterr().err


def test_help_shows_examples_and_the_real_default_measures(
    evald_main: Evald, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        evald_main("score", "--help")
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "--run evald/data/example.run --qrels evald/data/" in text
    assert DEFAULT_MEASURES in text.replace("\n", "").replace(" ", "")


@pytest.mark.parametrize("argv", [["score", "--help"], ["score", "--no-such-option"]])
def test_help_and_usage_errors_do_not_depend_on_the_parsers_built(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`evald score ...` builds only score's parser (the other commands' imports cost start-up
    time); what it prints must be what the parser of every command prints."""
    printed = []
    for only in ("score", None):
        with pytest.raises(SystemExit) as exc:
            evald.cli.build_parser(only).parse_args(argv)
        printed.append((exc.value.code, capsys.readouterr()))
    assert printed[0] == printed[1]
    assert printed[0][1].out or printed[0][1].err


# --- TREC input against trec_eval (pytrec_eval) --------------------------------------------


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_score_ties_are_broken_by_docid_descending(evald_main: Evald, tmp_path: Path) -> None:
    # all three docs tie on score; trec_eval orders them c, b, a, so the relevant "a" is third
    run = write(tmp_path / "run", ["q1 Q0 a 1 5 t", "q1 Q0 b 2 5 t", "q1 Q0 c 3 5 t"])
    qrels = write(tmp_path / "qrels", ["q1 0 a 1", "q1 0 b 0"])
    result = evald_main("score", "--run", run, "--qrels", qrels, "-m", "RR,P@2,AP")
    assert result.rows() == [{"qid": "q1", "RR": 1 / 3, "P@2": 0.0, "AP": 1 / 3}]
    evaluator = pytrec_eval.RelevanceEvaluator({"q1": {"a": 1, "b": 0}}, {"recip_rank"})
    assert evaluator.evaluate({"q1": {"a": 5.0, "b": 5.0, "c": 5.0}})["q1"]["recip_rank"] == 1 / 3


trec_docs = st.sampled_from([f"d{i}" for i in range(12)])
trec_queries = st.sampled_from(["q1", "q2", "q3", "q10", "Q4"])


def first_m(run: dict[str, dict[str, float]], m: int | None) -> dict[str, dict[str, float]]:
    """The run cut to each query's first m documents in trec_eval's order (trec_eval -M)."""
    if m is None:
        return run
    return {
        qid: dict(sorted(((d, s) for d, s in docs.items()), key=lambda ds: (ds[1], ds[0]))[-m:])
        for qid, docs in run.items()
    }


@pytest.mark.parametrize(
    ("flags", "judged_only", "max_docs"),
    [
        ((), False, None),
        (("-J",), True, None),
        (("-M", "3"), False, 3),
        (("-J", "-M", "2"), True, 2),
    ],
)
@settings(max_examples=40, deadline=None)
@given(
    run=st.dictionaries(
        trec_queries,
        st.dictionaries(trec_docs, st.sampled_from([0.5, 1.0, 1.0, 2.25, -3.0]), min_size=1),
        min_size=1,
    ),
    qrels=st.dictionaries(
        trec_queries,
        # at least one grade >= 0 per query: pytrec_eval was seen to hang, after earlier
        # evaluations in the same process, on a query whose every judgment is negative (see
        # test_query_with_only_negative_judgments_scores_zero for evald's answer)
        st.dictionaries(trec_docs, st.integers(-1, 3), min_size=1).filter(
            lambda judged: max(judged.values()) >= 0
        ),
        min_size=1,
    ),
)
def test_trec_files_score_like_trec_eval(
    run: dict, qrels: dict, flags: tuple[str, ...], judged_only: bool, max_docs: int | None
) -> None:
    """Ties in score (0.5/1.0/2.25 repeat), unjudged and negatively judged docs, queries on one
    side only, with and without -J and -M: every per-query value equals pytrec_eval's within
    1e-9 (it has no -M: it is given the run cut to M documents)."""
    with mock.patch.object(evald.cli, "COMMANDS", SCORE_ONLY), tempfile.TemporaryDirectory() as tmp:
        run_path = write(
            Path(tmp, "run"),
            [
                f"{qid} Q0 {doc} {rank} {score!r} tag"
                for qid, docs in run.items()
                for rank, (doc, score) in enumerate(docs.items(), start=1)
            ],
        )
        qrels_path = write(
            Path(tmp, "qrels"),
            [
                f"{qid} 0 {doc} {grade}"
                for qid, docs in qrels.items()
                for doc, grade in docs.items()
            ],
        )
        out_path = Path(tmp, "out.jsonl")
        status = evald.cli.main(
            ["score", "--run", run_path, "--qrels", qrels_path, "--output", str(out_path),
             "-m", ",".join(TREC_EQUIVALENTS), *flags]
        )  # fmt: skip
        ours = {r["qid"]: r for r in map(json.loads, out_path.read_text().splitlines())}
    assert status == 0
    expected = pytrec_eval.RelevanceEvaluator(
        qrels, {trec for trec, _ in TREC_EQUIVALENTS.values()}, judged_docs_only_flag=judged_only
    ).evaluate(first_m(run, max_docs))
    assert set(ours) == set(expected) == set(run) & set(qrels)
    for qid, values in expected.items():
        for name, (_, key) in TREC_EQUIVALENTS.items():
            assert ours[qid][name] == pytest.approx(values[key], abs=1e-9), (qid, name)


def test_query_with_only_negative_judgments_scores_zero(evald_main: Evald, tmp_path: Path) -> None:
    """Every judgment unjudged: no relevant document, so 0 everywhere (trec_eval, run alone on
    such a query, prints 0 too) — and the query is scored, not skipped: it is in the qrels."""
    run = write(tmp_path / "run", ["q1 Q0 a 1 2 t", "q1 Q0 b 2 1 t"])
    qrels = write(tmp_path / "qrels", ["q1 0 a -1", "q1 0 b -1"])
    result = evald_main("score", "--run", run, "--qrels", qrels, "-m", ",".join(TREC_EQUIVALENTS))
    zeros = dict.fromkeys(TREC_EQUIVALENTS, 0.0)
    assert result.rows() == [{"qid": "q1", **zeros, "NumRet": 2.0}]  # a count, not a quality


def test_trec_skips_and_complete_are_reported(evald_main: Evald, tmp_path: Path) -> None:
    run = write(tmp_path / "run", ["q1 Q0 a 1 2 t", "q9 Q0 a 1 2 t", "q8 Q0 a 1 2 t"])
    qrels = write(tmp_path / "qrels", ["q1 0 a 1", "q2 0 b 1", "q2 0 c -1"])
    plain = evald_main("score", "--run", run, "--qrels", qrels, "-m", "RR,P@1")
    assert plain.status == 0
    assert plain.rows() == [{"qid": "q1", "RR": 1.0, "P@1": 1.0}]
    assert plain.err.splitlines() == [
        "evald score: 2 run queries have no qrels and were skipped (as trec_eval does)",
        "evald score: 1 qrels queries are not in the run and were skipped (as trec_eval does); "
        "--complete scores them as empty rankings (trec_eval -c)",
        "evald score: 1 judgments with a negative grade were read as unjudged "
        "(trec_eval's convention)",
    ]
    complete = evald_main("score", "--run", run, "--qrels", qrels, "-m", "RR,P@1", "--complete")
    assert complete.rows() == [
        {"qid": "q1", "RR": 1.0, "P@1": 1.0},
        {"qid": "q2", "RR": 0.0, "P@1": 0.0},
    ]
    assert "1 qrels queries missing from the run were scored as empty" in complete.err
    mean = evald_main("score", "--run", run, "--qrels", qrels, "-m", "RR", "--complete", "--mean")
    assert means(mean.out) == {"n": 2, "RR": 0.5}


def test_trec_rejections_name_file_and_line_and_set_status_1(
    evald_main: Evald, tmp_path: Path
) -> None:
    run = write(
        tmp_path / "run",
        ["q1 Q0 a 1 2 t", "q1 Q0 a 2 1 t", "q2 Q0 b 1 x t", "q3 Q0 c 1 1", "q4 Q0 d 1 1 t"],
    )
    qrels = write(tmp_path / "qrels", ["q1 0 a 1", "q2 0 b 1", "q3 0 c 1", "q4 0 d 1", "q4 0 e"])
    result = evald_main("score", "--run", run, "--qrels", qrels, "-m", "RR")
    assert result.status == 1
    assert result.out == ""
    err = result.err.splitlines()
    assert err[0].startswith(f"{run}:3: score 'x' is not a number")
    assert err[1].startswith(f"{run}:4: expected 6 fields")
    assert err[2].startswith(f"{qrels}:5: expected 4 fields")
    assert err[3].startswith(f"{run}:2: docid 'a' appears twice in query 'q1' (also line 1)")
    assert "evald score: 4 line(s) rejected; 0 queries scored" in err
    assert "evald score: 4 queries were not scored because of rejected lines" in err


def test_a_lone_surrogate_is_reported_and_the_good_lines_still_scored(
    evald_main: Evald, tmp_path: Path
) -> None:
    path = write(
        tmp_path / "in.jsonl",
        [
            '{"qid": "\\ud800", "ranking": ["a"], "qrels": {"a": 1}}',
            '{"qid": "ok", "ranking": ["b", "a"], "qrels": {"a": 1}}',
        ],
    )
    result = evald_main("score", path, "-m", "RR")
    assert result.status == 1
    assert result.rows() == [{"qid": "ok", "RR": 0.5}]
    assert result.err.splitlines()[0].startswith(f'{path}:1: lone surrogate in "qid"')


def test_a_byte_order_mark_is_ignored_on_any_line_of_either_input(
    evald_main: Evald, tmp_path: Path
) -> None:
    bom = "\ufeff"
    path = write(tmp_path / "in.jsonl", [bom + json.dumps(row(q, ["a"], {"a": 1})) for q in "xy"])
    assert [r["qid"] for r in evald_main("score", path, "-m", "RR").rows()] == ["x", "y"]
    run = write(tmp_path / "run", [bom + "q1 Q0 a 1 2 t", bom + "q2 Q0 b 1 1 t"])
    qrels = write(tmp_path / "qrels", [bom + "q1 0 a 1", bom + "q2 0 b 1"])
    result = evald_main("score", "--run", run, "--qrels", qrels, "-m", "RR")
    assert (result.status, result.rows()) == (
        0,
        [{"qid": "q1", "RR": 1.0}, {"qid": "q2", "RR": 1.0}],
    )


def test_trec_run_from_stdin(evald_main: Evald, tmp_path: Path) -> None:
    qrels = write(tmp_path / "qrels", ["q1 0 b 1"])
    result = evald_main(
        "score", "--run", "-", "--qrels", qrels, "-m", "RR", stdin=b"q1 Q0 a 1 2 t\nq1 Q0 b 2 1 t\n"
    )
    assert result.rows() == [{"qid": "q1", "RR": 0.5}]


# --- the bundled example and the real process ----------------------------------------------


def test_bundled_example_jsonl_and_trec_files_agree(evald_main: Evald) -> None:
    """The example ships in both formats; the run's scores fall with the served rank."""
    example = evald_main("score", "--example")
    trec = evald_main(
        "score", "--run", str(DATA / "example.run"), "--qrels", str(DATA / "example.qrels")
    )
    assert example.status == trec.status == 0
    assert len(example.rows()) == 30
    assert example.out == trec.out


def test_python_dash_m_evald_runs_the_command(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(DATA.parents[1])}
    version = subprocess.run(
        [sys.executable, "-m", "evald", "--version"], capture_output=True, text=True, env=env
    )
    assert version.returncode == 0 and version.stdout.startswith("evald ")
    scored = subprocess.run(
        [sys.executable, "-m", "evald", "score", "--example", "--mean", "-m", "nDCG@10,RR"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert scored.returncode == 0, scored.stderr
    mean = json.loads(scored.stdout)
    assert mean["n"] == 30 and set(mean) == {"n", "nDCG@10", "RR", "ci95(nDCG@10)", "ci95(RR)"}
    assert 0 < mean["nDCG@10"] < 1


def test_gmap_is_only_in_the_mean_and_is_trec_evals_geometric_mean(
    evald_main: Evald, tmp_path: Path
) -> None:
    run = {"q1": {"a": 2.0, "b": 1.0}, "q2": {"c": 1.0, "d": 0.5}, "q3": {"e": 1.0}}
    qrels = {"q1": {"b": 1}, "q2": {"c": 2, "x": 1}, "q3": {"e": 0}}  # q3: AP 0, floored
    run_path = write(
        tmp_path / "run",
        [f"{q} Q0 {d} 1 {s} t" for q, docs in run.items() for d, s in docs.items()],
    )
    qrels_path = write(
        tmp_path / "qrels", [f"{q} 0 {d} {g}" for q, docs in qrels.items() for d, g in docs.items()]
    )
    result = evald_main("score", "--run", run_path, "--qrels", qrels_path, "-m", "GMAP,AP")
    assert [set(row) for row in result.rows()] == [{"qid", "AP"}] * 3
    means = json.loads(
        evald_main("score", "--run", run_path, "--qrels", qrels_path, "-m", "GMAP", "--mean").out
    )
    logs = pytrec_eval.RelevanceEvaluator(qrels, {"gm_map"}).evaluate(run)
    expected = math.exp(sum(v["gm_map"] for v in logs.values()) / 3)
    assert means == {"n": 3, "GMAP": pytest.approx(expected, abs=1e-12), "ci95(GMAP)": mock.ANY}


#: trec_eval 10.0 (built from its source) on the run and qrels of the test below:
#: trec_eval -q -m P.5 -m map -m ndcg_cut.10 -m num_ret -m num_rel_ret -m recip_rank
#:   -m gm_map -m bpref -m iprec_at_recall.0.5 qrels run
TREC_EVAL_10_OUTPUT = """\
P_5                   \tq1\t0.4000
map                   \tq1\t1.0000
ndcg_cut_10           \tq1\t1.0000
num_ret               \tq1\t2
num_rel_ret           \tq1\t2
recip_rank            \tq1\t1.0000
bpref                 \tq1\t1.0000
iprec_at_recall_0.50  \tq1\t1.0000
P_5                   \tq2\t0.2000
map                   \tq2\t0.5000
ndcg_cut_10           \tq2\t0.6309
num_ret               \tq2\t2
num_rel_ret           \tq2\t1
recip_rank            \tq2\t0.5000
bpref                 \tq2\t0.0000
iprec_at_recall_0.50  \tq2\t0.5000
P_5                   \tall\t0.3000
map                   \tall\t0.7500
ndcg_cut_10           \tall\t0.8155
num_ret               \tall\t4
num_rel_ret           \tall\t3
recip_rank            \tall\t0.7500
gm_map                \tall\t0.7071
bpref                 \tall\t0.5000
iprec_at_recall_0.50  \tall\t0.7500
"""


def test_trec_format_prints_what_trec_eval_prints(evald_main: Evald, tmp_path: Path) -> None:
    run = write(
        tmp_path / "run", ["q1 Q0 a 1 2 t", "q1 Q0 b 2 1 t", "q2 Q0 c 1 1 t", "q2 Q0 a 1 0.5 t"]
    )
    qrels = write(tmp_path / "qrels", ["q1 0 a 1", "q1 0 b 1", "q2 0 c 0", "q2 0 a 2"])
    measures = "P.5,map,ndcg_cut.10,num_ret,num_rel_ret,recip_rank,gm_map,bpref,iprec_at_recall.0.5"
    result = evald_main("score", "--run", run, "--qrels", qrels, "-m", measures, "--format", "trec")
    assert result.status == 0
    assert sorted(result.out.splitlines()) == sorted(TREC_EVAL_10_OUTPUT.splitlines())
    summary = evald_main(
        "score", "--run", run, "--qrels", qrels, "-m", measures, "--format", "trec", "--mean"
    )
    assert summary.out.splitlines() == TREC_EVAL_10_OUTPUT.splitlines()[-9:]
    digits = evald_main(
        "score", "--run", run, "--qrels", qrels, "-m", "map", "--format", "trec", "--mean",
        "--digits", "6",
    )  # fmt: skip
    assert digits.out == "map                   \tall\t0.750000\n"


# --- --compare -------------------------------------------------------------------------------


def compare_runs(tmp_path: Path) -> list[str]:
    """Three JSONL runs over 12 queries: b is better than a, c is a with two lists swapped."""
    rng = random.Random(5)
    paths = []
    for name in "abc":
        lines = []
        for q in range(12):
            docs = [f"d{i}" for i in range(8)]
            qrels = {d: rng.randint(0, 2) for d in docs[:5]}
            ranking = sorted(
                docs, key=lambda d, n=name: -qrels.get(d, 0) * (n == "b") + rng.random()
            )
            lines.append(json.dumps(row(f"q{q}", ranking, qrels)))
        paths.append(write(tmp_path / f"{name}.jsonl", lines))
    return paths


def test_compare_reports_means_and_tests_equal_to_scipy(evald_main: Evald, tmp_path: Path) -> None:
    from scipy import stats

    paths = compare_runs(tmp_path)
    result = evald_main("score", "--compare", *paths, "-m", "nDCG@5,AP", "--seed", "3")
    assert result.status == 0, result.err
    report = json.loads(result.out)
    assert report["baseline"] == paths[0] and report["queries"] == 12
    assert (report["permutations"], report["seed"], report["correction"]) == (10_000, 3, "holm")
    per_run = [
        {r["qid"]: r for r in evald_main("score", p, "-m", "nDCG@5,AP").rows()} for p in paths
    ]
    results = {(r["measure"], r["run"]): r for r in report["results"]}
    assert len(results) == 4
    for measure in ("nDCG@5", "AP"):
        a = [per_run[0][f"q{q}"][measure] for q in range(12)]
        pvalues = []
        for path, rows in zip(paths[1:], per_run[1:], strict=True):
            b = [rows[f"q{q}"][measure] for q in range(12)]
            got = results[(measure, path)]
            assert got["diff"] == pytest.approx(sum(b) / 12 - sum(a) / 12, abs=1e-12)
            expected = stats.ttest_rel(b, a)
            assert got["t"] == pytest.approx(expected.statistic, rel=1e-9)
            assert got["p_t"] == pytest.approx(expected.pvalue, rel=1e-9)
            exact = stats.permutation_test(
                (b, a), lambda x, y, axis: np.mean(x - y, axis=axis),
                permutation_type="samples", n_resamples=np.inf,
            )  # fmt: skip
            assert got["randomization"] == "exact"  # 2^12 patterns <= 10 000
            assert got["p_randomization"] == pytest.approx(exact.pvalue, abs=1e-12)
            pvalues.append(expected.pvalue)
        holm = sorted(pvalues)
        corrected = [min(1.0, 2 * holm[0]), max(min(1.0, 2 * holm[0]), holm[1])]
        got_corrected = sorted(results[(measure, p)]["p_t_corrected"] for p in paths[1:])
        assert got_corrected == pytest.approx(corrected, rel=1e-9)


def test_compare_table_on_a_terminal_and_usage_errors(evald_main: Evald, tmp_path: Path) -> None:
    paths = compare_runs(tmp_path)
    table = evald_main("score", "--compare", *paths[:2], "-m", "AP", tty=True)
    assert table.out.splitlines()[0].split() == [
        "measure", "run", "baseline", "mean", "diff", "t", "p(t)", "p(t)", "holm", "p(rand)",
        "p(rand)", "holm",
    ]  # fmt: skip
    assert table.out.splitlines()[1].split()[:2] == ["AP", paths[1]]
    assert evald_main("score", "--compare", paths[0]).status == 2
    assert evald_main("score", "--compare", *paths, "--mean").status == 2
    assert evald_main("score", "--compare", *paths, "-m", "GAUC").status == 2
    twice = write(tmp_path / "twice.jsonl", [json.dumps(row("q1", ["a"], {"a": 1}))] * 2)
    dup = evald_main("score", "--compare", paths[0], twice)
    assert dup.status == 2 and "qid 'q1' is scored twice" in dup.err


def test_compare_trec_runs_pairs_queries_in_every_run(evald_main: Evald, tmp_path: Path) -> None:
    qrels = write(tmp_path / "qrels", ["q1 0 a 1", "q2 0 b 1", "q3 0 c 1"])
    a = write(tmp_path / "a", ["q1 Q0 a 1 1 t", "q2 Q0 x 1 1 t", "q3 Q0 c 1 1 t"])
    b = write(tmp_path / "b", ["q1 Q0 a 1 1 t", "q2 Q0 b 1 1 t"])
    result = evald_main("score", "--compare", a, b, "--qrels", qrels, "-m", "map")
    (only,) = json.loads(result.out)["results"]
    assert (only["n"], only["baseline_mean"], only["mean"]) == (2, 0.5, 1.0)
    assert "1 queries are not scored in every run" in result.err


def test_compare_rows_carry_the_measure_names_the_user_gave(
    evald_main: Evald, tmp_path: Path
) -> None:
    """`-m map,ndcg_cut.10` prints map and ndcg_cut.10, not AP and nDCG@10; a trec_eval part
    naming several measures (P.5,10) prints trec_eval's names for them."""
    qrels = write(tmp_path / "qrels", ["q1 0 a 1", "q2 0 b 1"])
    a = write(tmp_path / "a", ["q1 Q0 a 1 1 t", "q2 Q0 x 1 1 t"])
    b = write(tmp_path / "b", ["q1 Q0 a 1 1 t", "q2 Q0 b 1 1 t"])
    given = "map,ndcg_cut.10,MRR,P.5,10,nDCG@3,map"
    result = evald_main("score", "--compare", a, b, "--qrels", qrels, "-m", given)
    assert result.status == 0, result.err
    shown = [r["measure"] for r in json.loads(result.out)["results"]]
    assert shown == ["map", "ndcg_cut.10", "MRR", "P_5", "P_10", "nDCG@3"]
    table = evald_main("score", "--compare", a, b, "--qrels", qrels, "-m", "map,ndcg_cut.10",
                       tty=True)  # fmt: skip
    assert [line.split()[0] for line in table.out.splitlines()[1:]] == ["map", "ndcg_cut.10"]


def test_mean_intervals_stay_in_range_and_are_batch_free(evald_main: Evald, tmp_path: Path) -> None:
    """nDCG@5 over 57 queries: the score interval of the effective sample size (docs/score.md,
    "Intervals"), recomputed here with scipy's quantiles and root finder, whatever the batch."""
    from scipy import optimize, stats

    rng = random.Random(11)
    lines = []
    for q in range(57):
        docs = [f"d{i}" for i in range(6)]
        rng.shuffle(docs)
        lines.append(json.dumps(row(f"q{q}", docs, {d: rng.randint(0, 2) for d in docs[:3]})))
    path = write(tmp_path / "in.jsonl", lines)
    values = [r["nDCG@5"] for r in evald_main("score", path, "-m", "nDCG@5").rows()]
    p, z, t = np.mean(values), stats.norm.ppf(0.975), stats.t.ppf(0.975, len(values) - 1)
    effective = p * (1 - p) / stats.sem(values) ** 2 * (z / t) ** 2

    def gap(mu: float) -> float:
        return (p - mu) ** 2 - z * z * mu * (1 - mu) / effective

    expected = [optimize.brentq(gap, 0, p), optimize.brentq(gap, p, 1)]
    for batch in ("1", "7", "10000"):
        out = json.loads(
            evald_main("score", path, "-m", "nDCG@5", "--mean", "--batch-size", batch).out
        )
        assert out["ci95(nDCG@5)"] == pytest.approx(expected, abs=1e-10)


def test_mean_intervals_of_bounded_measures_never_leave_0_1(
    evald_main: Evald, tmp_path: Path
) -> None:
    """RR over three queries and Success@10 on the bundled example: both printed t intervals
    past 1 ([0.12, 1.55], [0.84, 1.03])."""
    three = [row("a", ["x", "y"], {"x": 1}), row("b", ["x", "y"], {"x": 1}),
             row("c", ["x", "y", "z", "w", "v"], {"v": 1})]  # fmt: skip
    path = write(tmp_path / "three.jsonl", [json.dumps(r) for r in three])
    out = json.loads(evald_main("score", path, "-m", "RR", "--mean").out)
    assert 0 <= out["ci95(RR)"][0] < out["RR"] < out["ci95(RR)"][1] <= 1
    measures = "nDCG@10,RR,Success@10,RBP(p=0.8),P@10,R@10,AP@10,GMAP,KendallTau"
    example = json.loads(
        evald_main("score", "--example", "--mean", "--format", "json", "-m", measures).out
    )
    assert {"ci95(GMAP)", "ci95(KendallTau)", "ci95(Success@10)"} <= set(example)
    for key, (low, high) in ((k, v) for k, v in example.items() if k.startswith("ci95(")):
        floor = -1 if key == "ci95(KendallTau)" else 0
        assert floor <= low <= example[key[5:-1]] <= high <= 1, key


def test_from_the_command_line_score_ends_without_finalization(tmp_path: Path) -> None:
    """`evald score` ends the process once its output is flushed (the interpreter's
    finalization cost 10-20 ms a run), so an exit handler never runs; called in process with
    its arguments (as these tests do), main returns instead."""
    path = write(tmp_path / "in.jsonl", [json.dumps(row("q", ["a"], {"a": 1}))])
    probe = (
        "import atexit, sys, evald.cli\n"
        "atexit.register(lambda: print('finalized', file=sys.stderr))\n"
        f"sys.argv = ['evald', 'score', {path!r}, '-m', 'RR', '--mean', '--format', 'json']\n"
        "evald.cli.main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == {"n": 1, "RR": 1.0}


def test_ending_at_once_loses_no_output_and_keeps_the_exit_status(tmp_path: Path) -> None:
    """Rows to a file, the means to stdout and the rejections to stderr are all there, in
    full, when the process ends at once, and a rejected line still makes the status 1."""
    lines = [json.dumps(row(f"q{i}", [f"d{j}" for j in range(20)], {"d3": 1})) for i in range(3000)]
    path = write(tmp_path / "in.jsonl", [*lines, "{not json"])
    out = tmp_path / "rows.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "evald", "score", path, "-m", "RR,P@5", "-o", str(out), "--mean",
         "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    means = json.loads(done.stdout)
    assert (means["n"], means["RR"], means["P@5"]) == (3000, 0.25, pytest.approx(0.2))
    assert done.stderr.splitlines()[-1] == "evald score: 1 line(s) rejected; 3000 queries scored"
    rows = out.read_text(encoding="utf-8").splitlines()
    assert len(rows) == 3000 and json.loads(rows[-1]) == {"qid": "q2999", "RR": 0.25, "P@5": 0.2}


def test_ending_at_once_with_the_reader_gone_keeps_the_exit_status() -> None:
    """stdout's reader gone before the last flush (``| head``): the process still ends with
    the command's status (1: lines rejected), and says nothing about the pipe."""
    probe = (
        "import os, sys, evald.cli\n"
        "read, write = os.pipe()\n"
        "os.close(read)\n"
        "sys.stdout = os.fdopen(write, 'w')\n"
        "sys.stdout.write('means')\n"
        "evald.cli.exit_at_once(1)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stderr) == (1, "")


def test_start_up_imports_only_what_scoring_needs(tmp_path: Path) -> None:
    """`evald score` builds only its own parser (the daemon's pydantic settings and YAML cost
    about 0.15 s to import) and reads ordinary lines without pydantic-core (about 30 ms);
    the time itself is measured in benchmarks/score_bench.py."""
    path = write(tmp_path / "in.jsonl", [json.dumps(row("q", ["a"], {"a": 1}))])
    probe = (
        "import sys, evald.cli\n"
        f"status = evald.cli.main(['score', {path!r}, '-m', 'RR', '-o', {str(tmp_path / 'o')!r}])\n"
        "heavy = [m for m in ('evald.daemon.settings', 'yaml', 'pydantic', 'pydantic_core',"
        " 'scipy') if m in sys.modules]\n"
        "print(status, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "0 []"


#: Everything of evald that `evald score` imports to score any input: the command, its scorer
#: and writer, and the metric engine. A new import on this path is a start-up cost for every
#: user (the target is 0.15 s in all, numpy included), so it is added here on purpose or not at
#: all.
SCORE_PATH_MODULES = {
    "evald",
    "evald.cli",
    "evald.input_rule",
    "evald.metrics",
    "evald.metrics.batch",
    "evald.metrics.families",
    "evald.metrics.kernels",
    "evald.metrics.names",
    "evald.metrics.trec_names",
    "evald.score",
    "evald.score.batching",
    "evald.score.command",
    "evald.score.inputs",
    "evald.score.output",
    "evald.score.records",
    "evald.score.scoring",
}
#: ... and to read a JSONL file, its readers
JSONL_PATH_MODULES = SCORE_PATH_MODULES | {"evald.score.jsonl", "evald.score.jsonl_chunks"}
#: What a JSONL file or a small TREC file never needs: the daemon's clients and settings, the
#: columnar reader's pyarrow, pandas, scipy (only for intervals and --compare)
NEVER_ON_THE_SCORE_PATH = (
    "kafka", "confluent_kafka", "prometheus_client", "pydantic", "pydantic_core", "yaml",
    "pyarrow", "pandas", "scipy", "evald.daemon", "evald.join", "evald.score.trec_columns",
)  # fmt: skip


#: What TREC input never needs besides: the JSONL readers' msgspec, and json (the trec format
#: writes no JSON); about 8 ms of start-up together
NEVER_ON_THE_TREC_PATH = ("msgspec", "json")


def imported_by(
    argv: list[str], cwd: Path, watched: tuple[str, ...] = NEVER_ON_THE_SCORE_PATH
) -> tuple[int, set[str], str]:
    """The exit status of ``evald <argv>`` in a fresh interpreter, the modules it imported
    (evald's and those ``watched``), and its OPENBLAS_NUM_THREADS. The probe imports only
    what the command does before it runs (its result goes out through ``print``)."""
    probe = (
        "import os, sys, evald.cli\n"
        f"status = evald.cli.main({argv!r})\n"
        f"watched = {watched!r}\n"
        "names = [m for m in sys.modules if m.startswith(('evald', *watched))]\n"
        "print(repr([status, names, os.environ.get('OPENBLAS_NUM_THREADS')]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True, text=True, timeout=120, check=True, cwd=cwd, env=env,
    )  # fmt: skip
    status, names, threads = ast.literal_eval(done.stdout.splitlines()[-1])
    return status, set(names), threads


def test_scoring_a_jsonl_file_imports_only_the_pinned_modules(tmp_path: Path) -> None:
    """The import set of `evald score FILE` is pinned (a structural test: the time itself is
    measured in benchmarks/trec_bench.py); the TREC readers stay out of JSONL scoring, and
    numpy's BLAS starts one thread, not one per core."""
    path = write(tmp_path / "in.jsonl", [json.dumps(row("q", ["a"], {"a": 1}))])
    status, names, threads = imported_by(["score", path, "-m", "RR", "--mean"], tmp_path)
    assert status == 0
    assert names == JSONL_PATH_MODULES
    assert threads == "1"


def test_scoring_small_trec_files_adds_only_the_exact_trec_reader(tmp_path: Path) -> None:
    """TREC input imports the exact TREC reader and neither the JSONL readers nor msgspec nor
    json (the trec format and the means write no JSON)."""
    run = write(tmp_path / "run", ["q Q0 a 1 1 t", "q Q0 b 2 0.5 t"])
    qrels = write(tmp_path / "qrels", ["q 0 b 1"])
    argv = ["score", "--run", run, "--qrels", qrels, "-m", "map", "--format", "trec", "--mean"]
    watched = NEVER_ON_THE_SCORE_PATH + NEVER_ON_THE_TREC_PATH
    status, names, _ = imported_by(argv, tmp_path, watched)
    assert status == 0
    assert names == SCORE_PATH_MODULES | {"evald.score.trec"}


@pytest.mark.parametrize(
    ("flags", "judged_only", "max_docs"),
    [((), False, None), (("-J", "-M", "2"), True, 2)],
)
def test_trec_files_score_like_trec_eval_through_the_columnar_reader(
    flags: tuple[str, ...], judged_only: bool, max_docs: int | None
) -> None:
    """The property above again with every run file taken by the columnar reader (whose own
    tests check it reads what the exact reader reads, or declines)."""
    read = evald.score.trec_columns.read_columnar
    declined = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        found = read(*args, **kwargs)
        declined.append(found is None)
        return found

    with (
        mock.patch.object(evald.score.inputs, "COLUMNAR_MIN_BYTES", 0),
        mock.patch.object(evald.score.trec_columns, "read_columnar", spy),
    ):
        test_trec_files_score_like_trec_eval(
            flags=flags, judged_only=judged_only, max_docs=max_docs
        )
    assert declined and not any(declined)  # every file was read by the columnar reader
