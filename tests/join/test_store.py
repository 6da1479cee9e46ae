"""Join rules (docs/semantics.md), each driven through a real Engine with JSON bytes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from settable_clock import SettableClock

from evald.config import load_config
from evald.engine import Engine, Result
from evald.metrics import Batch, evaluate, parse_measures

MIN = 60_000
WINDOW = 10 * MIN
LATENESS = 1 * MIN


#: these tests use small epoch-ms times and a frozen clock: no event-time plausibility bound
UNBOUNDED_TIMES = {"min_event_time": 0, "max_event_lead": None}
#: the join rules are stated against the watermark, here one that follows every event: the
#: rule that confirms event times by blocks has its own tests (test_clock.py)
EVERY_EVENT = {"watermark_quorum": 1}


def imp(rid: str, ts: int, items: list[str], **labels: str) -> bytes:
    return json.dumps({"request_id": rid, "ts": ts, "items": items, "labels": labels}).encode()


def fb(rid: str, ts: int, item: str, action: str = "click", **extra: object) -> bytes:
    body = {"request_id": rid, "ts": ts, "item": item, "action": action, **extra}
    return json.dumps(body).encode()


def make(
    measures: str = "P@3,RR,nDCG@3", **settings: object
) -> tuple[Engine, list[Result], SettableClock]:
    clock = SettableClock()
    results: list[Result] = []
    config = load_config(
        {
            **UNBOUNDED_TIMES,
            **EVERY_EVENT,
            "window": WINDOW,
            "lateness": LATENESS,
            "measures": measures,
            **settings,
        }
    )
    return Engine(config, clock=clock, on_result=results.append), results, clock


def by_id(results: list[Result]) -> dict[str, Result]:
    out = {r.request_id: r for r in results}
    assert len(out) == len(results), "an impression was finalized twice"
    return out


def expected(measures: str, items: list[str], grades: dict[str, float]) -> dict[str, float]:
    """Independent oracle: the metric engine on (ranking, qrels) lists."""
    parsed = parse_measures(measures)
    qrels = {i: grades.get(i, 0.0) for i in items}
    scored = evaluate(parsed, Batch.from_lists([items], [qrels]))
    return {str(m): float(v[0]) for m, v in scored.items()}


def test_max_grade_in_window_with_mapping_and_explicit_grades():
    engine, results, _ = make()
    engine.feed(imp("r", 0, ["a", "b", "c"]))
    engine.feed(fb("r", 10, "b", "click"))
    engine.feed(fb("r", 20, "b", "purchase"))  # 3 beats click's 1
    engine.feed(fb("r", 30, "c", "add_to_cart", grade=0.5))  # explicit grade wins
    engine.feed(fb("r", 40, "a", "judgment", grade=4))
    engine.feed(fb("r", 50, "b", "click"))  # cannot lower the max
    engine.drain()
    (res,) = results
    assert res.measures == expected("P@3,RR,nDCG@3", ["a", "b", "c"], {"a": 4, "b": 3, "c": 0.5})
    assert res.reason == "drain" and not res.abandoned


def test_finalized_exactly_when_the_watermark_reaches_ts_plus_window():
    engine, results, _ = make()
    engine.feed(imp("r", 0, ["a"]))
    engine.feed(imp("s", WINDOW + LATENESS - 1, ["a"]))  # watermark = WINDOW - 1
    engine.tick()
    assert results == [] and engine.watermarks() == {0: WINDOW - 1}
    engine.feed(imp("t", WINDOW + LATENESS, ["a"]))  # watermark = WINDOW = ts + window
    engine.tick()
    assert [r.request_id for r in results] == ["r"] and results[0].reason == "window"
    assert engine.stats.finalized["window"] == 1


def test_out_of_order_within_lateness_still_joins():
    engine, results, _ = make()
    engine.feed(imp("r2", 5 * MIN, ["x", "y"]))
    engine.feed(imp("r1", 5 * MIN - LATENESS + 1, ["x", "y"]))  # older, still before watermark
    engine.feed(fb("r2", 6 * MIN, "y"))
    engine.feed(fb("r1", 5 * MIN - 10, "x"))  # older than the watermark... of neither impression
    engine.feed(imp("end", 40 * MIN, ["z"]))
    engine.tick()
    got = by_id(results)
    assert set(got) == {"r1", "r2"}
    assert got["r1"].measures["RR"] == 1.0
    assert got["r2"].measures["RR"] == 0.5
    assert engine.stats.finalized["late"] == 0


def test_feedback_after_its_impression_closed_is_orphaned():
    engine, results, _ = make()
    engine.feed(imp("r", 0, ["a"]))
    engine.feed(imp("later", WINDOW + LATENESS, ["a"]))  # closes r
    engine.feed(fb("r", 100, "a"))  # arrives too late to count: held, as for an unseen one
    engine.tick()
    assert by_id(results)["r"].abandoned
    assert engine.pending_feedback() == 1
    engine.feed(imp("much-later", WINDOW + LATENESS + 100, ["a"]))  # passes fb.ts + window
    assert engine.stats.unattributed["orphaned"] == 1
    assert engine.pending_feedback() == 0


def test_feedback_before_its_impression_is_held_then_joined():
    engine, results, _ = make()
    engine.feed(fb("r", 2_000, "b", "purchase"))
    assert engine.pending_feedback() == 1
    engine.feed(imp("r", 1_000, ["a", "b"]))
    assert engine.pending_feedback() == 0
    engine.drain()
    assert results[0].measures["RR"] == 0.5
    assert sum(engine.stats.unattributed.values()) == 0


def test_held_feedback_becomes_orphaned_when_its_window_passes():
    engine, _, _ = make()
    engine.feed(fb("ghost", 0, "a"))
    engine.feed(imp("x", WINDOW + LATENESS - 1, ["a"]))  # watermark WINDOW - 1: still held
    assert engine.pending_feedback() == 1
    engine.feed(imp("y", WINDOW + LATENESS, ["a"]))  # watermark reaches fb.ts + window
    assert engine.pending_feedback() == 0
    assert engine.stats.unattributed["orphaned"] == 1


def test_held_feedback_outside_the_window_is_early_or_late():
    engine, results, _ = make()
    engine.feed(fb("r", 500, "a"))  # before the impression's ts: early
    engine.feed(fb("r", 1_000 + WINDOW + 5, "a"))  # after its window: late
    engine.feed(imp("r", 1_000, ["a"]))
    engine.drain()
    assert results[0].abandoned
    assert engine.stats.unattributed["early"] == 1 and engine.stats.unattributed["late"] == 1


def test_duplicate_impression_is_ignored_and_counted():
    engine, results, _ = make()
    engine.feed(imp("r", 0, ["a", "b"]))
    engine.feed(imp("r", 5, ["b", "a"]))  # same request id: ignored
    engine.feed(fb("r", 10, "a"))
    engine.drain()
    (res,) = results
    assert res.measures["RR"] == 1.0  # the first list's order
    assert engine.stats.events[("impression", "duplicate")] == 1
    assert engine.stats.events[("impression", "accepted")] == 1


def test_repeated_event_id_is_counted_and_cannot_change_the_max():
    engine, results, _ = make()
    engine.feed(imp("r", 0, ["a", "b"]))
    engine.feed(fb("r", 10, "b", event_id="e1"))
    engine.feed(fb("r", 11, "b", event_id="e1"))
    engine.feed(fb("r", 12, "b", event_id="e2"))  # same item, new event: fine
    engine.feed(fb("early", 12, "b", event_id="h1"))  # held duplicates too
    engine.feed(fb("early", 13, "b", event_id="h1"))
    engine.drain()
    assert by_id(results)["r"].measures["RR"] == 0.5
    assert engine.stats.unattributed["duplicate"] == 2
    assert engine.stats.events[("feedback", "duplicate")] == 2


def test_feedback_on_an_item_not_served_is_counted_and_ignored():
    engine, results, _ = make()
    engine.feed(imp("r", 0, ["a", "b"]))
    engine.feed(fb("r", 10, "zzz", "purchase"))
    engine.drain()
    assert results[0].abandoned
    assert engine.stats.unattributed["unknown_item"] == 1


def test_an_item_served_twice_is_credited_at_its_first_rank():
    engine, results, _ = make(measures="RR,P@3")
    engine.feed(imp("r", 0, ["a", "b", "a"]))
    engine.feed(fb("r", 10, "a"))
    engine.drain()
    assert results[0].measures == {"RR": 1.0, "P@3": pytest.approx(1 / 3)}


def test_late_impression_is_finalized_at_once_with_its_held_feedback():
    engine, results, _ = make()
    engine.feed(imp("now", 60 * MIN, ["a"]))  # watermark 59m
    engine.feed(fb("old", 55 * MIN, "b"))  # held: 55m + window > watermark
    engine.feed(imp("old", 48 * MIN, ["a", "b"]))  # 48m + 10m <= 59m: late
    assert [r.request_id for r in results] == []  # scored on the next tick
    engine.tick()
    assert [r.request_id for r in results] == ["old"]
    assert results[0].measures["RR"] == 0.5
    assert engine.stats.finalized == {"window": 0, "late": 1, "cap": 0, "drain": 0}
    assert results[0].reason == "late"


def test_late_impression_in_a_batch_is_closed_as_late_too():
    engine, results, _ = make()
    engine.feed_batch(
        [imp("now", 60 * MIN, ["a"]), fb("old", 55 * MIN, "b"), imp("old", 48 * MIN, ["a", "b"])]
    )
    engine.tick()
    assert [(r.request_id, r.reason, r.measures["RR"]) for r in results] == [("old", "late", 0.5)]
    assert engine.stats.finalized == {"window": 0, "late": 1, "cap": 0, "drain": 0}


def test_idle_fallback_advances_a_quiet_partition_with_the_wall_clock():
    engine, results, clock = make(idle_timeout="5m")
    engine.feed(imp("r", 0, ["a"]), partition=3)
    engine.tick()
    start = engine.watermarks()[3]
    assert start == -LATENESS
    clock.now += 4 * 60  # quiet, but not for idle_timeout yet
    engine.tick()
    assert engine.watermarks()[3] == start and results == []
    clock.now += 60  # 5m quiet: watermark = last + 5m of wall time
    engine.tick()
    assert engine.watermarks()[3] == start + 5 * MIN
    clock.now += 6 * 60  # 11m quiet: start + 11m >= 0 + window, so r closes
    engine.tick()
    assert engine.watermarks()[3] == start + 11 * MIN
    assert [r.request_id for r in results] == ["r"] and results[0].partition == 3


def test_events_reset_the_idle_fallback():
    engine, results, clock = make(idle_timeout="5m")
    engine.feed(imp("r", 0, ["a"]))
    engine.tick()
    for _ in range(5):
        clock.now += 4 * 60
        engine.feed(fb("r", 0, "a"))  # keeps the partition busy, ts does not move
        engine.tick()
    assert engine.watermarks()[0] == -LATENESS and results == []


def test_drain_finalizes_everything_and_orphans_held_feedback():
    engine, results, _ = make()
    engine.feed(imp("a", 0, ["x"]))
    engine.feed(imp("b", 1, ["x"]), partition=1)
    engine.feed(fb("nobody", 2, "x"))
    assert engine.pending() == 2
    assert engine.drain() == 2
    assert engine.pending() == 0 and engine.pending_feedback() == 0
    assert {r.request_id for r in results} == {"a", "b"}
    assert engine.stats.finalized["drain"] == 2
    assert engine.stats.unattributed["orphaned"] == 1


def test_drain_emits_in_deadline_order_and_the_store_is_reusable():
    engine, results, _ = make()
    arrivals = [("a", 100), ("k", 200), ("b", 300), ("c", 200), ("d", 300), ("e", 150), ("f", 200)]
    arrivals += [("g", 50), ("h", 300), ("i", 120)]
    for rid, ts in arrivals:  # all within the lateness: nothing closes before the drain
        engine.feed(imp(rid, ts, ["x"]))
    engine.feed(fb("c", 210, "x"))
    assert engine.drain() == len(arrivals)
    # deadline order; equal deadlines in arrival order (sorted() is stable)
    assert [r.request_id for r in results] == [
        rid for rid, _ in sorted(arrivals, key=lambda a: a[1])
    ]
    assert by_id(results)["c"].measures["P@3"] == pytest.approx(1 / 3)
    # drained ids are forgotten: the same ids join again as new impressions
    results.clear()
    engine.feed(imp("a", 1_000, ["x", "y"]))
    engine.feed(fb("a", 1_010, "y"))
    assert engine.pending() == 1 and engine.stats.events[("impression", "duplicate")] == 0
    engine.drain()
    (res,) = results
    assert res.request_id == "a" and res.measures["RR"] == pytest.approx(0.5)


def test_every_attached_feedback_counts_in_short_and_long_chains():
    """Many lists with a few feedback events each and one with a long chain: every event is
    credited (the chains are walked partly vectorised, partly one link at a time)."""
    engine, results, _ = make(measures="P@50,nDCG@50")
    rng = np.random.default_rng(5)
    served = {f"r{n}": [f"i{n}_{k}" for k in range(50)] for n in range(60)}
    grades: dict[str, dict[str, float]] = {rid: {} for rid in served}
    for rid, items in served.items():
        engine.feed(imp(rid, 0, items))
    for rid, items in served.items():
        count = 50 if rid == "r7" else int(rng.integers(0, 6))
        for k in rng.permutation(50)[:count].tolist():
            grade = float(rng.integers(1, 4))
            engine.feed(fb(rid, 5, items[k], "judgment", grade=grade))
            grades[rid][items[k]] = max(grade, grades[rid].get(items[k], 0.0))
    engine.feed(fb("r3", 5, "not-served"))
    engine.drain()
    assert engine.stats.unattributed["unknown_item"] == 1
    got = by_id(results)
    assert len(got) == len(served) and len(grades["r7"]) == 50
    for rid, items in served.items():
        assert got[rid].measures == pytest.approx(expected("P@50,nDCG@50", items, grades[rid]))


def test_cap_finalizes_the_oldest_early_and_counts_it():
    engine, results, _ = make(max_pending=2)
    engine.feed(imp("r1", 100, ["a"]))
    engine.feed(imp("r0", 50, ["a"]))  # earliest deadline
    engine.feed(imp("r2", 200, ["a"]))  # at the cap: r0 goes
    engine.tick()
    assert [r.request_id for r in results] == ["r0"] and results[0].reason == "cap"
    assert engine.stats.finalized["cap"] == 1
    assert engine.pending() == 2


def test_held_feedback_is_bounded():
    engine, _, _ = make(max_held_feedback=3)
    for k in range(10):
        engine.feed(fb(f"r{k}", k, "a"))
    assert engine.pending_feedback() == 3
    assert engine.stats.unattributed["orphaned"] == 7


def test_abandoned_impression_scores_zero_in_every_measure():
    engine, results, _ = make(measures="nDCG@3,RR,RBP(p=0.8),AP@3")
    engine.feed(imp("r", 0, ["a", "b"], arm="B"))
    engine.feed(fb("r", 5, "a", "judgment", grade=0))  # judged, not relevant
    engine.drain()
    (res,) = results
    assert res.abandoned and set(res.measures.values()) == {0.0}
    assert engine.stats.abandoned == 1
    seg = engine.segments.segment_of({"arm": "B"})
    assert engine.aggregates.abandoned[seg] == 1


def test_results_do_not_depend_on_how_often_tick_runs():
    rng = np.random.default_rng(7)
    events = []
    for k in range(300):
        ts = k * 7_000
        items = [f"i{x}" for x in rng.choice(50, size=5, replace=False)]
        events.append((ts, imp(f"r{k}", ts, items)))
        for _ in range(rng.integers(0, 3)):
            lag = int(rng.integers(-2 * MIN, WINDOW + 2 * MIN))
            events.append((ts + lag, fb(f"r{k}", ts + lag, str(rng.choice(items)))))
    events.sort(key=lambda e: e[0] + int(rng.integers(0, 3 * LATENESS)))
    runs = []
    for every in (1, 17, 10**9):
        engine, results, _ = make()
        for n, (_, raw) in enumerate(events, start=1):
            engine.feed(raw)
            if n % every == 0:
                engine.tick()
        engine.drain()
        runs.append(({r.request_id: r.measures for r in results}, dict(engine.stats.unattributed)))
    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0][0]) == 300


def test_many_lists_of_varied_length_reuse_the_item_arena(monkeypatch):
    """Slots and item storage are recycled (compaction) and every grade lands on its item."""
    from evald.join.pending import PendingImpressions

    compactions: list[str] = []
    for name in ("compact_items", "compact_rids"):
        original = getattr(PendingImpressions, name)

        def counted(self, _original=original, _name=name):
            compactions.append(_name)
            return _original(self)

        monkeypatch.setattr(PendingImpressions, name, counted)
    engine, results, _ = make(measures="P@1000,RR")
    rng = np.random.default_rng(3)
    truth = {}
    for k in range(3_000):
        ts = k * 1_000
        n = int(rng.integers(0, 60))
        items = [f"{k}-{j}" for j in range(n)]
        rid = f"r{k}-" + "é" * int(rng.integers(0, 40))  # ids of varied (UTF-8) length
        engine.feed(imp(rid, ts, items))
        if n:
            j = int(rng.integers(0, n))
            engine.feed(fb(rid, ts + 1, items[j]))
            truth[rid] = 1 / (j + 1)
        else:
            truth[rid] = 0.0
        if k % 50 == 0:
            engine.tick()
    engine.drain()
    got = by_id(results)
    assert {k: r.measures["RR"] for k, r in got.items()} == truth
    for k, r in got.items():
        assert math.isclose(r.measures["P@1000"], (truth[k] > 0) / 1000)
    assert set(compactions) == {"compact_items", "compact_rids"}


def test_cap_counts_every_partition():
    engine, results, _ = make(max_pending=3)
    engine.feed(imp("p0-a", 10, ["a"]), partition=0)
    engine.feed(imp("p0-b", 20, ["a"]), partition=0)
    engine.feed(imp("p1-a", 5, ["a"]), partition=1)
    engine.feed(imp("p1-b", 30, ["a"]), partition=1)  # cap over both: p1's oldest goes
    engine.feed(imp("p2-a", 40, ["a"]), partition=2)  # p2 has none open: the fullest gives
    engine.tick()
    assert [(r.request_id, r.reason) for r in results] == [("p0-a", "cap"), ("p1-a", "cap")]
    assert engine.pending() == 3
