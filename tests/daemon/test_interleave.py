"""The repartition stage's merge of many source partitions into one timestamp order."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from itertools import pairwise

from settable_clock import SettableClock

from evald.daemon.repartition.interleave import Interleaver


@dataclass(frozen=True)
class Rec:
    source: str
    offset: int
    timestamp: int


def batch(source: str, *timestamps: int, start: int = 0) -> list[Rec]:
    return [Rec(source, start + n, ts) for n, ts in enumerate(timestamps)]


def make(clock: SettableClock) -> Interleaver[str]:
    # "imp-*" sources before "fb-*" ones on equal timestamps, then by name
    return Interleaver(2.0, clock, rank=lambda s: (not s.startswith("imp"), s))


def names(records: list[Rec]) -> list[str]:
    return [f"{r.source}@{r.timestamp}" for r in records]


ALL = ["imp-0", "imp-1", "fb-0"]


def always(source: str) -> float:
    """Caught up as of any time (a watermark confirmed after every arrival)."""
    return math.inf


def never(source: str) -> float:
    """Not known to be caught up."""
    return -math.inf


def test_releases_across_sources_in_timestamp_order() -> None:
    clock = SettableClock()
    merge = make(clock)
    merge.extend("imp-0", batch("imp-0", 10, 40, 70))
    merge.extend("imp-1", batch("imp-1", 20, 50))
    merge.extend("fb-0", batch("fb-0", 15, 45, 80))
    # imp-1 runs dry after 50 and is not caught up: 70 and 80 wait for it
    out = merge.release(ALL, caught_up=never)
    assert names(out) == ["imp-0@10", "fb-0@15", "imp-1@20", "imp-0@40", "fb-0@45", "imp-1@50"]
    assert merge.next_offset("imp-0") == 2 and merge.next_offset("imp-1") is None
    merge.extend("imp-1", batch("imp-1", 90, start=2))
    # imp-0 ran dry at 70 now: fb-0's 80 waits for it in turn
    assert names(merge.release(ALL, caught_up=never)) == ["imp-0@70"]


def test_ties_go_to_impressions_then_by_source() -> None:
    clock = SettableClock()
    merge = make(clock)
    for source in ("fb-0", "imp-1", "imp-0"):
        merge.extend(source, batch(source, 5, 9))
    out = merge.release(ALL, caught_up=never)
    # then imp-0's 9 (every other source has a record buffered); the others' 9s wait, since
    # imp-0 could still send another 9
    assert names(out) == ["imp-0@5", "imp-1@5", "fb-0@5", "imp-0@9"]


def test_an_empty_caught_up_source_holds_for_hold_s_a_behind_one_for_max_hold_s() -> None:
    clock = SettableClock()
    merge = make(clock)
    merge.extend("imp-0", batch("imp-0", 10))
    assert merge.release(ALL, caught_up=always) == []  # nothing from the others yet
    clock.now += 2.0
    assert names(merge.release(ALL, caught_up=always)) == ["imp-0@10"]
    merge.extend("imp-0", batch("imp-0", 20, start=1))
    clock.now += 29.0
    assert merge.release(ALL, caught_up=lambda s: always(s) if s != "fb-0" else never(s)) == []
    clock.now += 1.0  # max_hold_s = 15 * hold_s = 30 s
    assert names(merge.release(ALL, caught_up=never)) == ["imp-0@20"]


def test_a_source_caught_up_only_before_the_head_arrived_holds_it_up_to_max_hold_s() -> None:
    """A caught-up time from before the head arrived (a stale watermark: the source's fetches
    fail since) says nothing about records written before the head: it waits past ``hold_s``,
    goes once a later time comes, or after ``max_hold_s``."""
    clock = SettableClock(1_000.0)
    merge = make(clock)
    merge.extend("imp-0", batch("imp-0", 10))
    as_of = {"imp-0": math.inf, "imp-1": 999.0, "fb-0": math.inf}
    clock.now = 1_003.0  # waited hold_s and more
    assert merge.release(ALL, caught_up=as_of.__getitem__) == []
    as_of["imp-1"] = 1_000.5  # a fetch built after the head arrived found imp-1 at its end
    assert names(merge.release(ALL, caught_up=as_of.__getitem__)) == ["imp-0@10"]
    merge.extend("imp-0", batch("imp-0", 20, start=1))
    as_of["imp-1"] = 1_002.0  # before this head arrived (1003)
    clock.now = 1_032.9
    assert merge.release(ALL, caught_up=as_of.__getitem__) == []
    clock.now = 1_033.0  # max_hold_s = 30 s
    assert names(merge.release(ALL, caught_up=as_of.__getitem__)) == ["imp-0@20"]


def test_each_head_is_held_against_its_own_arrival() -> None:
    clock = SettableClock(1_000.0)
    merge = make(clock)
    merge.extend("imp-0", batch("imp-0", 10))
    clock.now = 1_001.5
    merge.extend("fb-0", batch("fb-0", 20))
    clock.now = 1_003.6  # both waited hold_s; imp-1 (never seen) caught up as of 1001
    as_of = {"imp-1": 1_001.0}
    out = merge.release(ALL, caught_up=lambda s: as_of.get(s, -math.inf))
    assert names(out) == ["imp-0@10"]  # fb-0's head arrived after 1001: imp-1 may hold more
    clock.now = 1_031.5
    assert names(merge.release(ALL, caught_up=lambda s: as_of.get(s, -math.inf))) == ["fb-0@20"]


def test_a_source_past_a_timestamp_does_not_hold_it() -> None:
    clock = SettableClock()
    merge = make(clock)
    merge.extend("imp-1", batch("imp-1", 100))
    merge.extend("fb-0", batch("fb-0", 100))
    assert names(merge.release(ALL, caught_up=never)) == []  # imp-0 never seen
    merge.extend("imp-0", batch("imp-0", 50))
    # imp-0's 50 goes; then imp-0 is empty and its latest (50) is before 100: hold
    assert names(merge.release(ALL, caught_up=never)) == ["imp-0@50"]
    merge.extend("imp-0", batch("imp-0", 150, start=1))
    # imp-1's 100 goes; fb-0's 100 waits, since imp-1 could send another 100 (it ranks first)
    assert names(merge.release(ALL, caught_up=never)) == ["imp-1@100"]
    merge.extend("imp-1", batch("imp-1", 101, start=1))
    assert names(merge.release(ALL, caught_up=never)) == ["fb-0@100"]


def test_dropped_sources_are_forgotten() -> None:
    clock = SettableClock()
    merge = make(clock)
    merge.extend("imp-0", batch("imp-0", 10, 20))
    merge.drop("imp-0")
    assert merge.buffered("imp-0") == 0 and merge.next_offset("imp-0") is None
    assert merge.release(["imp-0"], caught_up=always) == []


def test_any_fetch_pattern_gives_the_same_order() -> None:
    """Sources fetched in random chunks, released as they come: always the timestamp order of
    the whole input. Negative control: the fetch order itself is not (so the test can fail)."""
    rng = random.Random(3)
    data = {s: batch(s, *sorted(rng.randrange(1000) for _ in range(200))) for s in ALL}
    wanted = sorted(
        (r for records in data.values() for r in records),
        key=lambda r: (r.timestamp, not r.source.startswith("imp"), r.source, r.offset),
    )
    for seed in range(5):
        fetch = random.Random(seed)
        clock = SettableClock()
        merge = make(clock)
        cursor = dict.fromkeys(ALL, 0)
        out: list[Rec] = []
        arrival: list[Rec] = []
        while any(cursor[s] < len(data[s]) for s in ALL):
            source = fetch.choice([s for s in ALL if cursor[s] < len(data[s])])
            n = fetch.randint(1, 60)
            chunk = data[source][cursor[source] : cursor[source] + n]
            cursor[source] += len(chunk)
            arrival += chunk
            merge.extend(source, chunk)
            out += merge.release(
                ALL, caught_up=lambda s, c=cursor: always(s) if c[s] == len(data[s]) else never(s)
            )
        clock.now += 2.0
        out += merge.release(ALL, caught_up=always)
        assert out == wanted
        assert all(a.timestamp <= b.timestamp for a, b in pairwise(out))
        assert arrival != wanted
