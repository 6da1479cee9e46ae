"""The non-segment label pairs' summaries: the pair encoding, which keys are taken, the memory
bound under a hostile key, and exactness through a snapshot and a restore."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from summary_restore import State, restored_at, summaries

from evald import snapshot as codec
from evald.config import load_config
from evald.drilldown.labels import LabelPairs, pair, split
from evald.engine import Engine, Result

MIN = 60_000


@pytest.mark.parametrize(
    ("key", "value"),
    [("device", "android"), ("1:a", "b"), ("", ""), ("k", "12:x"), ("é\x00:", "\n:3")],
)
def test_a_pair_splits_back_whatever_its_characters(key: str, value: str) -> None:
    assert split(pair(key, value)) == (key, value)


def test_a_list_s_pairs_are_its_other_keys_in_code_point_order_the_first_max_keys() -> None:
    pairs = LabelPairs(["arm", "surface"], max_keys=2)
    labels = {"surface": "web", "z": "1", "arm": "a", "query": "q", "b": "2", "a": "3"}
    assert pairs.pairs(labels) == [pair("a", "3"), pair("b", "2")]
    assert pairs.pairs({"arm": "a"}) == []
    rows, items = pairs.expand([{"x": "1", "y": "2"}, {}, {"x": "3"}])
    assert rows.tolist() == [0, 0, 2] and items == [pair("x", "1"), pair("y", "2"), pair("x", "3")]


def test_a_batch_sharing_one_key_set_gets_the_pairs_of_each_list_in_order() -> None:
    """The batch path (every list with the same keys, in any insertion order) equals the
    pairs list by list, rows included; a batch mixing key sets too."""
    pairs = LabelPairs(["arm"], max_keys=2)
    same = [{"arm": "a", "z": str(i), "query": "q", "b": f"v{i}", "a": "x" * i} for i in range(5)]
    reordered = [dict(reversed(list(labels.items()))) for labels in same]
    for batch in (same, same[:1], reordered, [*same, *reordered, {}, {"b": "1"}]):
        rows, items = pairs.expand(batch)
        expected = [(i, p) for i, labels in enumerate(batch) for p in pairs.pairs(labels)]
        assert rows.dtype == np.intp
        assert list(zip(rows.tolist(), items, strict=True)) == expected
    assert pairs.expand([{"arm": "a"}] * 3)[1] == []


def make(label_capacity: int = 2, label_keys: int = 8) -> tuple[Engine, list[Result]]:
    results: list[Result] = []
    config = load_config(
        {
            "min_event_time": 0,
            "max_event_lead": None,
            "window": 10 * MIN,
            "lateness": MIN,
            "measures": "RR,P@2",
            "label_keys": ["arm"],
            "windows": ["5m", "1h"],
            "retention": "6h",
            "statistics": {"bootstrap_replicates": 0},
            "drilldown": {"label_capacity": label_capacity, "label_keys": label_keys},
        }
    )
    return Engine(config, clock=lambda: 0.0, on_result=results.append), results


def stream(seed: int, n: int = 900) -> list[tuple[str, int, bytes]]:
    """(kind, offset, raw): lists of two arms over 90 minutes with a device among 5 (Zipf-like),
    a country among 3 and a session id new on every list; clicks on some."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 6)
    events: list[tuple[int, str, dict[str, object]]] = []
    for k in range(n):
        ts = k * 6_000
        labels = {
            "arm": f"{k % 2}",
            "device": f"d{int(rng.choice(5, p=weights / weights.sum()))}",
            "country": ["de", "fr", "it"][int(rng.integers(3))],
            "session": f"s{k}",
        }
        body = {"request_id": f"r{k}", "ts": ts, "items": ["a", "b", "c"], "labels": labels}
        body["query"] = f"q{int(rng.integers(4))}"
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
    return summaries(engine.aggregates.labels)


@pytest.mark.parametrize("cut", [100, 800, 1300])
def test_a_snapshot_plus_later_results_equals_the_uninterrupted_label_summaries(cut: int) -> None:
    """The results carry every label of their list: a loaded snapshot plus the results after
    it rebuild the label summaries exactly (purges included), as for the queries."""
    reference, restored, snap, later = restored_at(make, stream(11), cut)
    want = state(reference)
    assert want and state(restored) == want
    # and without the snapshot's label part (when it held any), the restore does not get there
    meta, arrays = codec.decode(snap)
    if cut > 100:  # (at 100 no list was scored yet)
        assert meta.pop("labels")["queries"]
        bare, _ = make()
        parts = {k: v for k, v in arrays.items() if not k.startswith("labels.")}
        bare.load_snapshot(0, codec.encode(meta, parts))
        bare.absorb_results(later, 0)
        assert state(bare) != want


def test_a_hostile_key_costs_bounded_memory_and_the_counts_keep_their_bound() -> None:
    """A session id new on every list: each summary holds at most 2 x label_capacity pairs,
    and every device and country pair's count is within the bound of the exact count."""
    engine, results = make(label_capacity=4)
    for kind, offset, raw in stream(13):
        engine.feed(raw, kind=kind, offset=offset)
    engine.drain()
    windows = engine.aggregates.labels
    assert windows is not None
    for width, start in windows.windows():
        for segment, summary in windows.merged(width, start).items():
            arm = engine.segments.labels_of(segment)["arm"]
            mine = [r for r in results if start <= r.ts < start + width and r.labels["arm"] == arm]
            exact = Counter(pair(k, v) for r in mine for k, v in r.labels.items() if k != "arm")
            n = sum(exact.values())
            assert summary.total == n and summary.offset <= n / 5
            held = {e.query: e for e in summary.entries()}
            for item, true in exact.items():
                entry = held.get(item)
                if entry is None:
                    assert true <= summary.offset
                else:
                    assert entry.lists <= true <= entry.lists_upper
            if width == windows.base:  # one partition: the base window's summary itself
                assert len(summary) <= 2 * 4


def test_an_old_snapshot_loads_without_label_summaries_and_a_capacity_change_is_refused() -> None:
    engine, _ = make()
    for kind, offset, raw in stream(15, 200):
        engine.feed(raw, kind=kind, offset=offset)
    engine.drain()
    other, _ = make(label_capacity=3)
    with pytest.raises(ValueError, match="label summaries were kept with another capacity"):
        other.load_snapshot(0, engine.snapshot(0))
    meta, arrays = codec.decode(engine.snapshot(0))
    del meta["labels"]  # as an evald before the label summaries wrote it
    old = codec.encode(meta, {k: v for k, v in arrays.items() if not k.startswith("labels.")})
    engine.load_snapshot(0, old)
    assert engine.aggregates.labels is not None and not engine.aggregates.labels.windows()
    off, _ = make(label_keys=0)
    off.load_snapshot(0, engine.snapshot(0))  # an evald keeping none ignores them
    assert off.aggregates.labels is None
