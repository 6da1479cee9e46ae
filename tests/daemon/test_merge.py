"""The per-partition merge that makes the engine's input order a function of the data."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evald.daemon.merge import Merger

BOTH = {"impression": True, "feedback": True}


class FakeClock:
    """A settable clock so the hold timeout is tested without sleeping."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_releases_in_timestamp_order_with_impressions_first_on_ties() -> None:
    clock = FakeClock()
    merger: Merger[str] = Merger(2.0, clock)
    for ts, name in ((10, "i10"), (20, "i20"), (30, "i30")):
        merger.push("impression", ts, name)
    for ts, name in ((5, "f5"), (20, "f20"), (25, "f25")):
        merger.push("feedback", ts, name)
    # i30 waits: no feedback after it is known yet
    assert [r for _, r in merger.release(BOTH)] == ["f5", "i10", "i20", "f20", "f25"]
    assert merger.buffered() == 1 and merger.buffered("impression") == 1
    merger.push("feedback", 31, "f31")
    assert [r for _, r in merger.release(BOTH)] == ["i30"]


def test_a_lone_record_waits_for_the_hold_time_then_goes() -> None:
    clock = FakeClock()
    merger: Merger[str] = Merger(2.0, clock)
    merger.push("feedback", 50, "f50")
    assert merger.release(BOTH) == []
    clock.now += 1.9
    assert merger.release(BOTH) == []
    clock.now += 0.2
    assert merger.release(BOTH) == [("feedback", "f50")]


def test_offset_order_within_a_kind_is_kept_even_if_timestamps_go_back() -> None:
    clock = FakeClock()
    merger: Merger[str] = Merger(2.0, clock)
    merger.push("impression", 40, "i40")
    merger.push("impression", 10, "i10-later-offset")
    merger.push("feedback", 100, "f100")
    assert [r for _, r in merger.release(BOTH)] == ["i40", "i10-later-offset"]
    merger.clear()
    assert merger.buffered() == 0


def test_a_lone_record_waits_longer_while_the_other_topic_is_behind() -> None:
    clock = FakeClock()
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    merger.push("impression", 50, "i50")
    behind = {"impression": True, "feedback": False}
    clock.now += 10
    assert merger.release(behind) == []
    assert merger.release(BOTH) == [("impression", "i50")]
    merger.push("impression", 60, "i60")
    clock.now += 30
    assert merger.release(behind) == [("impression", "i60")]


def reference_release(
    imp: list[tuple[int, float, str]],
    fb: list[tuple[int, float, str]],
    now: float,
    hold_s: float,
    max_hold_s: float,
    caught_up: dict[str, bool],
) -> list[tuple[str, str]]:
    """The merge rule spelled out one record at a time: heads compared, lone heads held."""
    queues = {"impression": list(imp), "feedback": list(fb)}
    out = []
    while queues["impression"] or queues["feedback"]:
        i, f = queues["impression"], queues["feedback"]
        if i and f:
            kind = "impression" if (i[0][0], 0) <= (f[0][0], 1) else "feedback"
        else:
            kind = "impression" if i else "feedback"
            other = "feedback" if i else "impression"
            waited = now - queues[kind][0][1]
            if waited < hold_s or (waited < max_hold_s and not caught_up[other]):
                break
        out.append((kind, queues[kind].pop(0)[2]))
    return out


arrivals = st.lists(
    st.tuples(st.integers(0, 30), st.sampled_from([0.0, 1.0, 2.5, 40.0])), max_size=25
)


@given(arrivals, arrivals, st.booleans(), st.booleans())
def test_runs_release_exactly_what_the_record_at_a_time_rule_releases(
    imp_in: list[tuple[int, float]],
    fb_in: list[tuple[int, float]],
    imp_caught_up: bool,
    fb_caught_up: bool,
) -> None:
    clock = FakeClock()
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
    merger: Merger[str] = Merger(2.0, FakeClock())
    with pytest.raises(ValueError, match="one timestamp per record"):
        merger.extend("impression", [1, 2], ["only-one"])


def test_an_old_lone_record_skips_the_hold_once_the_other_topic_is_caught_up() -> None:
    """A record created more than max_hold_s ago (by its timestamp and the wall clock) cannot
    have a partner still in a producer's buffer: a backlog of one topic flows at once."""
    clock = FakeClock()
    wall_s = 1_000_000.0
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0, wall=lambda: wall_s)
    old_ms, fresh_ms = int((wall_s - 31) * 1000), int((wall_s - 29) * 1000)
    merger.extend("impression", [old_ms, old_ms + 1, fresh_ms], ["old-1", "old-2", "fresh"])
    behind = {"impression": True, "feedback": False}
    # the other topic still has records to fetch: even old records wait for it
    assert merger.release_runs(behind) == []
    # caught up: the old ones go now, the fresh one (and all after it) waits the hold
    assert merger.release_runs(BOTH) == [("impression", ["old-1", "old-2"])]
    assert merger.buffered("impression") == 1
    clock.now += 2.0
    assert merger.release_runs(BOTH) == [("impression", ["fresh"])]


def test_without_a_wall_clock_old_records_wait_like_any_other() -> None:
    clock = FakeClock()
    merger: Merger[str] = Merger(2.0, clock, max_hold_s=30.0)
    merger.push("feedback", 1, "ancient")
    assert merger.release_runs(BOTH) == []
    clock.now += 2.0
    assert merger.release_runs(BOTH) == [("feedback", ["ancient"])]
