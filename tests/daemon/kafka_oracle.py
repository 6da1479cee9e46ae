"""The oracle of the Kafka tests: the results topic read with ``read_committed`` and no
de-duplication equals one uninterrupted engine fed the same records (every request_id once, every
value equal), the window aggregates equal that engine's, and what a ``read_committed`` reader
saw *during* a fault still stands afterwards."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from kafka_harness import KafkaTools
from kafka_instances import make_settings, names

from evald.engine import Engine


def results_by_id(
    tools: KafkaTools, topic: str, *, committed: bool = True
) -> dict[str, list[dict[str, Any]]]:
    """Every result on ``topic`` by request_id, read as a downstream consumer would
    (``read_committed``) unless told otherwise; copies are kept, not merged."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in tools.read(topic, committed=committed):
        doc = json.loads(record.value)
        assert record.key == doc["request_id"].encode()
        out[doc["request_id"]].append(doc)
    return out


def assert_exactly_once(
    got: dict[str, list[dict[str, Any]]],
    expected: dict[str, Any],
    *,
    allow_identical_copies: bool = False,
) -> int:
    """Each expected request_id present once with the expected values, nothing else; returns
    how many extra identical copies were seen (only tansu, which leaks aborted transactions,
    is allowed any)."""
    assert expected, "the reference finalized nothing: the test data is too short"
    assert set(got) == set(expected), (
        f"missing {len(set(expected) - set(got))}, unexpected {len(set(got) - set(expected))}"
    )
    copies = 0
    for request_id, docs in got.items():
        for doc in docs:
            assert doc == expected[request_id], request_id
        copies += len(docs) - 1
    if not allow_identical_copies:
        assert copies == 0
    return copies


def assert_seen_during_chaos_stands(
    records: list, expected: dict[str, Any], tools: KafkaTools, topic: str
) -> int:
    """What a read_committed consumer saw while things crashed: each result at most once,
    each equal to the uninterrupted run's (so none is later retracted or doubled). A failure
    says where each offending record sits now: still on the log with the same bytes (an
    aborted record shown as committed) or gone (the log lost a record it had served)."""
    seen: dict[str, list[Any]] = defaultdict(list)
    for record in records:
        seen[json.loads(record.value)["request_id"]].append(record)
    assert seen, "the concurrent reader saw nothing: the test is not effective"
    bad = [
        r
        for request_id, rs in seen.items()
        for r in rs
        if len(rs) > 1 or json.loads(r.value) != expected.get(request_id)
    ]
    if bad:
        log = {(r.partition, r.offset): r.value for r in tools.read(topic)}
        final = {(r.partition, r.offset) for r in tools.read(topic, committed=True)}
        where = [
            (
                r.partition,
                r.offset,
                "committed now" if (r.partition, r.offset) in final else "not committed now",
                "same bytes on the log" if log.get((r.partition, r.offset)) == r.value else "gone",
            )
            for r in bad[:5]
        ]
        pytest.fail(f"{len(bad)} results seen during the chaos do not stand, e.g. {where}")
    return len(seen)


def assert_windows_equal(rows: list[dict[str, Any]], reference: Engine) -> None:
    """Window aggregates equal the uninterrupted engine's (sums up to float re-association)."""

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return (
            row["window"],
            row["start_ms"],
            tuple(sorted(row["labels"].items())),
            row["measure"],
        )

    want = {key(r): r for r in (row.to_json() for row in reference.window_rows(last_only=False))}
    have = {key(r): r for r in rows}
    assert want, "no complete window in the reference: the test data is too short"
    assert set(have) == set(want)
    for k, row in want.items():
        assert have[k]["count"] == row["count"], k
        assert math.isclose(have[k]["sum"], row["sum"], rel_tol=1e-9, abs_tol=1e-9), k
        assert math.isclose(
            have[k]["sum_squares"], row["sum_squares"], rel_tol=1e-9, abs_tol=1e-9
        ), k


def read_windows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def assert_matches_an_uninterrupted_run(
    kafka_tools: KafkaTools, unique: str, windows: Path, *, leaky_broker: bool = False
) -> int:
    """Results read_committed exactly once (identical copies allowed only on a broker that
    leaks aborted records) and the window rows equal to one engine fed every record; returns
    the copies seen."""
    topics = names(unique)
    expected, reference = kafka_tools.expected(
        make_settings(kafka_tools.bootstrap, unique).engine_config(),
        topics["impressions"],
        topics["feedback"],
    )
    copies = assert_exactly_once(
        results_by_id(kafka_tools, topics["results"], committed=not leaky_broker),
        expected,
        allow_identical_copies=leaky_broker,
    )
    assert_windows_equal(read_windows(windows), reference)
    return copies
