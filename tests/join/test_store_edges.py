"""Boundary cases of the join, each run through ``Engine.feed`` and ``Engine.feed_batch``.

A mutation audit of the former inlined batch path found these edges (equalities with the
watermark, re-fed feedback, growth of the slot and feedback columns past their first size)
reached too rarely by the random property test in ``test_join_many.py`` to catch a divergence;
they stay as guards of the one join path. Window 10 min, lateness 1 min, a
watermark that follows every event (``test_store.make``).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_store import LATENESS, MIN, WINDOW, expected, fb, imp, make

from evald.engine import Engine

BOTH = pytest.mark.parametrize("batched", [False, True], ids=["feed", "feed_batch"])


def feed_all(
    engine: Engine,
    raws: list[bytes],
    batched: bool,
    offsets: list[int] | None = None,
    kinds: list[str] | None = None,
) -> None:
    if batched:
        assert engine.feed_batch(raws, offsets=offsets, kinds=kinds) == []
    else:
        for k, raw in enumerate(raws):
            engine.feed(
                raw,
                offset=None if offsets is None else offsets[k],
                kind=None if kinds is None else kinds[k],
            )


@BOTH
def test_an_impression_whose_deadline_equals_the_watermark_is_late(batched: bool) -> None:
    engine, results, _ = make()
    feed_all(engine, [imp("now", WINDOW + LATENESS, ["a"]), imp("edge", 0, ["a"])], batched)
    engine.tick()
    assert [(r.request_id, r.reason) for r in results] == [("edge", "late")]


@BOTH
def test_window_edges_are_inclusive_and_outside_is_counted(batched: bool) -> None:
    engine, results, _ = make()
    raws = [
        imp("r", 1_000, ["a", "b", "c", "d"]),
        fb("r", 1_000, "a"),  # == imp.ts: counts
        fb("r", 999, "b"),  # before the impression: early
        fb("r", 1_000 + WINDOW, "c"),  # == ts + window: counts
        fb("r", 1_000 + WINDOW + 1, "d"),  # after the window: late
    ]
    feed_all(engine, raws, batched)
    engine.drain()
    (res,) = results
    assert res.measures == expected("P@3,RR,nDCG@3", list("abcd"), {"a": 1, "c": 1})
    assert engine.stats.unattributed["early"] == 1
    assert engine.stats.unattributed["late"] == 1


@BOTH
def test_closed_when_the_watermark_reaches_ts_plus_window_exactly(batched: bool) -> None:
    engine, results, _ = make()
    feed_all(engine, [imp("r", 0, ["a"]), imp("t", WINDOW + LATENESS, ["a"])], batched)
    engine.tick()
    assert [(r.request_id, r.reason) for r in results] == [("r", "window")]


@BOTH
def test_the_idle_fallback_runs_after_a_batch_too(batched: bool) -> None:
    engine, _, clock = make(idle_timeout="5m")
    feed_all(engine, [imp("r", 0, ["a"])], batched)
    engine.tick()
    clock.now += 5 * 60
    engine.tick()
    assert engine.watermarks()[0] == -LATENESS + 5 * MIN


@BOTH
def test_events_without_offsets_leave_no_low_offsets(batched: bool) -> None:
    engine, _, _ = make()
    feed_all(engine, [imp("a", 0, ["x"]), fb("a", 1, "x")], batched)
    assert engine.low_offsets(0) == {"impression": None, "feedback": None}


@BOTH
def test_held_feedback_whose_deadline_equals_the_watermark_is_orphaned_at_once(
    batched: bool,
) -> None:
    engine, results, _ = make()
    feed_all(engine, [imp("now", WINDOW + LATENESS, ["a"]), fb("x", 0, "a")], batched)
    assert engine.pending_feedback() == 0
    assert engine.stats.unattributed["orphaned"] == 1
    feed_all(engine, [imp("x", 0, ["a"])], batched)  # late; must not get the orphaned click
    engine.tick()
    assert [(r.request_id, r.measures["RR"]) for r in results] == [("x", 0.0)]


@BOTH
def test_equal_deadlines_close_in_arrival_order(batched: bool) -> None:
    engine, results, _ = make()
    raws = [
        imp("A", 100, ["a"]),
        imp("C", 200, ["a"]),
        imp("B", 100, ["a"]),
        imp("end", 100 * MIN, ["a"]),
    ]
    feed_all(engine, raws, batched)
    engine.tick()
    assert [r.request_id for r in results] == ["A", "B", "C"]


@BOTH
def test_re_fed_feedback_is_never_counted_again(batched: bool) -> None:
    """After a restore, feedback below the consumed offset was counted before the crash,
    whatever becomes of it now."""
    engine, _, _ = make()
    engine.restore(0, 15 * MIN, {"impression": 0, "feedback": 100})
    raws = [
        imp("r", 10 * MIN, ["a"]),  # new
        fb("o", 1, "a"),  # re-fed, orphaned at once
        fb("r", 9 * MIN, "a"),  # re-fed, early
        fb("r", 11 * MIN, "a", event_id="e"),  # re-fed, attached
        fb("r", 12 * MIN, "a", event_id="e"),  # re-fed, duplicate
        fb("h", 11 * MIN, "a", event_id="f"),  # re-fed, held
        fb("h", 11 * MIN, "a", event_id="f"),  # re-fed, held duplicate
        fb("r", 10 * MIN + WINDOW + 1, "a"),  # re-fed, late
    ]
    kinds = ["impression"] + ["feedback"] * 7
    feed_all(engine, raws, batched, [0, 0, 1, 2, 3, 4, 5, 6], kinds)
    engine.drain()
    assert not any(engine.stats.unattributed.values()), engine.stats.unattributed


def test_a_batch_without_offsets_is_never_taken_as_re_fed() -> None:
    engine, _, _ = make()
    engine.restore(0, 0, {"impression": 5, "feedback": 5})
    engine.feed_batch([imp("a", MIN, ["x"])])
    assert engine.stats.events[("impression", "accepted")] == 1


@BOTH
def test_held_feedback_is_forgotten_once_attached(batched: bool) -> None:
    engine, _, _ = make()
    feed_all(engine, [fb("r", 1, "a"), imp("r", 0, ["a"])], batched)
    assert engine._stores[0].held_request_id_count() == 0


def _dense_stream(every: int, n: int = 5000) -> list[tuple[str, bytes]]:
    """~6000 impressions open at once (100 ms apart, 10 min window): the slot columns, the
    request-id table and the feedback columns all grow past their first size. Every
    ``every``-th impression has a click that arrives before it (held, then attached)."""
    rng = np.random.default_rng(7)
    rows = []
    for k in range(n):
        ts = k * 100
        items = [f"i{x}" for x in rng.choice(20, size=3, replace=False)]
        if k % every == 0:
            rows.append(("feedback", fb(f"r{k}", ts, items[1])))
        rows.append(("impression", imp(f"r{k}", ts, items)))
        rows.append(("feedback", fb(f"r{k}", ts + 50, items[0], event_id="e")))
    return rows


@pytest.mark.parametrize("every", [5, 7])  # which path grows the feedback columns first
@pytest.mark.parametrize("re_fed", [0, 3000])
def test_feed_batch_equals_feed_when_every_column_grows(re_fed: int, every: int) -> None:
    rows = _dense_stream(every)
    outcomes = []
    for batched in (False, True):
        engine, results, _ = make()
        if re_fed:  # the first records are re-fed after a restore
            engine.restore(0, 0, {"impression": re_fed, "feedback": re_fed})
        next_offset = {"impression": 0, "feedback": 0}
        records = []
        for kind, raw in rows:
            records.append((kind, next_offset[kind], raw))
            next_offset[kind] += 1
        for lo in range(0, len(records), 997):
            chunk = records[lo : lo + 997]
            feed_all(
                engine,
                [raw for _, _, raw in chunk],
                batched,
                [off for _, off, _ in chunk],
                [kind for kind, _, _ in chunk],
            )
            engine.tick()
        low = engine.low_offsets(0)
        engine.drain()
        outcomes.append(
            (
                [(r.request_id, r.measures) for r in results],
                low,
                dict(engine.stats.unattributed),
                dict(engine.stats.events),
            )
        )
    assert outcomes[0][0], "nothing was scored"
    assert outcomes[1] == outcomes[0]
