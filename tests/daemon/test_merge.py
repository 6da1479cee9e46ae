"""The per-partition merge that makes the engine's input order a function of the data."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st
from settable_clock import SettableClock

from evald.daemon.main.merge import Merger

#: ``caught_up`` values: known caught up as of any time (or paused), and not known caught up
UP, BEHIND = math.inf, -math.inf
BOTH = {"impression": UP, "feedback": UP}


def released(merger: Merger[str], caught_up: dict[str, float]) -> list[tuple[str, str]]:
    """One (kind, record) pair per released record, in feed order."""
    return [(kind, record) for kind, run in merger.release_runs(caught_up) for record in run]


def test_releases_in_timestamp_order_with_impressions_first_on_ties() -> None:
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock)
    for ts, name in ((10, "i10"), (20, "i20"), (30, "i30")):
        merger.push("impression", ts, name)
    for ts, name in ((5, "f5"), (20, "f20"), (25, "f25")):
        merger.push("feedback", ts, name)
    # i30 waits: no feedback after it is known yet
    assert [r for _, r in released(merger, BOTH)] == ["f5", "i10", "i20", "f20", "f25"]
    assert merger.buffered() == 1 and merger.buffered("impression") == 1
    merger.push("feedback", 31, "f31")
    assert [r for _, r in released(merger, BOTH)] == ["i30"]


def test_a_lone_record_waits_for_the_hold_time_then_goes() -> None:
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock)
    merger.push("feedback", 50, "f50")
    assert released(merger, BOTH) == []
    clock.now += 1.9
    assert released(merger, BOTH) == []
    clock.now += 0.2
    assert released(merger, BOTH) == [("feedback", "f50")]


def test_offset_order_within_a_kind_is_kept_even_if_timestamps_go_back() -> None:
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock)
    merger.push("impression", 40, "i40")
    merger.push("impression", 10, "i10-later-offset")
    merger.push("feedback", 100, "f100")
    assert [r for _, r in released(merger, BOTH)] == ["i40", "i10-later-offset"]
    merger.clear()
    assert merger.buffered() == 0


def test_a_lone_record_waits_longer_while_the_other_topic_is_behind() -> None:
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    merger.push("impression", 50, "i50")
    behind = {"impression": UP, "feedback": BEHIND}
    clock.now += 10
    assert released(merger, behind) == []
    assert released(merger, BOTH) == [("impression", "i50")]
    merger.push("impression", 60, "i60")
    clock.now += 30
    assert released(merger, behind) == [("impression", "i60")]


def reference_release(
    imp: list[tuple[int, float, str]],
    fb: list[tuple[int, float, str]],
    now: float,
    hold_s: float,
    max_hold_s: float,
    caught_up: dict[str, float],
) -> list[tuple[str, str]]:
    """The merge rule spelled out one record at a time: heads compared; a lone head goes if it
    sorts before the other kind's latest record (all were extended before), else it is held."""
    queues = {"impression": list(imp), "feedback": list(fb)}
    seen = {kind: q[-1][0] if q else None for kind, q in queues.items()}
    out = []
    while queues["impression"] or queues["feedback"]:
        i, f = queues["impression"], queues["feedback"]
        if i and f:
            kind = "impression" if (i[0][0], 0) <= (f[0][0], 1) else "feedback"
        else:
            kind = "impression" if i else "feedback"
            other = "feedback" if i else "impression"
            head = queues[kind][0]
            last = seen[other]
            behind = last is not None and (head[0], kind == "feedback") < (
                last,
                other == "feedback",
            )
            waited = now - head[1]
            fresh = caught_up[other] > head[1]  # the other topic was at its end after it arrived
            if not behind and (waited < hold_s or (waited < max_hold_s and not fresh)):
                break
        out.append((kind, queues[kind].pop(0)[2]))
    return out


arrivals = st.lists(
    st.tuples(st.integers(0, 30), st.sampled_from([0.0, 1.0, 2.5, 40.0])), max_size=25
)


#: when the other topic was last known at its end: never, between the arrival bursts, always
caught_up_times = st.sampled_from([BEHIND, 980.0, 998.0, 999.5, UP])


@given(arrivals, arrivals, caught_up_times, caught_up_times)
def test_runs_release_exactly_what_the_record_at_a_time_rule_releases(
    imp_in: list[tuple[int, float]],
    fb_in: list[tuple[int, float]],
    imp_caught_up: float,
    fb_caught_up: float,
) -> None:
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    imp, fb = [], []
    # records arrive in bursts at increasing clock times (ages 40, 2.5, 1 and 0 s at release)
    for arrived_ago in (40.0, 2.5, 1.0, 0.0):
        clock.now = 1000.0 - arrived_ago
        for kind, source, held in (("impression", imp_in, imp), ("feedback", fb_in, fb)):
            batch = [
                (ts, clock.now, f"{kind[0]}{len(held) + n}")
                for n, (ts, ago) in enumerate(x for x in source if x[1] == arrived_ago)
            ]
            merger.extend(kind, [ts for ts, _, _ in batch], [name for _, _, name in batch])
            held.extend(batch)
    clock.now = 1000.0
    caught_up = {"impression": imp_caught_up, "feedback": fb_caught_up}
    expected = reference_release(imp, fb, clock.now, 2.0, 30.0, caught_up)
    runs = merger.release_runs(caught_up)
    assert [(kind, r) for kind, run in runs for r in run] == expected
    # runs are maximal: two neighbours never have the same kind
    assert all(a[0] != b[0] for a, b in pairwise(runs))
    assert merger.buffered() == len(imp) + len(fb) - len(expected)


def test_extend_checks_one_timestamp_per_record() -> None:
    merger: Merger[str] = Merger(2.0, SettableClock())
    with pytest.raises(ValueError, match="one timestamp per record"):
        merger.extend("impression", [1, 2], ["only-one"])


def test_a_lone_record_behind_what_the_other_topic_delivered_skips_the_hold() -> None:
    """Once the other topic delivered a later timestamp, nothing of it can still sort before
    this record without breaking its own order: the topic that is behind flows at once."""
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    merger.push("feedback", 100, "f100")
    assert merger.release_runs(BOTH) == []  # nothing delivered beyond it: f100 waits
    merger.extend("impression", [40, 100, 101], ["i40", "i100", "i101"])
    # i40 and i100 (impressions first on equal timestamps) sort before f100, which then goes
    # as the head; i101 is lone and later than any feedback delivered: it waits the hold
    assert merger.release_runs({"impression": UP, "feedback": BEHIND}) == [
        ("impression", ["i40", "i100"]),
        ("feedback", ["f100"]),
    ]
    merger.extend("impression", [90, 102], ["i90", "i102"])
    # a late i90 is behind f100 too, but leaves only in offset order, after i101
    assert merger.release_runs(BOTH) == []
    clock.now += 2.0
    assert merger.release_runs(BOTH) == [("impression", ["i101", "i90", "i102"])]
    # an impression on the timestamp of delivered feedback sorts before it: it goes at once
    merger.push("feedback", 103, "f103")
    clock.now += 2.0
    assert merger.release_runs(BOTH) == [("feedback", ["f103"])]
    merger.push("impression", 103, "i103")
    assert merger.release_runs(BOTH) == [("impression", ["i103"])]
    # feedback on the timestamp of a delivered impression waits: another impression with that
    # timestamp would still sort before it
    merger.push("feedback", 103, "f103b")
    assert merger.release_runs(BOTH) == []
    merger.push("feedback", 101, "f101")
    assert merger.release_runs(BOTH) == []  # behind, but after f103b in offset order


def test_what_was_seen_is_forgotten_on_clear() -> None:
    """After a resync the other topic is read again from its committed offset: timestamps
    seen before say nothing about where it is now."""
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    merger.push("feedback", 100, "f100")
    merger.clear()
    merger.push("impression", 50, "i50")
    assert merger.release_runs(BOTH) == []
    clock.now += 2.0
    assert merger.release_runs(BOTH) == [("impression", ["i50"])]


def test_record_timestamps_far_in_the_past_wait_like_any_other() -> None:
    """A backfill writes old event times while the daemon reads; the merge takes no shortcut
    for them, so feedback still in the producer's buffer is not overtaken."""
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    merger.push("impression", 1, "ancient")
    assert merger.release_runs(BOTH) == []
    merger.push("feedback", 0, "earlier")
    assert merger.release_runs(BOTH) == [("feedback", ["earlier"])]
    clock.now += 2.0
    assert merger.release_runs(BOTH) == [("impression", ["ancient"])]


def test_replayed_records_have_served_their_hold_but_wait_for_the_other_topic() -> None:
    """Records re-read after a restart were merged before the crash: once the other topic is
    fetched as far as the checkpoint had consumed (the caller's caught_up), they go."""
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    merger.extend("impression", [5, 9], ["r5", "r9"], replayed=True)
    merger.extend("impression", [10], ["new10"])
    behind = {"impression": UP, "feedback": BEHIND}
    assert merger.release_runs(behind) == []
    assert merger.release_runs(BOTH) == [("impression", ["r5", "r9"])]
    clock.now += 2.0
    assert merger.release_runs(BOTH) == [("impression", ["new10"])]
    # the liveness bound still counts from arrival: max_hold_s less the hold already served
    merger.extend("feedback", [20], ["f20"], replayed=True)
    clock.now += 27.9
    assert merger.release_runs({"impression": BEHIND, "feedback": UP}) == []
    clock.now += 0.1
    assert merger.release_runs({"impression": BEHIND, "feedback": UP}) == [("feedback", ["f20"])]


def test_replayed_records_count_as_delivered_for_the_other_kind() -> None:
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    merger.extend("feedback", [100], ["f100"], replayed=True)
    assert released(merger, BOTH) == [("feedback", "f100")]
    merger.extend("impression", [90], ["i90"])
    assert released(merger, {"impression": UP, "feedback": BEHIND}) == [("impression", "i90")]


def test_one_wild_timestamp_opens_the_hold_only_until_the_next_record_of_its_kind() -> None:
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    merger.extend("feedback", [10**13, 100], ["f-year-2286", "f100"])
    clock.now += 2.0
    assert len(released(merger, BOTH)) == 2
    merger.push("impression", 200, "i200")
    assert released(merger, BOTH) == []  # the feedback stream is at 100, not in 2286


def test_a_watermark_learnt_before_the_record_arrived_does_not_release_it() -> None:
    """The other topic was at its end at t=5, the record arrived at t=10: what the other topic
    held when the record was written is unknown (its leader may be moving), so the record
    waits until a later fetch confirms the end, or ``max_hold_s``."""
    clock = SettableClock()
    clock.now = 10.0
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    merger.push("impression", 500, "i500")
    clock.now = 13.0
    stale = {"impression": UP, "feedback": 5.0}
    assert released(merger, stale) == []
    assert released(merger, {"impression": UP, "feedback": 10.0}) == []  # same instant: unknown
    fresh = {"impression": UP, "feedback": 10.5}
    assert released(merger, fresh) == [("impression", "i500")]
    merger.push("impression", 600, "i600")
    clock.now = 43.0
    assert released(merger, stale) == [("impression", "i600")]  # max_hold_s: liveness


def test_records_deferred_behind_a_replay_enter_the_merge_at_its_end_with_their_arrival() -> None:
    """Fed before the crash after every replayed record, they wait for all of them whatever
    their timestamps; the hold still counts from when they arrived."""
    clock = SettableClock()
    merger: Merger[str] = Merger(2.0, clock)
    merger.extend("impression", [50], ["i50"], replayed=True)
    merger.defer("feedback", [40], ["f40"])
    assert merger.buffered() == 2 and merger.buffered("feedback") == 1
    assert merger.deferred() == 1 and merger.merging("feedback") == 0
    assert released(merger, BOTH) == [("impression", "i50")]  # f40 sorts first, yet waits
    clock.now += 2.5
    merger.end_replay()
    assert merger.deferred() == 0 and merger.merging("feedback") == 1
    assert released(merger, BOTH) == [("feedback", "f40")]  # it has waited out the hold
    merger.defer("impression", [60], ["i60"])
    merger.clear()
    assert merger.buffered() == 0 and merger.deferred() == 0
