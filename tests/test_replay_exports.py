"""`evald replay` on UBI data as its writers write it: every shape, mixed time spellings,
OpenSearch ``_bulk`` files and search-hit dumps (plain or gzip), out of order with ``--sort``;
held to the oracle of the UBI schema's meaning (tests/ubi_fixture.py), not to evald's mapping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ubi_fixture import (
    MEASURES,
    QUERY,
    Search,
    all_records,
    bulk_lines,
    exported,
    hit_lines,
    oracle,
    plain_lines,
    searches,
    time_of,
    write,
)

from evald.cli import main

WINDOW = 30 * 60_000


def replay(*argv: str) -> int:
    return main(
        [
            "replay",
            *argv,
            "--progress",
            "never",
            "--measures",
            ",".join(MEASURES),
            "--window",
            "30m",
        ]
    )


def results(path: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        assert doc["request_id"] not in out, f"{doc['request_id']} scored twice"
        out[doc["request_id"]] = doc
    return out


def assert_oracle(found: list[Search], got: dict[str, dict]) -> None:
    """Every search scored once, each measure equal to the oracle's to 1e-9, the labels its
    query record gives."""
    want = oracle(found, WINDOW)
    assert set(got) == set(want)
    for search in found:
        doc = got[search.query_id]
        for name, value in want[search.query_id].items():
            assert doc["measures"][name] == pytest.approx(value, abs=1e-9), (search, name)
        assert doc["labels"] == search.labels(), search
        # the query record's user_query, normalised; a list of impression events alone has none
        assert doc.get("query") == (None if search.shape == "events" else QUERY), search
    assert sum(any(v > 0 for v in m.values()) for m in want.values()) > len(want) // 3


def summary(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("shape", ["hits", "triple", "shown", "events"])
def test_each_ubi_shape_in_time_order_equals_the_oracle(
    shape: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = [s for s in searches(11, 240) if s.shape == shape]
    recs = sorted(all_records(found, 11), key=lambda r: time_of(r[1]))  # stable
    events = write(tmp_path / "ubi.jsonl", plain_lines(recs))
    out = tmp_path / "results.jsonl"
    assert replay(str(events), "--mapping", "ubi", "--results", str(out), "--format", "json") == 0
    assert_oracle(found, results(out))
    counts = summary(capsys)
    assert counts["rejected"] == {} and counts["behind_watermark"] == 0


def test_a_bulk_export_mixing_the_shapes_out_of_order_with_sort_equals_the_oracle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = searches(12, 400)
    export = write(tmp_path / "ubi.ndjson", bulk_lines(exported(all_records(found, 12), 12)))
    out = tmp_path / "results.jsonl"
    argv = [str(export), "--mapping", "ubi", "--sort", "--results", str(out), "--format", "json"]
    assert replay(*argv) == 0
    assert_oracle(found, results(out))
    counts = summary(capsys)
    assert counts["rejected"] == {} and counts["finalized"]["late"] == 0
    assert counts["events"]["impression.duplicate"] == 0


def test_a_gzip_search_hit_dump_in_two_files_with_sort_equals_the_oracle(tmp_path: Path) -> None:
    found = searches(13, 300)
    recs = exported(all_records(found, 13), 13)
    half = len(recs) // 2
    first = write(tmp_path / "part1.jsonl.gz", hit_lines(recs[:half]))
    second = write(tmp_path / "part2.jsonl.gz", hit_lines(recs[half:]))
    out = tmp_path / "results.jsonl"
    code = replay(str(second), str(first), "--mapping", "ubi", "--sort", "--sort-memory", "1M",
                  "--results", str(out))  # fmt: skip
    assert code == 0
    assert_oracle(found, results(out))


def test_without_sort_an_export_out_of_order_is_told_and_sort_suggested(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = searches(14, 200)
    export = write(tmp_path / "ubi.ndjson", bulk_lines(exported(all_records(found, 14), 14)))
    assert replay(str(export), "--mapping", "ubi") == 0
    text = capsys.readouterr().out
    assert "export lines           " in text and "_bulk action lines (not records)" in text
    (note,) = [line for line in text.splitlines() if line.startswith("note: ")]
    assert "not in event-time order; `evald replay --sort` orders it first" in note
    assert replay(str(export), "--mapping", "ubi", "--sort") == 0
    assert "note: " not in capsys.readouterr().out


def test_several_files_without_sort_are_read_one_after_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Events in one file, queries in the other, given events first: read as given, the lists
    come after their feedback was orphaned; with --sort the two files are one time order."""
    found = searches(15, 120)
    recs = sorted(all_records(found, 15), key=lambda r: time_of(r[1]))
    queries = write(tmp_path / "q.jsonl", [json.dumps(d) for i, d in recs if i == "ubi_queries"])
    events = write(tmp_path / "e.jsonl", [json.dumps(d) for i, d in recs if i == "ubi_events"])
    out = tmp_path / "results.jsonl"
    assert replay(str(events), str(queries), "--mapping", "ubi", "--format", "json") == 0
    assert summary(capsys)["unattributed"]["orphaned"] > 0
    argv = [str(events), str(queries), "--mapping", "ubi", "--sort", "--results", str(out)]
    assert replay(*argv) == 0
    assert_oracle(found, results(out))


def test_a_record_from_an_index_the_mapping_does_not_read_is_rejected_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rejected = tmp_path / "rejected.jsonl"
    export = write(
        tmp_path / "mixed.ndjson",
        [json.dumps({"index": {"_index": "ecommerce"}}), json.dumps({"title": "red shoes"})],
    )
    assert replay(str(export), "--mapping", "ubi", "--rejected", str(rejected)) == 0
    (line,) = [json.loads(x) for x in rejected.read_text().splitlines()]
    assert (line["line"], line["reason"]) == (2, "unknown_kind")
    assert (
        line["detail"] == "index 'ecommerce' is not one the mapping reads (ubi_events, ubi_queries)"
    )
    assert line["raw"] == '{"title": "red shoes"}'


def test_the_native_schema_reads_a_bulk_file_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    at = "2024-05-01T12:00:00Z"
    docs = [
        {"request_id": "r", "ts": at, "items": ["a", "b"]},
        {"request_id": "r", "ts": at, "item": "b", "action": "click"},
    ]
    lines = [x for d in docs for x in (json.dumps({"index": {"_index": "events"}}), json.dumps(d))]
    out = tmp_path / "results.jsonl"
    argv = [str(write(tmp_path / "n.ndjson", lines)), "--results", str(out), "--format", "json"]
    assert replay(*argv) == 0
    assert results(out)["r"]["measures"]["RR"] == 0.5
    counts = summary(capsys)
    assert counts["rejected"] == {} and counts["lines"] == 4  # the action lines are no records


def test_replay_queries_on_a_bulk_export_names_what_the_users_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--queries` on an export whose users typed "red shoes" three ways (spaces, case, a tab
    and a zero-width space): every window's one query is "red shoes", and the lists of all
    the 5-minute rows are the searches with a query record (the impression-events-only shape
    has none)."""
    found = searches(12, 400)
    export = write(tmp_path / "ubi.ndjson", bulk_lines(exported(all_records(found, 12), 12)))
    out = tmp_path / "queries.jsonl"
    assert replay(str(export), "--mapping", "ubi", "--sort", "--queries", str(out)) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and {t["query"] for row in rows for t in row["top"]} == {QUERY}
    five = [row for row in rows if row["window"] == "5m"]
    assert sum(row["lists"] for row in five) == sum(s.shape != "events" for s in found)
