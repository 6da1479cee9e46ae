"""`evald score --compare`: queries paired by qid without a Python object per query (the memory
it takes is measured by `python -m benchmarks score_compare`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from evald.score.compare import DuplicateQid, RunValues, paired, qid_key, qid_of, score_run
from evald.score.inputs import JsonlInput
from evald.score.scoring import per_query


def run_of(name: str, qids: list[str | int], values: list[float]) -> RunValues:
    keys = pa.array([qid_key(q) for q in qids], pa.large_string())
    return RunValues(name, keys, np.array(values, dtype=np.float64)[:, None], 0, [])


def test_pairing_follows_the_baseline_order_and_keeps_7_apart_from_the_text_7() -> None:
    base = run_of("a", ["q1", 7, "q2", "7", "q3"], [1, 2, 3, 4, 5])
    other = run_of("b", ["7", "q3", "q9", "q1", 8], [40, 50, 90, 10, 80])
    third = run_of("c", ["q1", "7", "q3", "q9", 9], [100, 400, 500, 900, 99])
    pairing = paired([base, other, third])
    assert [list(rows[:, 0]) for rows in pairing.rows] == [
        [1, 4, 5],
        [10, 40, 50],
        [100, 400, 500],
    ]
    assert pairing.queries == 3
    # not in every run, each counted once: 7 and q2 (baseline), q9 (twice), 8, 9
    assert pairing.unpaired == 5
    assert [qid_of(qid_key(q)) for q in ("7", 7, "", "s")] == ["7", 7, "", "s"]
    assert base.qids == ["q1", 7, "q2", "7", "q3"]


def _lines(path: Path, qids: list[object]) -> JsonlInput:
    path.write_text(
        "".join(json.dumps({"qid": q, "ranking": ["a"], "qrels": {"a": 1}}) + "\n" for q in qids)
    )
    return JsonlInput(path.open("rb"), str(path))


def test_a_qid_scored_twice_is_named_whatever_its_type(tmp_path: Path) -> None:
    measures = per_query_measures()
    score_run("ok", _lines(tmp_path / "ok", ["1", 1, "2"]), measures, batch_size=2)
    for qids, named in ((["x", 3, "y", 3, "x"], "'x'"), ([5, "5", 5], "5")):
        with pytest.raises(DuplicateQid, match=f"qid {named} is scored twice"):
            score_run("run", _lines(tmp_path / "run", qids), measures, batch_size=2)


def per_query_measures() -> list[object]:
    from evald.metrics import parse_measures

    return list(per_query(parse_measures("RR")))
