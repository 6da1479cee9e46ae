"""``Engine.feed_batch`` must do exactly what ``Engine.feed`` does event by event.

Both go through the one join kernel (evald.join.JoinStore.join_many; ``feed`` passes a batch of
one), so what this guards is the engine around it: decoding, counting, batch cuts; the
property below drives streams that reach every branch of the join: duplicate impressions,
out-of-order and late impressions, feedback before its impression (held), early / late /
duplicate / unknown-item feedback, judgments and unknown actions, malformed records, the
pending cap, a restore with re-fed offsets, several partitions, and batch boundaries anywhere
(including inside a run that closes windows).
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from settable_clock import SettableClock

from evald.config import load_config
from evald.engine import Engine, Result

MIN = 60_000
WINDOW = 10 * MIN
LATENESS = 1 * MIN


@st.composite
def records(draw: st.DrawFn) -> tuple[str, dict[str, object] | bytes, int]:
    """One (source kind, body or raw bytes, time jitter) record; ids come from small pools so
    they collide. The test sets ``ts`` from the record's position plus the jitter: mostly in
    order with small disorder, sometimes far out of order."""
    rid = f"r{draw(st.integers(0, 6))}"
    # on a 10 s grid, so that equal timestamps (and deadlines equal to a watermark) are common
    jitter = 10_000 * draw(st.one_of(st.integers(-9, 6), st.integers(-120, 120)))
    item = f"i{draw(st.integers(0, 6))}"
    shape = draw(st.sampled_from(["imp", "imp", "fb", "fb", "fb", "judgment", "junk", "odd"]))
    if shape == "imp":
        if draw(st.booleans()):  # a fresh id: late impressions are mostly not duplicates
            rid = f"u{draw(st.integers(0, 10**6))}"
        items = draw(st.lists(st.sampled_from([f"i{k}" for k in range(7)]), min_size=1, max_size=5))
        labels = {"arm": draw(st.sampled_from(["a", "b"]))}
        body: dict[str, object] = {"request_id": rid, "items": items, "labels": labels}
        return "impression", body, jitter
    if shape == "fb":
        body = {"request_id": rid, "item": item, "action": "click"}
        if draw(st.booleans()):
            body["event_id"] = f"e{draw(st.integers(0, 2))}"
        return "feedback", body, jitter
    if shape == "judgment":
        body = {"request_id": rid, "item": item, "action": "judgment"}
        if draw(st.booleans()):
            body["grade"] = draw(st.sampled_from([0, 1, 2.5]))
        return "feedback", body, jitter
    if shape == "odd":  # an action nobody configured, or a feedback sent as an impression
        body = {"request_id": rid, "item": item, "action": "wink"}
        return draw(st.sampled_from(["feedback", "impression"])), body, jitter
    return draw(st.sampled_from(["impression", "feedback"])), b'{"request_id": ', jitter


#: these tests use small epoch-ms times and a frozen clock: no event-time plausibility bound
UNBOUNDED_TIMES = {"min_event_time": 0, "max_event_lead": None}


def _engine(max_pending: int, results: list[Result], clock: SettableClock) -> Engine:
    config = load_config(
        {
            **UNBOUNDED_TIMES,
            "window": WINDOW,
            "lateness": LATENESS,
            "max_pending": max_pending,
            "measures": "P@3,RR,nDCG@5",
        }
    )
    return Engine(config, clock=clock, on_result=results.append)


def _scanned_low_offsets(engine: Engine, partition: int) -> dict[str, int | None]:
    """Oracle for Engine.low_offsets: a full scan of the store's pending state."""
    store = engine._stores.get(partition)
    if store is None:
        return {"impression": None, "feedback": None}
    scanned = store.scanned_offsets()
    imp, fbs = scanned["impression"], scanned["feedback"]
    return {"impression": min(imp, default=None), "feedback": min(fbs, default=None)}


def _state(engine: Engine, results: list[Result]) -> dict[str, object]:
    for partition in (0, 1):
        assert engine.low_offsets(partition) == _scanned_low_offsets(engine, partition)
    stats = engine.stats
    return {
        "results": [
            (r.request_id, r.ts, r.labels, r.measures, r.partition, r.reason) for r in results
        ],
        "events": dict(stats.events),
        "rejected": dict(stats.rejected),
        "unattributed": dict(stats.unattributed),
        "finalized": dict(stats.finalized),
        "abandoned": stats.abandoned,
        "pending": engine.pending(),
        "held": engine.pending_feedback(),
        "watermarks": engine.watermarks(),
        "low": {p: engine.low_offsets(p) for p in (0, 1)},
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    # at 40 s per record and a 10 min window, windows close only after ~16 records
    stream=st.lists(st.tuples(records(), st.integers(0, 1)), min_size=40, max_size=120),
    cuts=st.lists(st.integers(0, 120), max_size=12),
    max_pending=st.sampled_from([3, 1000]),
    given_kinds=st.booleans(),
    restore_at=st.none() | st.integers(0, 20),
)
def test_feed_batch_equals_feed_event_by_event(stream, cuts, max_pending, given_kinds, restore_at):
    offsets: dict[tuple[int, str], int] = {}
    rows = []  # (partition, kind, offset, raw)
    for index, ((kind, body, jitter), partition) in enumerate(stream):
        if isinstance(body, bytes):
            raw = body
        else:
            raw = json.dumps({**body, "ts": max(0, index * 40_000 + jitter)}).encode()
        off = offsets.get((partition, kind), 0)
        offsets[(partition, kind)] = off + 1
        rows.append((partition, kind, off, raw))
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})

    outcomes = []
    for batched in (False, True):
        results: list[Result] = []
        clock = SettableClock()
        engine = _engine(max_pending, results, clock)
        if restore_at is not None:  # re-fed offsets below restore_at are silent
            for partition in (0, 1):
                engine.restore(
                    partition, 5 * MIN, {"impression": restore_at, "feedback": restore_at}
                )
        rejected: list[tuple[int, int, str]] = []
        trajectory = []  # the state after every batch, not only at the end
        for lo, hi in itertools.pairwise(bounds):
            for partition in (0, 1):
                part = [(k, row) for k, row in enumerate(rows[lo:hi], lo) if row[0] == partition]
                if not part:
                    continue
                kinds = [row[1] for _, row in part] if given_kinds else None
                offs = [row[2] for _, row in part]
                raws = [row[3] for _, row in part]
                if batched:
                    for pos, rejection in engine.feed_batch(
                        raws, partition=partition, kinds=kinds, offsets=offs
                    ):
                        rejected.append((partition, offs[pos], rejection.reason))
                else:
                    for pos, raw in enumerate(raws):
                        got = engine.feed(
                            raw,
                            partition=partition,
                            kind=None if kinds is None else kinds[pos],
                            offset=offs[pos],
                        )
                        if got.__class__.__name__ == "Rejection":
                            rejected.append((partition, offs[pos], got.reason))  # type: ignore[union-attr]
            clock.now += 1.0
            engine.tick()
            trajectory.append(_state(engine, results))
        engine.drain()
        outcomes.append((trajectory, _state(engine, results), sorted(rejected)))
    assert outcomes[1] == outcomes[0]


def test_feed_batch_returns_each_rejection_with_its_position():
    results: list[Result] = []
    engine = _engine(1000, results, SettableClock())
    good = json.dumps({"request_id": "r", "ts": 0, "items": ["a"]}).encode()
    got = engine.feed_batch([b"{", good, b"[]"], kinds="impression")
    assert [(pos, r.reason) for pos, r in got] == [(0, "invalid_json"), (2, "not_an_object")]
    assert engine.stats.events[("impression", "accepted")] == 1
    assert engine.stats.events[("impression", "rejected")] == 2
    assert engine.feed_batch([]) == []


def test_feed_batch_counts_a_repeated_event_id_once_inside_one_batch():
    results: list[Result] = []
    engine = _engine(1000, results, SettableClock())
    raws = [
        json.dumps({"request_id": "r", "ts": 0, "items": ["a", "b"]}).encode(),
        json.dumps(
            {"request_id": "r", "ts": 5, "item": "b", "action": "click", "event_id": "e"}
        ).encode(),
        json.dumps(
            {"request_id": "r", "ts": 6, "item": "a", "action": "purchase", "event_id": "e"}
        ).encode(),
    ]
    assert engine.feed_batch(raws) == []
    engine.drain()
    assert engine.stats.events[("feedback", "duplicate")] == 1
    assert engine.stats.unattributed["duplicate"] == 1
    assert results[0].measures["RR"] == 0.5  # only the click on "b" (rank 2) counts


def _realistic(seed: int, n: int = 300) -> list[tuple[int, str, bytes]]:
    """(partition, kind, raw) of realistic traffic: impressions nearly in order, feedback
    mostly inside the window after them (sometimes before, late, repeated or for an item
    not served), a few duplicates and malformed records, two partitions."""
    rng = np.random.default_rng(seed)
    timed: list[tuple[int, int, str, bytes]] = []
    for k in range(n):
        ts = k * 15_000 + int(rng.integers(-LATENESS // 2, LATENESS // 2))
        rid = f"r{k}" if rng.random() > 0.05 else f"r{max(0, k - 3)}"  # some duplicates
        items = [f"i{x}" for x in rng.choice(40, size=int(rng.integers(1, 8)), replace=False)]
        partition = int(rng.integers(0, 2))
        body = {"request_id": rid, "ts": max(0, ts), "items": items, "labels": {"arm": "ab"[k % 2]}}
        timed.append((ts, partition, "impression", json.dumps(body).encode()))
        for _ in range(int(rng.integers(0, 4))):
            lag = int(rng.choice([-MIN, 0, WINDOW // 3, WINDOW // 2, WINDOW + 2 * MIN]))
            lag += int(rng.integers(0, MIN))
            item = str(rng.choice(items)) if rng.random() > 0.1 else "unserved"
            fbody: dict[str, object] = {
                "request_id": rid,
                "ts": max(0, ts + lag),
                "item": item,
                "action": "click",
            }
            if rng.random() < 0.5:
                fbody["event_id"] = f"e{int(rng.integers(0, 3))}"
            timed.append((ts + lag, partition, "feedback", json.dumps(fbody).encode()))
        if rng.random() < 0.03:
            timed.append((ts, partition, "feedback", b"not json"))
    timed.sort(key=lambda e: e[0] + int(rng.integers(0, LATENESS)))
    return [(p, kind, raw) for _, p, kind, raw in timed]


@pytest.mark.parametrize("seed", range(6))
def test_feed_batch_equals_feed_on_realistic_traffic(seed):
    rng = np.random.default_rng(1000 + seed)
    stream = _realistic(seed)
    max_pending = [40, 100_000][seed % 2]
    restore = seed >= 4
    offsets: dict[tuple[int, str], int] = {}
    rows = []
    for partition, kind, raw in stream:
        off = offsets.get((partition, kind), 0)
        offsets[(partition, kind)] = off + 1
        rows.append((partition, kind, off, raw))
    cuts = sorted({0, len(rows), *rng.integers(0, len(rows), size=40).tolist()})

    outcomes = []
    for batched in (False, True):
        results: list[Result] = []
        clock = SettableClock()
        engine = _engine(max_pending, results, clock)
        if restore:
            for partition in (0, 1):
                engine.restore(partition, 20 * MIN, {"impression": 30, "feedback": 50})
        trajectory = []
        for lo, hi in itertools.pairwise(cuts):
            for partition in (0, 1):
                part = [row for row in rows[lo:hi] if row[0] == partition]
                if not part:
                    continue
                kinds = [row[1] for row in part]
                offs = [row[2] for row in part]
                if batched:
                    engine.feed_batch(
                        [row[3] for row in part], partition=partition, kinds=kinds, offsets=offs
                    )
                else:
                    for _, kind, off, raw in part:
                        engine.feed(raw, partition=partition, kind=kind, offset=off)
            clock.now += 1.0
            engine.tick()
            trajectory.append(_state(engine, results))
        engine.drain()
        outcomes.append((trajectory, _state(engine, results)))
    assert outcomes[1] == outcomes[0]
    final = outcomes[0][1]
    assert final["results"] and final["unattributed"]["early"] and final["unattributed"]["late"]
