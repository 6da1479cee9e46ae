"""``Engine.feed_batch`` must do exactly what ``Engine.feed`` does event by event.

The batch path inlines the join's common case (evald.join.JoinStore.join_many) and falls back to
the one-event methods for the rest, so the property below drives streams that reach every
branch: duplicate impressions, out-of-order and late impressions, feedback before its impression
(held), early / late / duplicate / unknown-item feedback, judgments and unknown actions,
malformed records, the pending cap, a restore with re-fed offsets, several partitions, and
batch boundaries anywhere (including inside a run that closes windows).
"""

from __future__ import annotations

import itertools
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evald.config import load_config
from evald.engine import Engine, Result

MIN = 60_000
WINDOW = 10 * MIN
LATENESS = 1 * MIN


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@st.composite
def records(draw: st.DrawFn) -> tuple[str, bytes]:
    """One (source kind, raw) record; ids and times from small pools so they collide."""
    rid = f"r{draw(st.integers(0, 6))}"
    ts = draw(st.integers(0, 40)) * MIN // 2 + draw(st.integers(0, 999))
    item = f"i{draw(st.integers(0, 6))}"
    shape = draw(st.sampled_from(["imp", "imp", "fb", "fb", "fb", "judgment", "junk", "odd"]))
    if shape == "imp":
        items = draw(st.lists(st.sampled_from([f"i{k}" for k in range(7)]), min_size=1, max_size=5))
        labels = {"arm": draw(st.sampled_from(["a", "b"]))}
        body: dict[str, object] = {"request_id": rid, "ts": ts, "items": items, "labels": labels}
        return "impression", json.dumps(body).encode()
    if shape == "fb":
        body = {"request_id": rid, "ts": ts, "item": item, "action": "click"}
        if draw(st.booleans()):
            body["event_id"] = f"e{draw(st.integers(0, 2))}"
        return "feedback", json.dumps(body).encode()
    if shape == "judgment":
        body = {"request_id": rid, "ts": ts, "item": item, "action": "judgment"}
        if draw(st.booleans()):
            body["grade"] = draw(st.sampled_from([0, 1, 2.5]))
        return "feedback", json.dumps(body).encode()
    if shape == "odd":  # an action nobody configured, or a feedback sent as an impression
        body = {"request_id": rid, "ts": ts, "item": item, "action": "wink"}
        return draw(st.sampled_from(["feedback", "impression"])), json.dumps(body).encode()
    return draw(st.sampled_from(["impression", "feedback"])), b'{"request_id": '


def _engine(max_pending: int, results: list[Result], clock: Clock) -> Engine:
    config = load_config(
        {
            "window": WINDOW,
            "lateness": LATENESS,
            "max_pending": max_pending,
            "measures": "P@3,RR,nDCG@5",
        }
    )
    return Engine(config, clock=clock, on_result=results.append)


def _state(engine: Engine, results: list[Result]) -> dict[str, object]:
    stats = engine.stats
    return {
        "results": [
            (r.request_id, r.ts, r.labels, r.measures, r.partition, r.reason) for r in results
        ],
        "events": dict(stats.events),
        "rejected": dict(stats.rejected),
        "unattributed": dict(stats.unattributed),
        "finalized": dict(stats.finalized),
        "late": stats.late_impressions,
        "abandoned": stats.abandoned,
        "pending": engine.pending(),
        "held": engine.pending_feedback(),
        "watermarks": engine.watermarks(),
        "low": {p: engine.low_offsets(p) for p in (0, 1)},
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=st.lists(st.tuples(records(), st.integers(0, 1)), min_size=1, max_size=80),
    cuts=st.lists(st.integers(0, 80), max_size=8),
    max_pending=st.sampled_from([3, 1000]),
    given_kinds=st.booleans(),
    restore_at=st.none() | st.integers(0, 20),
)
def test_feed_batch_equals_feed_event_by_event(stream, cuts, max_pending, given_kinds, restore_at):
    offsets: dict[tuple[int, str], int] = {}
    rows = []  # (partition, kind, offset, raw)
    for (kind, raw), partition in stream:
        off = offsets.get((partition, kind), 0)
        offsets[(partition, kind)] = off + 1
        rows.append((partition, kind, off, raw))
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})

    outcomes = []
    for batched in (False, True):
        results: list[Result] = []
        clock = Clock()
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
    engine = _engine(1000, results, Clock())
    good = json.dumps({"request_id": "r", "ts": 0, "items": ["a"]}).encode()
    got = engine.feed_batch([b"{", good, b"[]"], kinds="impression")
    assert [(pos, r.reason) for pos, r in got] == [(0, "invalid_json"), (2, "not_an_object")]
    assert engine.stats.events[("impression", "accepted")] == 1
    assert engine.stats.events[("impression", "rejected")] == 2
    assert engine.feed_batch([]) == []


def test_feed_batch_counts_a_repeated_event_id_once_inside_one_batch():
    results: list[Result] = []
    engine = _engine(1000, results, Clock())
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
