"""The queries report against the window before, checked against the exact per-query means of
the results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evald.config import EngineConfig, load_config
from evald.drilldown.report import Scope, query_report
from evald.engine import Engine, Result

MIN = 60_000


def report_config(**extra: object) -> EngineConfig:
    """RR over 5-minute windows of 1-minute attribution, lists at any event time."""
    return load_config(
        {
            "min_event_time": 0,
            "max_event_lead": None,
            "window": "1m",
            "lateness": "30s",
            "measures": "RR",
            "windows": ["5m"],
            "label_keys": ["arm"],
            "statistics": {"bootstrap_replicates": 0},
            **extra,
        }
    )


def engine_with(degrade_from: int) -> tuple[Engine, list[Result]]:
    """Two 5-minute windows of lists for 6 queries; from ``degrade_from`` ms, queries "q1" and
    "q2" get their click at rank 4 instead of 1 (RR 0.25 instead of 1)."""
    results: list[Result] = []
    config = report_config()
    engine = Engine(config, clock=lambda: 0.0, on_result=results.append)
    rng = np.random.default_rng(3)
    for k in range(3_000):
        ts = k * 200
        q = int(rng.choice(6, p=[0.3, 0.25, 0.2, 0.1, 0.1, 0.05]))
        rid = f"r{k}"
        body = {"request_id": rid, "ts": ts, "items": ["a", "b", "c", "d"], "query": f"q{q}"}
        engine.feed(json.dumps(body).encode())
        if rng.random() < 0.7:
            item = "d" if ts >= degrade_from and q in (1, 2) else "a"
            click = {"request_id": rid, "ts": ts + 100, "item": item, "action": "click"}
            engine.feed(json.dumps(click).encode())
    engine.drain()
    return engine, results


def exact_mean(results: list[Result], query: str, lo: int, hi: int) -> tuple[int, float]:
    values = [r.measures["RR"] for r in results if r.query == query and lo <= r.ts < hi]
    return len(values), sum(values) / len(values)


def test_the_fallen_queries_are_the_degraded_ones_with_their_exact_contributions() -> None:
    engine, results = engine_with(5 * MIN)
    (row,) = query_report(Scope(engine.aggregates), None, final=True, k=10)
    assert row["start"] == "1970-01-01T00:05:00.000Z" and row["lists"] == 1_500
    fallen = row["fallen"]["RR"]
    assert {f["query"] for f in fallen[:2]} == {"q1", "q2"}
    total_now = sum(r.measures["RR"] for r in results if r.ts >= 5 * MIN) / 1_500
    total_before = sum(r.measures["RR"] for r in results if r.ts < 5 * MIN) / 1_500
    for f in fallen:
        n, mean = exact_mean(results, f["query"], 5 * MIN, 10 * MIN)
        _, before = exact_mean(results, f["query"], 0, 5 * MIN)
        assert f["lists"] == n  # 6 queries, capacity 32: nothing purged, all exact
        assert f["mean"] == pytest.approx(mean, rel=1e-12)
        assert f["baseline_mean"] == pytest.approx(before, rel=1e-12)
        assert f["contribution"] == pytest.approx(n / 1_500 * (mean - before), rel=1e-9)
        assert f["share"] == pytest.approx(f["contribution"] / (total_now - total_before))
    assert fallen[0]["contribution"] < -0.05 and fallen[2]["contribution"] > -0.02
    tops = [t["query"] for t in row["top"]]
    assert tops[:2] == ["q0", "q1"]


def test_without_a_change_no_query_falls_much() -> None:
    """Negative control: no degradation, the same report shows no large contribution."""
    engine, _ = engine_with(10**12)
    (row,) = query_report(Scope(engine.aggregates), None, final=True, k=10)
    assert all(abs(f["contribution"]) < 0.02 for f in row["fallen"]["RR"])
