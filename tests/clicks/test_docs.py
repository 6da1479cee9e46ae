"""docs/click-models.md's `evald replay --click-model pbm --format json` example, run as the
page says it was made, against every value the page shows (to the digits shown)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evald.cli import main

DOC = (Path(__file__).resolve().parents[2] / "docs" / "click-models.md").read_text()


def shown_example() -> tuple[list[str], Any]:
    """The command the page names for its example, and the example's JSON with its elisions
    (``...``) dropped: lists keep the items shown first, objects the keys shown."""
    made = re.search(r"The example above is `(evald produce [^`]*)` replayed", DOC)
    assert made is not None, "docs/click-models.md no longer says how its example was made"
    block = re.search(r'```json\n("click_model": \{.*?)```', DOC, re.S)
    assert block is not None
    text = block.group(1).replace("{...}", "{}")
    text = re.sub(r",\s*\.\.\.\s*([\]}])", r"\1", text)
    return made.group(1).split()[1:], json.loads("{" + text + "}")["click_model"]


def agrees(shown: Any, actual: Any, where: str = "click_model") -> None:
    """``actual`` has every value ``shown`` has: numbers to the decimals shown."""
    if isinstance(shown, dict):
        assert isinstance(actual, dict), where
        for key, value in shown.items():
            assert key in actual, f"{where}: no {key!r}"
            agrees(value, actual[key], f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(actual, list) and len(actual) >= len(shown), where
        for i, value in enumerate(shown):
            agrees(value, actual[i], f"{where}[{i}]")
    elif isinstance(shown, float):
        decimals = len(repr(shown).split(".")[1])
        assert abs(actual - shown) <= 0.5 * 10**-decimals + 1e-12, f"{where}: {actual} != {shown}"
    else:
        assert actual == shown, where


def test_the_replay_example_is_what_replay_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    produce, shown = shown_example()
    monkeypatch.chdir(tmp_path)
    assert main(produce) == 0
    output = produce[produce.index("--output") + 1]
    capsys.readouterr()
    assert main(["replay", output, "--click-model", "pbm", "--format", "json"]) == 0
    agrees(shown, json.loads(capsys.readouterr().out)["click_model"])


def test_the_judge_example_and_its_qrels_in_trec_eval_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's `evald judge` then `evald score` lines, on test_judge's log and a run of its
    items: the qrels judge writes give evald score's nDCG@10 in pytrec_eval and ir_measures."""
    import ir_measures
    import pytrec_eval

    from tests.clicks.test_judge import session_log

    block = re.search(r"```sh\n(evald judge .*?)```", DOC, re.S)
    assert block is not None
    commands = [shlex.split(line) for line in block.group(1).splitlines()]
    assert [c[:2] for c in commands] == [["evald", "judge"], ["evald", "score"]]
    monkeypatch.chdir(tmp_path)
    world = session_log(tmp_path / commands[0][2], lists=4_000)
    run = commands[1][commands[1].index("--run") + 1]
    (tmp_path / run).write_text(
        "".join(
            f"q{q} Q0 d{d} {r + 1} {15 - r} x\n"
            for q, row in enumerate(world.attractiveness)
            for r, d in enumerate(row.argsort()[::-1])
        )
    )
    for argv in commands:
        capsys.readouterr()
        assert main(argv[1:]) == 0, argv
    ndcg = json.loads(capsys.readouterr().out)["nDCG@10"]
    qrels = commands[1][commands[1].index("--qrels") + 1]
    with open(qrels) as q, open(run) as r:
        judged, ranked = pytrec_eval.parse_qrel(q), pytrec_eval.parse_run(r)
    per_query = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10"}).evaluate(ranked)
    mean = sum(v["ndcg_cut_10"] for v in per_query.values()) / len(per_query)
    assert ndcg == pytest.approx(mean, abs=1e-12)
    measured = ir_measures.calc_aggregate(
        [ir_measures.nDCG @ 10], ir_measures.read_trec_qrels(qrels), ir_measures.read_trec_run(run)
    )
    assert ndcg == pytest.approx(measured[ir_measures.nDCG @ 10], abs=1e-12)


def test_the_yandex_converter_of_the_docs_feeds_judge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's converter, run as written on a few sessions in the challenge's form (a click
    back on an earlier page, a click twice, a click on no shown URL): every line it writes is
    one evald judge reads."""
    block = re.search(r"```python\n(.*?def convert\(records, out\):.*?)```", DOC, re.S)
    assert block is not None
    script = tmp_path / "convert.py"
    script.write_text(block.group(1))
    records = [
        "0\t0\tQ\t174\t0\t11\t12\t13",
        "0\t5\tC\t12",
        "0\t9\tQ\t175\t0\t21\t22\t23",
        "0\t14\tC\t13",  # back on the first page: its list, not the newest Q's
        "0\t15\tC\t21",
        "0\t16\tC\t21",  # twice
        "0\t17\tC\t99",  # no list of the session showed it
        "1\t0\tQ\t174\t0\t13\t11\t12",
    ]
    tsv = "".join(r + "\n" for r in records)
    done = subprocess.run(
        [sys.executable, str(script)], input=tsv, capture_output=True, text=True, check=True
    )
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"query": "174", "served": ["11", "12", "13"], "clicked": ["12", "13"]},
        {"query": "175", "served": ["21", "22", "23"], "clicked": ["21"]},
        {"query": "174", "served": ["13", "11", "12"], "clicked": []},
    ]
    (tmp_path / "sessions.jsonl").write_text(done.stdout)
    assert main(["judge", str(tmp_path / "sessions.jsonl"), "--depth", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["lists"] == 3
