"""``evald replay`` on interleaved traffic: the results' credit, the JSON summary's
``"interleaving"`` key and the text verdict, against the plain computation."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import yaml
from interleaved_stream import CONFIG, events, plain_credit, plain_pairs

from evald.cli import main


def replay(tmp: Path, stream: list[dict[str, Any]], *args: str) -> str:
    (tmp / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in stream))
    (tmp / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    out = io.StringIO()
    argv = ["replay", str(tmp / "events.jsonl"), "--config", str(tmp / "config.yaml"), *args]
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


def test_the_json_summary_and_the_results_carry_the_plain_credit(tmp_path: Path) -> None:
    stream = events()
    results = tmp_path / "results.jsonl"
    doc = json.loads(replay(tmp_path, stream, "--format", "json", "--results", str(results)))
    credits = {}
    for line in results.read_text().splitlines():
        record = json.loads(line)
        if "interleaving" in record:
            assert record["interleaving"]["method"] == "team_draft"
            credits[record["request_id"]] = record["interleaving"]["credit"]
    assert credits == plain_credit(stream)
    expected = plain_pairs(stream)
    entries = doc["interleaving"]
    assert len(entries) == len(expected) == 2
    for entry in entries:
        a, b = entry["team_a"], entry["team_b"]
        cell = expected[((entry["segment"]["surface"],), a, b)]
        assert entry["wins"] == {a: cell["wins_a"], b: cell["wins_b"]}
        assert (entry["ties"], entry["lists"]) == (cell["ties"], cell["lists"])
        compared = cell["wins_a"] + cell["wins_b"] + cell["ties"]
        assert entry["preference"] == (cell["wins_a"] - cell["wins_b"]) / compared
        assert entry["lower"] < entry["preference"] < entry["upper"]
        assert entry["lower"] > 0 and entry["winner"] == "A" and entry["decided_at"]
        assert 0 <= entry["p_value"] < 0.05 / 2 and 0 < entry["srm_p_value"] <= 1


def test_the_winner_is_null_before_a_decision_and_the_text_says_so(tmp_path: Path) -> None:
    doc = json.loads(replay(tmp_path, events(n=1500, same=True), "--format", "json"))
    assert [e["winner"] for e in doc["interleaving"]] == [None, None]
    assert all(e["lower"] < 0 < e["upper"] for e in doc["interleaving"])
    text = replay(tmp_path, events(n=1500, same=True))
    assert text.count("verdict: no difference shown yet (the band holds 0)") == 2
    text = replay(tmp_path, events(n=1500))
    assert text.count("verdict: A beats B (decided at ") == 2


def test_no_interleaving_key_without_interleaved_lists(tmp_path: Path) -> None:
    plain = [e for e in events(n=200) if "teams" not in e and "items" in e]
    assert "interleaving" not in json.loads(replay(tmp_path, plain, "--format", "json"))
