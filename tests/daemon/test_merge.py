"""The per-partition merge that makes the engine's input order a function of the data."""

from __future__ import annotations

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
