"""The queries report against a brute-force oracle: plain Python over the result records.

Two 5-minute windows serve the same schedule of lists (the same queries in the same order,
lists without a query among them, the same clicked rank per slot), so the traffic mix holds
and only the degraded queries' means move: then each query's contribution is its lists over
the segment's (those without a query too) times its change of mean, and the contributions
add up to the segment's change (docs/drilldown.md, "Reading it")."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from test_report import report_config

from evald.drilldown.report import Scope, query_report
from evald.engine import Engine, Result

MIN = 60_000
WINDOW = 5 * MIN


def replay(schedule: list[str | None], degraded: set[str], seed: int) -> tuple[dict, list[Result]]:
    """The report's rows of the second window, and the results, for ``schedule`` served in
    each window; the degraded queries' click moves 3 ranks down in the second."""
    results: list[Result] = []
    config = report_config(drilldown={"capacity": 256, "top": 1000})
    engine = Engine(config, clock=lambda: 0.0, on_result=results.append)
    ranks = np.random.default_rng(seed).integers(0, 4, len(schedule)).tolist()
    step = WINDOW // len(schedule)
    for w in (0, 1):
        for i, (query, rank) in enumerate(zip(schedule, ranks, strict=True)):
            ts, rid = w * WINDOW + i * step, f"r{w}-{i}"
            body: dict = {"request_id": rid, "ts": ts, "items": list("abcdefgh")}
            if query is not None:
                body["query"] = query
            engine.feed(json.dumps(body).encode())
            at = rank + 3 if w and query in degraded else rank
            click = {"request_id": rid, "ts": ts + 100, "item": "abcdefgh"[at], "action": "click"}
            engine.feed(json.dumps(click).encode())
    engine.drain()
    (row,) = query_report(Scope(engine.aggregates), None, final=True, k=1000)
    return row, results


def oracle(results: list[Result]) -> tuple[dict[str, dict], float]:
    """query -> its exact lists, mean, baseline mean, contribution; and the segment's change
    of mean: every list of the window, with a query or not."""
    by: dict[tuple[int, str], list[float]] = defaultdict(list)
    every: dict[int, list[float]] = defaultdict(list)
    for r in results:
        w = r.ts // WINDOW
        every[w].append(r.measures["RR"])
        if r.query:
            by[(w, r.query)].append(r.measures["RR"])
    change = sum(every[1]) / len(every[1]) - sum(every[0]) / len(every[0])
    out = {}
    for (w, query), now in by.items():
        if w != 1 or (0, query) not in by:
            continue
        before = by[(0, query)]
        delta = sum(now) / len(now) - sum(before) / len(before)
        out[query] = {
            "lists": len(now),
            "mean": sum(now) / len(now),
            "baseline_mean": sum(before) / len(before),
            "contribution": len(now) / len(every[1]) * delta,
        }
    return out, change


def check(row: dict, results: list[Result]) -> None:
    """Every fallen row against the oracle; the contributions add up to the change."""
    expected, change = oracle(results)
    fallen = row["fallen"]["RR"]
    assert {f["query"] for f in fallen} == set(expected)
    for f in fallen:
        want = expected[f["query"]]
        for key, value in want.items():
            assert f[key] == pytest.approx(value, rel=1e-12, abs=1e-15), (f["query"], key)
        if change:
            assert f["share"] == pytest.approx(want["contribution"] / change, rel=1e-9)
        else:  # the segment did not change: no share
            assert f["share"] is None
    assert sum(f["contribution"] for f in fallen) == pytest.approx(change, rel=1e-9)
    order = [(f["contribution"], f["query"]) for f in fallen]
    assert order == sorted(order)  # most negative first, ties by the query's text


def schedules() -> dict[str, tuple[list[str | None], set[str]]]:
    rng = np.random.default_rng(18)
    small = [f"q{i}" for i in range(40)]
    mixed: list[str | None] = [str(q) for q in rng.choice(small, 300)] + [None] * 300
    rng.shuffle(mixed)  # type: ignore[arg-type]
    big: list[str | None] = ["big"] * 200 + [str(q) for q in rng.choice(small, 200)] + [None] * 200
    rng.shuffle(big)  # type: ignore[arg-type]
    return {
        "one query, half the lists without one": (["only", None] * 300, {"only"}),
        "a segment with one query": (["only"] * 600, {"only"}),
        "one big query among small ones": (big, {"big"}),
        "a drop spread over many small queries": (mixed, set(small)),
        "no drop": (mixed, set()),
    }


@pytest.mark.parametrize("name", list(schedules()))
def test_contributions_equal_the_oracle_s_and_add_up_to_the_segment_s_change(name: str) -> None:
    schedule, degraded = schedules()[name]
    row, results = replay(schedule, degraded, seed=7)
    check(row, results)
    if degraded == {"only"}:  # the only query carries the whole drop
        (f,) = row["fallen"]["RR"]
        assert f["share"] == pytest.approx(1.0)


def test_the_oracle_catches_contributions_weighed_by_the_lists_with_a_query_only() -> None:
    """Negative control: the planted error (a query's lists over the summary's lists, those
    with a query only, as the report once had it) fails the check."""
    schedule, degraded = schedules()["one big query among small ones"]
    row, results = replay(schedule, degraded, seed=7)
    check(row, results)
    for f in row["fallen"]["RR"]:
        f["contribution"] = f["lists"] / row["lists"] * (f["mean"] - f["baseline_mean"])
    with pytest.raises(AssertionError):
        check(row, results)
