"""QueryWindows in the engine: per segment and window, exact through a snapshot and a restore."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from summary_restore import State, restored_at, summaries

from evald.config import load_config
from evald.drilldown.windows import QueryWindows
from evald.engine import Engine, Result

MIN = 60_000


def make(capacity: int = 3) -> tuple[Engine, list[Result]]:
    results: list[Result] = []
    config = load_config(
        {
            "min_event_time": 0,
            "max_event_lead": None,
            "window": 10 * MIN,
            "lateness": MIN,
            "measures": "RR,P@2",
            "windows": ["5m", "1h"],
            "retention": "6h",
            "statistics": {"bootstrap_replicates": 0},
            "drilldown": {"capacity": capacity},
        }
    )
    return Engine(config, clock=lambda: 0.0, on_result=results.append), results


def stream(seed: int, n: int = 900) -> list[tuple[str, int, bytes]]:
    """(kind, offset, raw): lists of two arms over 90 minutes, queries Zipf-like among 60 (so
    a capacity of 3 purges often), clicks on some."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 61)
    events: list[tuple[int, str, dict[str, object]]] = []
    for k in range(n):
        ts = k * 6_000
        query = f"Query {int(rng.choice(60, p=weights / weights.sum()))}"
        body = {"request_id": f"r{k}", "ts": ts, "items": ["a", "b", "c"], "query": query}
        body["labels"] = {"arm": f"{k % 2}"}
        events.append((ts, "impression", body))
        if rng.random() < 0.5:
            click = {"request_id": f"r{k}", "ts": ts + 1_000, "item": "b", "action": "click"}
            events.append((ts + 1_000, "feedback", click))
    events.sort(key=lambda e: e[0])
    offsets = Counter[str]()
    out = []
    for _, kind, body in events:
        out.append((kind, offsets[kind], json.dumps(body).encode()))
        offsets[kind] += 1
    return out


def state(engine: Engine) -> State:
    return summaries(engine.aggregates.queries)


@pytest.mark.parametrize("cut", [100, 800, 1300])
def test_a_snapshot_plus_later_results_equals_the_uninterrupted_summaries(cut: int) -> None:
    """As the window sums: loaded snapshot + the results after it == uninterrupted, with ==
    (the restore absorbs the later results in one batch, the first life in many)."""
    reference, restored, _, _ = restored_at(make, stream(11), cut)
    want = state(reference)
    assert want and state(restored) == want
    windows = reference.aggregates.queries
    assert windows is not None
    assert any(s.offset for w in windows.windows() for s in windows.merged(*w).values())


def test_summaries_rebuilt_from_results_alone_equal_the_engine_s() -> None:
    events = stream(12)
    reference, results = make()
    for kind, offset, raw in events:
        reference.feed(raw, kind=kind, offset=offset)
        reference.tick()
    reference.drain()
    rebuilt, _ = make()
    for i in range(0, len(results), 77):
        rebuilt.absorb_results([r.to_json() for r in results[i : i + 77]], 0)
    assert state(rebuilt) == state(reference)


def test_the_counts_are_within_the_bound_of_the_exact_per_query_counts() -> None:
    events = stream(13)
    engine, results = make(capacity=4)
    for kind, offset, raw in events:
        engine.feed(raw, kind=kind, offset=offset)
    engine.drain()
    windows = engine.aggregates.queries
    assert windows is not None
    for width, start in windows.windows():
        for segment, summary in windows.merged(width, start).items():
            labels = engine.segments.labels_of(segment)
            exact = Counter(
                r.query
                for r in results
                if start <= r.ts < start + width and r.labels.get("arm") == labels["arm"]
            )
            n = sum(exact.values())
            assert summary.total == n and summary.offset <= n / 5
            held = {e.query: e for e in summary.entries()}
            for query, true in exact.items():
                entry = held.get(query)
                assert true <= summary.offset if entry is None else entry.lists <= true
                if entry is not None:
                    assert true <= entry.lists_upper


def test_windows_are_pruned_with_the_retention_and_dropped_with_the_partition() -> None:
    engine, _ = make()
    for kind, offset, raw in stream(14):
        engine.feed(raw, kind=kind, offset=offset)
    engine.drain()
    windows = engine.aggregates.queries
    assert windows is not None and windows.windows()
    engine.aggregates.prune(0, 10**13)
    assert not windows.windows()
    engine.drop_partition(0)
    assert windows.partitions() == []


def test_a_snapshot_without_summaries_loads_with_none_and_a_capacity_change_is_refused() -> None:
    engine, _ = make()
    for kind, offset, raw in stream(15, 200):
        engine.feed(raw, kind=kind, offset=offset)
    engine.drain()
    other, _ = make(capacity=5)
    with pytest.raises(ValueError, match=r"capacity \d+ and base window \d+ ms there, 5 and"):
        other.load_snapshot(0, engine.snapshot(0))
    off, _ = make(capacity=0)
    off.load_snapshot(0, engine.snapshot(0))  # an evald keeping no summaries ignores them
    assert off.aggregates.queries is None
    engine.load_snapshot(0, off.snapshot(0))
    assert engine.aggregates.queries is not None and not engine.aggregates.queries.windows()


@pytest.mark.parametrize(
    "damage",
    [
        lambda meta, arrays: meta.update(queries="not a dict"),
        lambda meta, arrays: meta["queries"].update(queries=None),
        lambda meta, arrays: meta["queries"]["queries"].pop(),
        lambda meta, arrays: arrays.update({"queries.index": arrays["queries.index"] + 1e6}),
        lambda meta, arrays: arrays.pop("queries.table"),
    ],
)
def test_a_damaged_summary_part_is_refused_with_a_value_error_changing_nothing(damage) -> None:
    from evald import snapshot as codec

    engine, _ = make()
    for kind, offset, raw in stream(16, 300):
        engine.feed(raw, kind=kind, offset=offset)
    engine.drain()
    meta, arrays = codec.decode(engine.snapshot(0))
    damage(meta, arrays)
    other, _ = make()
    for kind, offset, raw in stream(17, 100):
        other.feed(raw, kind=kind, offset=offset)
    other.drain()
    before = state(other)
    with pytest.raises(ValueError):
        other.load_snapshot(0, codec.encode(meta, arrays))
    assert state(other) == before


def test_the_oldest_window_kept_keeps_the_summaries_of_all_of_it() -> None:
    """Pruning keeps a window whole (``Aggregates.reach``): the 1h window still kept holds its
    first 5 minutes' summaries too, as its sums hold its first buckets."""
    engine, _ = make()
    for kind, offset, raw in stream(15, 900):
        engine.feed(raw, kind=kind, offset=offset)
    engine.drain()
    windows = engine.aggregates.queries
    assert windows is not None
    before = {start for _, start in windows.windows()}
    assert 0 in before
    engine.aggregates.prune(0, 10 * MIN)  # the 1h window [0, 60m) does not end by 10m
    assert {start for _, start in windows.windows()} == before
    engine.aggregates.prune(0, 60 * MIN)  # now it does
    assert min(start for _, start in windows.windows()) == 60 * MIN


def test_a_restore_folding_two_segments_into_one_keeps_taking_lists() -> None:
    """Two of the writer's segments that are one here (both past the segment budget: the
    overflow) load as one merged summary holding more than 2 x capacity queries; the next
    list of that segment and window is added and purges, not a crash."""
    writer = QueryWindows(2, 1, [300_000])
    seg, ts = np.array([0] * 4 + [1] * 4), np.zeros(8, np.int64)
    queries = [f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)]
    writer.observe(0, seg, ts, queries, np.ones((8, 1)), np.ones((8, 1), bool))
    meta, arrays = writer.encode(0, {0: 0, 1: 1})
    here = QueryWindows(2, 1, [300_000])
    here.replace(0, here.decode(0, meta, arrays, np.array([5, 5])))
    assert len(here.merged(300_000, 0)[5]) == 8
    here.observe(
        0, np.array([5]), np.array([1_000]), ["new"], np.ones((1, 1)), np.ones((1, 1), bool)
    )
    merged = here.merged(300_000, 0)[5]
    assert merged.total == 9 and len(merged) <= 2
