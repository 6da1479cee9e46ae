"""`evald judge`: a session log in, judgments out (TREC qrels and JSONL), through `evald score`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import ir_measures
import numpy as np
import pytest
import pytrec_eval

from evald.cli import main
from evald.clicks import simulate as sim
from evald.input_rule import BOM_TEXT
from evald.metrics import Batch, evaluate, parse_measures

THETA = 1.0 / np.arange(1, 11) ** 0.7


def session_log(path: Path, seed: int = 41, lists: int = 20_000) -> sim.World:
    """PBM clicks as the public click logs have them: query id, ten served ids, clicked ids."""
    rng = np.random.default_rng(seed)
    world = sim.World.draw(rng, 20, 15)
    q, items = sim.serve(rng, world, world.attractiveness, lists, 10)
    attract, _ = sim.gathered(world, q, items)
    clicks = sim.pbm_clicks(rng, attract, THETA)
    with path.open("w") as out:
        for i in range(lists):
            served = [f"d{d}" for d in items[i]]
            clicked = [served[r] for r in np.flatnonzero(clicks[i])]
            out.write(
                json.dumps({"query": f"q{q[i]}", "served": served, "clicked": clicked}) + "\n"
            )
    return world


def test_judge_writes_qrels_and_jsonl_that_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = session_log(tmp_path / "s.jsonl")
    qrels, jsonl = tmp_path / "j.qrels", tmp_path / "j.jsonl"
    argv = ["judge", str(tmp_path / "s.jsonl"), "--qrels", str(qrels), "--jsonl", str(jsonl)]
    assert main([*argv, "--holdout", "0.2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lists"] == 16_000 and summary["held_out"] == 4_000
    assert np.abs(np.asarray(summary["examination"]) - THETA).max() < 0.03
    assert summary["fit"]["on"] == "held_out" and len(summary["fit"]["perplexity_at"]) == 10
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(records) == summary["judgments"] == 20 * 15
    for record in records:  # grade = thresholds 0.25, 0.5, 0.75 reached
        assert record["grade"] == sum(record["relevance"] >= t for t in (0.25, 0.5, 0.75))
        q, d = int(record["qid"][1:]), int(record["docid"][1:])
        assert abs(record["relevance"] - world.attractiveness[q, d]) < 0.15
        assert 0 <= record["clicks"] <= record["impressions"]
    lines = qrels.read_text().splitlines()
    assert lines == [f"{r['qid']} 0 {r['docid']} {r['grade']}" for r in records]


def test_judgments_round_trip_through_evald_score(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run ordered by true attractiveness scores higher on the judged qrels than the same
    run reversed, and `evald score` gives what the metric engine gives on the JSONL's grades."""
    world = session_log(tmp_path / "s.jsonl", lists=8_000)
    qrels, jsonl = tmp_path / "j.qrels", tmp_path / "j.jsonl"
    assert (
        main(["judge", str(tmp_path / "s.jsonl"), "--qrels", str(qrels), "--jsonl", str(jsonl)])
        == 0
    )
    capsys.readouterr()
    judged: dict[str, dict[str, float]] = {}
    for line in jsonl.read_text().splitlines():
        r = json.loads(line)
        judged.setdefault(r["qid"], {})[r["docid"]] = r["grade"]
    means = {}
    for name, sign in (("good", -1), ("bad", 1)):
        order = np.argsort(sign * world.attractiveness, axis=1)
        rankings = [[f"d{d}" for d in row] for row in order]
        run = tmp_path / f"{name}.run"
        run.write_text(
            "".join(
                f"q{q} Q0 {doc} {r + 1} {15 - r} x\n"
                for q, docs in enumerate(rankings)
                for r, doc in enumerate(docs)
            )
        )
        assert (
            main(
                [
                    "score",
                    "--run",
                    str(run),
                    "--qrels",
                    str(qrels),
                    "-m",
                    "nDCG@10",
                    "--mean",
                    "--format",
                    "json",
                ]
            )
            == 0
        )
        means[name] = json.loads(capsys.readouterr().out)["nDCG@10"]
        measure = parse_measures("nDCG@10")[0]
        expected = evaluate(
            [measure], Batch.from_lists(rankings, [judged[f"q{q}"] for q in range(20)])
        )
        assert means[name] == pytest.approx(float(expected[measure].mean()), abs=1e-12)
    assert means["good"] > means["bad"] + 0.3


def test_bad_lines_are_reported_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "s.jsonl"
    good = {"query": "q", "served": ["a", "b"], "clicked": ["a"]}
    log.write_text(
        "\n".join(
            [
                BOM_TEXT + json.dumps(good),  # one byte-order mark is ignored, as everywhere
                "not json",
                json.dumps({"query": "q", "served": ["a", "a"], "clicked": []}),
                json.dumps({"query": "q", "served": ["a"], "clicked": ["z"]}),
                json.dumps({"qid": 7, "items": ["a", "b"], "clicks": []}),
                2 * BOM_TEXT + json.dumps(good),  # only one
                json.dumps({"qid": 7, "items": ["a", "b"], "clicks": 1}),  # a count, not ids
                json.dumps({"qid": 7, "items": ["a", "b"]}),
            ]
        )
    )
    assert main(["judge", str(log), "--depth", "2"]) == 1
    err = capsys.readouterr().err
    assert f"{log}:2: not JSON" in err
    assert f'{log}:3: an id appears twice in "served"' in err
    assert f"{log}:4: clicked id 'z' is not in \"served\"" in err
    assert f"{log}:6: not JSON" in err
    assert f'{log}:7: "clicks" must be an array of strings' in err  # the field as spelt
    assert f'{log}:8: missing "clicked" (or "clicks")' in err
    assert "6 line(s) rejected" in err


def test_lines_that_would_break_the_judgments_are_rejected_by_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty id leaves a qrels line a column short (no TREC reader takes it), a lone
    surrogate cannot be written as UTF-8, a repeated key is ambiguous and bytes that are not
    UTF-8 are no line at all, and an integer of 5,000 digits is past what Python's JSON reads:
    each is its line's rejection, and the qrels written read back
    in `evald score`, pytrec_eval and ir_measures."""
    log, qrels = tmp_path / "s.jsonl", tmp_path / "j.qrels"
    good = json.dumps({"query": "q", "served": ["a", "b"], "clicked": ["a"]})
    log.write_bytes(
        b"\n".join(
            [
                good.encode(),
                json.dumps({"query": "", "served": ["a"], "clicked": ["a"]}).encode(),
                json.dumps({"query": "q1", "served": ["", "b"], "clicked": [""]}).encode(),
                b'{"query": "q\\ud800", "served": ["a"], "clicked": []}',
                b'{"query": "q", "served": ["c\\udfff"], "clicked": []}',
                b'{"query": "q", "query": "r", "served": ["a"], "clicked": []}',
                b'\xff{"query": "q", "served": ["a"], "clicked": []}',
                b'{"query": ' + b"9" * 5000 + b', "served": ["a"], "clicked": []}',
                good.encode(),
            ]
        )
    )
    assert main(["judge", str(log), "--qrels", str(qrels)]) == 1
    err = capsys.readouterr().err
    assert f'{log}:2: "query": an id is empty or only white space' in err
    assert f'{log}:3: "served"[0]: an id is empty or only white space' in err
    assert f"{log}:4: a lone surrogate in an id" in err
    assert f"{log}:5: a lone surrogate in an id" in err
    assert f'{log}:6: duplicate key "query"' in err
    assert f"{log}:7: not valid UTF-8 (byte 0)" in err
    assert f"{log}:8: not JSON: Exceeds the limit" in err  # Python's bound on integer digits
    assert "7 line(s) rejected" in err
    assert [line.split()[:3] for line in qrels.read_text().splitlines()] == [
        ["q", "0", "a"],
        ["q", "0", "b"],
    ]
    assert set(pytrec_eval.parse_qrel(qrels.open())["q"]) == {"a", "b"}
    assert [(q.query_id, q.doc_id) for q in ir_measures.read_trec_qrels(str(qrels))] == [
        ("q", "a"),
        ("q", "b"),
    ]


def test_every_line_rejected_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "s.jsonl"
    log.write_bytes(b'{"query": "q", "served": ["a"], "clicked": ["b"]}\n\xfe\n')
    assert main(["judge", str(log)]) == 2
    err = capsys.readouterr().err
    assert f"{log}:1: clicked id 'b' is not in \"served\"" in err
    assert f"{log}:2: not valid UTF-8" in err
    assert "no session to fit" in err


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--thresholds", "0.5,0.2"], "--thresholds: must be increasing"),
        (["--thresholds", "a"], "--thresholds: not a list of numbers"),
        (["--thresholds", "0.2,nan"], "--thresholds: not finite numbers: '0.2,nan'"),
        (["--holdout", "1"], "--holdout: must be in [0, 1)"),
        (["--max-pairs", "3"], "max_pairs: must be >= 16, got 3"),
        (["--holdout", "0.9999"], "--holdout 0.9999 leaves none of the 1 lists to fit"),
    ],
)
def test_bad_options_exit_2_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: list[str], message: str
) -> None:
    log = tmp_path / "s.jsonl"
    log.write_text(json.dumps({"query": "q", "served": ["a"], "clicked": []}) + "\n")
    assert main(["judge", str(log), *flag]) == 2
    assert message in capsys.readouterr().err


def test_min_impressions_and_thresholds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    session_log(tmp_path / "s.jsonl", lists=2_000)
    out = tmp_path / "j.jsonl"
    argv = ["judge", str(tmp_path / "s.jsonl"), "--jsonl", str(out), "--thresholds", "0.5"]
    assert main([*argv, "--min-impressions", "2000"]) == 0
    assert json.loads(capsys.readouterr().out)["judgments"] == 0  # no pair shown in every list
    assert main([*argv, "--min-impressions", "100"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records and all(r["impressions"] >= 100 for r in records)
    assert all(r["grade"] == (r["relevance"] >= 0.5) for r in records)


def test_the_held_out_fit_table_of_the_docs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/click-models.md's table of each model's held-out fit on this file's log is what
    `evald judge --holdout 0.2` prints, to the digits shown."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "click-models.md").read_text()
    table = doc[doc.index("On `tests/clicks/test_judge.py`'s simulated log") :]
    rows = re.findall(r"^\| (pbm|coec|dbn|cascade) \| (.*) \|$", table, re.M)
    assert [model for model, _ in rows] == ["pbm", "coec", "dbn", "cascade"]
    session_log(tmp_path / "s.jsonl")
    for model, cells in rows:
        assert main(["judge", str(tmp_path / "s.jsonl"), "--model", model, "--holdout", "0.2"]) == 0
        fit = json.loads(capsys.readouterr().out)["fit"]
        shown = [cell.strip().replace("\u2212", "-") for cell in cells.split("|")]
        assert shown == [
            f"{fit['log_likelihood']:.3f}",
            f"{fit['perplexity']:.4f}",
            " ".join(f"{p:.3f}" for p in fit["perplexity_at"]),
        ], model


@pytest.mark.parametrize("model", ["pbm", "coec", "cascade", "dbn"])
def test_ranks_no_list_reached_have_no_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str
) -> None:
    """Lists of three, read to depth 10: the curve is null from rank 4 on, not PBM's start
    value 0.5 or COEC's 0, which would read as examined half the time or never clicked."""
    rng = np.random.default_rng(5)
    log = tmp_path / "s.jsonl"
    with log.open("w") as out:
        for _ in range(600):
            served = [f"d{d}" for d in rng.choice(8, 3, replace=False)]
            clicked = [d for d in served if rng.random() < 0.3]
            out.write(
                json.dumps({"query": f"q{rng.integers(3)}", "served": served, "clicked": clicked})
            )
            out.write("\n")
    assert main(["judge", str(log), "--model", model]) == 0
    summary = json.loads(capsys.readouterr().out)
    curve = summary["rank_ctr" if model == "coec" else "examination"]
    assert len(curve) == 10 and None not in curve[:3] and curve[3:] == [None] * 7


def test_an_output_that_is_the_log_or_the_other_output_is_refused_before_the_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--qrels clicks.jsonl` replaced the log with the judgments, and `--qrels x --jsonl x`
    # wrote both into one file, each over the other; both exited 0
    log = tmp_path / "clicks.jsonl"
    text = '{"query": "q", "served": ["a", "b"], "clicked": ["b"]}\n' * 3
    log.write_text(text)
    out = tmp_path / "out"
    for argv in (["--qrels", str(log)], ["--qrels", str(out), "--jsonl", str(out)]):
        assert main(["judge", str(log), *argv]) == 2, argv
        assert "evald judge: --" in capsys.readouterr().err
    assert log.read_text() == text
    assert not out.exists()


def test_a_gzip_compressed_log_exits_2_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # every line was rejected as not UTF-8, then nothing was left to fit
    import gzip

    packed = tmp_path / "clicks.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"query": "q", "served": ["a"], "clicked": ["a"]}\n'))
    assert main(["judge", str(packed)]) == 2
    assert f"{packed} is gzip-compressed" in capsys.readouterr().err
