"""`evald replay --format json`: the queries report and the drop attribution, on a stream whose
treatment is degraded only for a known set of queries, and on a negative control whose
degradation is spread evenly over every query."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from ab_comparison import ab_config

from evald.cli import main
from evald.events import parse_timestamp

MIN = 60_000
QUERIES = [f"Query {i}" for i in range(100)]
#: the degraded queries (normalised): the 2nd to 5th most frequent
DEGRADED = {f"query {i}" for i in (1, 2, 3, 4)}
CONFIG = ab_config()


def events(seed: int, *, spread: bool, n: int = 12_000) -> list[str]:
    """``n`` lists over an hour, arms alternating, queries Zipf-like (s = 1) among 100. A click
    at rank 1 (RR 1) with probability 0.6; the treatment's lists of the degraded queries get it
    at rank 4 instead (RR 0.25). ``spread``: every treatment list is degraded with the
    probability that gives the same overall drop instead."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(QUERIES) + 1)
    weights /= weights.sum()
    share = float(sum(weights[i] for i in (1, 2, 3, 4)))
    lines = []
    for k in range(n):
        ts = k * 300
        q = int(rng.choice(len(QUERIES), p=weights))
        arm = "treatment" if k % 2 else "control"
        rid = f"r{k}"
        labels = {"arm": arm, "surface": "web" if rng.random() < 0.5 else "app"}
        items = ["a", "b", "c", "d", "e"]
        lines.append(
            json.dumps(
                {"request_id": rid, "ts": ts, "items": items, "query": QUERIES[q], "labels": labels}
            )
        )
        if rng.random() < 0.6:
            if spread:
                degraded = arm == "treatment" and rng.random() < share
            else:
                degraded = arm == "treatment" and q in (1, 2, 3, 4)
            item = "d" if degraded else "a"
            click = {"request_id": rid, "ts": ts + 1_000, "item": item, "action": "click"}
            lines.append(json.dumps(click))
    return lines


def replay(tmp: Path, lines: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    stream, config = tmp / "events.jsonl", tmp / "config.yaml"
    stream.write_text("\n".join(lines) + "\n")
    config.write_text(yaml.safe_dump(CONFIG))
    results, summary = tmp / "results.jsonl", tmp / "summary.json"
    argv = ["replay", str(stream), "--config", str(config), "--results", str(results)]
    with summary.open("w") as out, contextlib.redirect_stdout(out):
        assert main([*argv, "--format", "json"]) == 0
    docs = [json.loads(line) for line in results.read_text().splitlines()]
    return json.loads(summary.read_text()), docs


@pytest.fixture(scope="module")
def degraded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[Any]]:
    return replay(tmp_path_factory.mktemp("degraded"), events(27, spread=False))


@pytest.fixture(scope="module")
def spread(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[Any]]:
    return replay(tmp_path_factory.mktemp("spread"), events(27, spread=True))


def _drops(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The attribution of each comparison segment (surface web and app)."""
    records = [r for r in summary["attribution"] if r["measure"] == "RR"]
    assert sorted(r["segment"]["surface"] for r in records) == ["app", "web"]
    return records


def test_the_attribution_ranks_the_degraded_queries_first(degraded: Any) -> None:
    summary, _ = degraded
    for record in _drops(summary):
        # Adtributor stops once a dimension's explanations carry 0.67 of the drop: the
        # explanations are degraded queries only, in decreasing surprise, and carry that much
        queries = [e for e in record["explanations"] if e["dimension"] == "query"]
        assert record["explanations"][: len(queries)] == queries
        assert len(queries) >= 2 and {e["value"] for e in queries} <= DEGRADED
        assert sum(e["explanatory_power"] for e in queries) >= 0.67
        assert [e["surprise"] for e in queries] == sorted(
            (e["surprise"] for e in queries), reverse=True
        )
        for e in queries:
            assert e["mean"] < e["baseline_mean"] - 0.3


def test_a_drop_spread_evenly_is_explained_by_no_query(spread: Any) -> None:
    """Negative control: the same overall drop over every query names none of them."""
    summary, _ = spread
    for record in _drops(summary):
        assert not [e for e in record["explanations"] if e["dimension"] == "query"]


def test_the_reported_counts_are_within_the_bound_of_the_exact_ones(degraded: Any) -> None:
    summary, results = degraded
    assert summary["queries"]
    for row in summary["queries"]:
        start, end = parse_timestamp(row["start"]), parse_timestamp(row["end"])
        exact = Counter(
            r["query"]
            for r in results
            if start <= parse_timestamp(r["ts"]) < end
            and all(r["labels"].get(k) == v for k, v in row["labels"].items() if v != "__none__")
        )
        assert row["lists"] == sum(exact.values())
        assert row["offset"] <= row["lists"] / 33
        for entry in row["top"]:
            assert entry["lists"] <= exact[entry["query"]] <= entry["lists_upper"]


def test_a_degradation_there_all_along_does_not_fall_against_the_window_before(
    degraded: Any,
) -> None:
    """The treatment was degraded from the start: against the window before, its queries'
    contributions are small (the comparison with the control is what names them), and they
    are listed most negative first."""
    summary, _ = degraded
    rows = [r for r in summary["queries"] if r["labels"]["arm"] == "treatment"]
    assert {r["window"] for r in rows} == {"5m", "1h"}
    assert all(r["fallen"] == {} for r in rows if r["window"] == "1h")  # no hour before it
    for row in (r for r in rows if r["window"] == "5m"):
        contributions = [f["contribution"] for f in row["fallen"]["RR"]]
        assert contributions and contributions == sorted(contributions)
        assert all(abs(c) < 0.05 for c in contributions), row["labels"]


def test_queries_file_holds_every_window_and_segment(tmp_path: Path) -> None:
    """``--queries FILE``: one line per window still held and segment, the last ones equal to
    the summary's ``"queries"``."""
    stream, config = tmp_path / "events.jsonl", tmp_path / "config.yaml"
    stream.write_text("\n".join(events(28, spread=False, n=3_000)) + "\n")
    config.write_text(yaml.safe_dump(CONFIG))
    queries, summary = tmp_path / "queries.jsonl", tmp_path / "summary.json"
    argv = ["replay", str(stream), "--config", str(config), "--queries", str(queries)]
    with summary.open("w") as out, contextlib.redirect_stdout(out):
        assert main([*argv, "--format", "json"]) == 0
    rows = [json.loads(line) for line in queries.read_text().splitlines()]
    last = json.loads(summary.read_text())["queries"]
    five = [r for r in rows if r["window"] == "5m"]
    assert len({r["start"] for r in five}) == 3  # 15 minutes of lists: three 5m windows
    assert {(r["window"], r["start"]) for r in rows} >= {(r["window"], r["start"]) for r in last}
    assert [
        r for r in rows if (r["window"], r["start"]) in {(x["window"], x["start"]) for x in last}
    ] == last
    assert main(["replay", str(stream), "--queries", str(tmp_path / "no" / "such.jsonl")]) == 2


def test_hostile_queries_never_break_an_output(tmp_path: Path) -> None:
    """Control and format characters, terminal escapes, a bidi override and a 512-character
    query: the results and --queries lines are one valid JSON document each, with the
    normalised text (no control or format character), cut to drilldown.max_query_length."""
    hostile = ["a\nb", "\x1b[31mred\x1b[0m", "evil\u202etxt", "x" * 512, "\u200b\ufeff", "ok"]
    lines = []
    for k in range(600):
        ts, query = k * 1_000, hostile[k % len(hostile)]
        body = {"request_id": f"r{k}", "ts": ts, "items": ["a"], "query": query}
        lines.append(json.dumps({**body, "labels": {"arm": "control"}}))
    stream, config = tmp_path / "events.jsonl", tmp_path / "config.yaml"
    stream.write_text("\n".join(lines) + "\n")
    config.write_text(yaml.safe_dump({**CONFIG, "statistics": {"bootstrap_replicates": 0}}))
    results, queries = tmp_path / "results.jsonl", tmp_path / "queries.jsonl"
    argv = ["replay", str(stream), "--config", str(config), "--results", str(results)]
    with contextlib.redirect_stdout(None):
        assert main([*argv, "--queries", str(queries)]) == 0
    texts = {json.loads(line).get("query") for line in results.read_text().splitlines()}
    assert texts == {"a b", "[31mred [0m", "eviltxt", "x" * 100, None, "ok"}
    for line in queries.read_text().splitlines():
        assert "\n" not in line and "\x1b" not in line and "\u202e" not in line
        row = json.loads(line)
        assert {t["query"] for t in row["top"]} <= texts


def test_queries_with_the_drill_down_off_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``drilldown.capacity: 0`` keeps no summaries: ``--queries FILE`` wrote an empty file
    without a word. Like ``--looks`` without comparisons and ``--click-depth`` without
    ``--click-model``, the flag needing a feature that is off exits 2 naming both, and writes
    no file."""
    stream, config = tmp_path / "events.jsonl", tmp_path / "config.yaml"
    stream.write_text("\n".join(events(28, spread=False, n=300)) + "\n")
    config.write_text(yaml.safe_dump({**CONFIG, "drilldown": {"capacity": 0}}))
    queries = tmp_path / "queries.jsonl"
    argv = ["replay", str(stream), "--config", str(config), "--queries", str(queries)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("evald replay: --queries: ") and "drilldown.capacity: 0" in err
    assert not queries.exists()
