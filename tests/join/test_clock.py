"""The watermark follows confirmed event times: one event far ahead never moves it alone.

Each case runs through ``Engine.feed`` and ``Engine.feed_batch``. Window 10 min, lateness
1 min, ``watermark_jump`` 1 h (the default).
"""

from __future__ import annotations

import pytest
from settable_clock import SettableClock
from test_store import LATENESS, MIN, WINDOW, fb, imp, make

from evald.engine import Engine, Result
from evald.join.clock import PartitionClock

BOTH = pytest.mark.parametrize("batched", [False, True], ids=["feed", "feed_batch"])
HOUR = 60 * MIN


def feed_all(engine: Engine, raws: list[bytes], batched: bool, offsets: bool = False) -> None:
    offs = list(range(len(raws))) if offsets else None
    if batched:
        assert engine.feed_batch(raws, offsets=offs) == []
    else:
        for k, raw in enumerate(raws):
            engine.feed(raw, offset=None if offs is None else offs[k])


def traffic(start: int, n: int, step: int = MIN) -> list[bytes]:
    """n impressions ``step`` apart, each clicked on its second item 5 s later."""
    raws = []
    for k in range(n):
        ts = start + k * step
        raws += [imp(f"r{start}-{k}", ts, ["a", "b"]), fb(f"r{start}-{k}", ts + 5_000, "b")]
    return raws


def summary(results: list[Result]) -> dict[str, tuple[float, str]]:
    return {r.request_id: (r.measures["RR"], r.reason) for r in results}


@BOTH
@pytest.mark.parametrize("outlier", ["feedback", "impression"])
def test_one_event_hours_ahead_changes_nothing_else(batched: bool, outlier: str) -> None:
    """The issue's replay: a feedback (or impression) 3 h ahead in the middle of good traffic
    used to make every later impression late and orphan its feedback."""
    ahead = 30 * MIN + 3 * HOUR
    bad = fb("ghost", ahead, "a") if outlier == "feedback" else imp("ghost", ahead, ["a"])
    before, after = traffic(0, 30), traffic(30 * MIN, 30)
    engine, results, _ = make()
    feed_all(engine, [*before, bad, *after], batched)
    engine.tick()
    assert engine.watermarks()[0] == 59 * MIN + 5_000 - LATENESS
    clean, clean_results, _ = make()
    feed_all(clean, [*before, *after], batched)
    clean.tick()
    assert summary(results) == summary(clean_results)
    assert all(rr == 0.5 for rr, _ in summary(results).values())
    assert engine.stats.finalized["late"] == 0 and engine.stats.unattributed["orphaned"] == 0
    engine.drain()
    clean.drain()
    ghost = [r for r in results if r.request_id == "ghost"]
    assert len(results) == len(clean_results) + (outlier == "impression")
    assert ghost == [] or ghost[0].reason == "drain"


@BOTH
def test_a_second_event_near_a_far_ahead_one_confirms_it(batched: bool) -> None:
    engine, results, _ = make()
    feed_all(engine, [imp("r", 0, ["a"]), fb("r", MIN, "a")], batched)
    assert engine.watermarks()[0] == MIN - LATENESS
    feed_all(engine, [imp("far", 3 * HOUR, ["a"])], batched)
    assert engine.watermarks()[0] == MIN - LATENESS  # a candidate only
    feed_all(engine, [fb("far", 3 * HOUR - 30 * MIN, "a")], batched)  # within an hour of it
    assert engine.watermarks()[0] == 3 * HOUR - LATENESS
    engine.tick()
    assert [(r.request_id, r.reason) for r in results] == [("r", "window")]


@BOTH
def test_a_newer_far_ahead_time_replaces_the_candidate(batched: bool) -> None:
    engine, _, _ = make()
    raws = [imp("r", 0, ["a"]), fb("r", MIN, "a"), fb("x", 3 * HOUR, "a"), fb("y", 6 * HOUR, "a")]
    feed_all(engine, raws, batched)
    assert engine.watermarks()[0] == MIN - LATENESS
    feed_all(engine, [fb("z", 3 * HOUR, "a")], batched)  # near x, which y replaced
    assert engine.watermarks()[0] == MIN - LATENESS
    feed_all(engine, [fb("w", 3 * HOUR + 10 * MIN, "a")], batched)  # near z, the candidate now
    assert engine.watermarks()[0] == 3 * HOUR + 10 * MIN - LATENESS


@BOTH
def test_a_lone_first_event_is_not_trusted(batched: bool) -> None:
    """A partition's first event may itself be the outlier: it waits for a second one."""
    engine, results, _ = make()
    feed_all(engine, [imp("far", 5 * HOUR, ["a"])], batched)
    assert engine.watermarks()[0] is None
    feed_all(engine, traffic(0, 3), batched)
    assert engine.watermarks()[0] == 2 * MIN + 5_000 - LATENESS
    engine.tick()
    assert results == [] and engine.pending() == 4


@BOTH
def test_the_candidate_is_confirmed_once_traffic_catches_up(batched: bool) -> None:
    engine, _, _ = make()
    feed_all(engine, [*traffic(0, 2), fb("early", 2 * HOUR, "a")], batched)
    assert engine.watermarks()[0] == MIN + 5_000 - LATENESS
    feed_all(engine, [imp("n", HOUR + 30 * MIN, ["a"])], batched)  # within the jump: confirmed
    # ... and the candidate is now within the jump of it: confirmed too
    assert engine.watermarks()[0] == 2 * HOUR - LATENESS


@BOTH
def test_restore_keeps_the_candidate_and_does_not_count_refed_events_twice(batched: bool) -> None:
    """A checkpoint taken with a far-ahead candidate pending: after the restore, the re-fed
    candidate must not confirm itself, and a later event near it still confirms it."""
    head = [*traffic(0, 3), fb("far", 4 * HOUR, "a"), imp("open", 2 * MIN + 30_000, ["a", "b"])]
    engine, _, _ = make()
    feed_all(engine, head, batched, offsets=True)
    engine.tick()
    watermark, times = engine.checkpoint(0), engine.event_times(0)
    assert watermark == 2 * MIN + 30_000 - LATENESS and times == (2 * MIN + 30_000, 4 * HOUR)
    low = engine.low_offsets(0)
    start = min(v for v in low.values() if v is not None)

    restored, results, _ = make()
    restored.restore(0, watermark, {"impression": len(head), "feedback": len(head)}, times)
    refed = head[start:]
    offsets = list(range(start, len(head)))
    if batched:
        assert restored.feed_batch(refed, offsets=offsets) == []
    else:
        for raw, off in zip(refed, offsets, strict=True):
            restored.feed(raw, offset=off)
    assert restored.watermarks()[0] == watermark  # the re-fed candidate confirmed nothing
    assert restored.event_times(0) == times
    feed_all(restored, [fb("open", 2 * MIN + 30_000, "b")], batched)
    restored.tick()
    assert restored.watermarks()[0] == watermark
    feed_all(restored, [fb("near", 4 * HOUR - MIN, "a")], batched)
    restored.tick()
    assert restored.watermarks()[0] == 4 * HOUR - LATENESS
    assert {r.request_id: r.measures["RR"] for r in results}["open"] == 0.5


def test_a_checkpoint_without_event_times_still_restores() -> None:
    engine, _, _ = make()
    engine.restore(0, WINDOW, {"impression": 5, "feedback": 5}, None)
    assert engine.watermarks()[0] == WINDOW and engine.event_times(0) == (None, None)


# ---------------------------------------------------------------- PartitionClock on its own


def _clock(wall: SettableClock) -> PartitionClock:
    return PartitionClock(lateness=LATENESS, jump=HOUR, idle_timeout=5 * MIN, clock=wall)


def test_partition_clock_confirms_near_times_and_holds_a_far_one_as_candidate() -> None:
    clock = _clock(SettableClock())
    assert clock.observe(10 * MIN) is None  # the first time is only a candidate
    assert clock.observe(11 * MIN) == 11 * MIN - LATENESS  # confirmed by a second one near it
    assert clock.observe(11 * MIN + 3 * HOUR) is None  # far ahead: a candidate again
    assert clock.watermark == 11 * MIN - LATENESS
    assert clock.event_times() == (11 * MIN, 11 * MIN + 3 * HOUR)
    assert clock.observe(12 * MIN + 3 * HOUR) == 12 * MIN + 3 * HOUR - LATENESS
    assert clock.advance(0) is None  # never back


def test_partition_clock_idle_fallback_follows_the_injected_wall_clock() -> None:
    wall = SettableClock(1_000.0)
    clock = _clock(wall)
    clock.observe(10 * MIN)
    clock.observe(10 * MIN)
    clock.fresh = True
    assert clock.idle(wall()) is None  # the tick that first sees the event starts the count
    wall.now += 4 * 60
    assert clock.idle(wall()) is None  # quiet for less than idle_timeout
    wall.now += 60
    assert clock.idle(wall()) == 10 * MIN - LATENESS + 5 * MIN
    assert clock.watermark == 15 * MIN - LATENESS


def test_partition_clock_restored_times_continue_where_the_checkpoint_stopped() -> None:
    clock = _clock(SettableClock())
    clock.restore_times((20 * MIN, None))
    assert clock.restored
    assert clock.event_times() == (20 * MIN, None)
    assert clock.observe(21 * MIN) == 21 * MIN - LATENESS  # confirmed: near the restored time
