"""PartitionClock: the event-time watermark of one partition (docs/semantics.md section 3).

watermark = newest confirmed event time - lateness, never going back. A time more than
``jump`` ahead of the confirmed one is only a candidate until a second event lands near it, so
one outlier cannot move the watermark. When the partition is quiet for ``idle_timeout`` of wall
time (read from an injectable clock), the watermark follows the wall clock instead.
"""

from __future__ import annotations

from collections.abc import Callable

NO_TS = -(1 << 62)  # "no event time yet" (below every event time)


class PartitionClock:
    """Watermark, confirmed/candidate event times and the idle fallback of one partition.

    The methods that can move the watermark return the new value (None: it did not move), so
    the owner closes what became due; this class knows nothing of what is pending.
    """

    def __init__(
        self, *, lateness: int, jump: int, idle_timeout: int, clock: Callable[[], float]
    ) -> None:
        self.lateness, self.jump, self.idle_timeout = lateness, jump, idle_timeout
        self._clock = clock
        self.watermark: int | None = None
        #: newest confirmed event time and the far-ahead candidate (``observe``); NO_TS: none
        self.confirmed = self.candidate = NO_TS
        #: the two above came from a checkpoint, so re-fed events must not count again
        self.restored = False
        self._last_event_wall = clock()  # wall time of the tick that first saw the last event
        self._wm_at_last_event: int | None = None
        self.fresh = False  # events arrived since the last tick
        #: events whose time was behind the watermark when they came (more than the lateness
        #: behind the newest confirmed time): the input is out of order past what it allows
        self.behind = 0

    def see(self, ts: int, replayed: bool) -> int | None:
        """An event at ``ts`` was joined; returns the new watermark, or None if it did not move.

        Only a time above the newest confirmed one can move it, and an event a restore re-feeds
        does not count when the checkpoint's event times were restored (they include it).
        """
        self.fresh = True
        confirmed = self.confirmed
        if ts <= confirmed or (replayed and self.restored):
            wm = self.watermark
            if wm is not None and ts < wm and not replayed:
                self.behind += 1
            return None
        if confirmed != NO_TS and ts <= confirmed + self.jump and self.candidate == NO_TS:
            self.confirmed = ts  # observe()'s common case, inlined: this runs on every event
            mark = ts - self.lateness
            wm = self.watermark
            if wm is not None and mark <= wm:
                return None
            self.watermark = mark
            return mark
        return self.observe(ts)

    def observe(self, ts: int) -> int | None:
        """Count an event time above the newest confirmed one; returns the new watermark, or
        None when it did not move.

        Within ``jump`` of it, the time is confirmed at once. Further ahead (or before any
        confirmed time) it is a candidate: confirmed only when another event lands within
        ``jump`` of it; a candidate the confirmed time catches up with is confirmed too.
        """
        confirmed, candidate, jump = self.confirmed, self.candidate, self.jump
        if confirmed != NO_TS and ts <= confirmed + jump:
            confirmed = ts
        elif candidate != NO_TS and -jump <= ts - candidate <= jump:
            confirmed, candidate = max(ts, candidate, confirmed), NO_TS
        else:
            self.candidate = ts  # the newest far-ahead time replaces an older candidate
            return None
        if candidate != NO_TS and candidate <= confirmed + jump:
            confirmed, candidate = max(confirmed, candidate), NO_TS
        self.confirmed, self.candidate = confirmed, candidate
        mark = confirmed - self.lateness
        wm = self.watermark  # advance(), inlined: this runs on nearly every event
        if wm is not None and mark <= wm:
            return None
        self.watermark = mark
        return mark

    def advance(self, mark: int) -> int | None:
        """Move the watermark to ``mark`` if that is forward; returns it, or None."""
        wm = self.watermark
        if wm is not None and mark <= wm:
            return None
        self.watermark = mark
        return mark

    def idle(self, now: float) -> int | None:
        """Called on every tick. Once the partition has had no event for ``idle_timeout`` of
        wall time, its watermark is the one it had after its last event plus the wall time
        elapsed since then; the time of an event is the time of the first tick after it."""
        if self.fresh:
            self.fresh = False
            self._last_event_wall = now
            self._wm_at_last_event = self.watermark
            return None
        base = self._wm_at_last_event
        if base is None:
            return None
        quiet_ms = int((now - self._last_event_wall) * 1000)
        if quiet_ms >= self.idle_timeout:
            return self.advance(base + quiet_ms)
        return None

    def event_times(self) -> tuple[int | None, int | None]:
        """(newest confirmed event time, candidate) for the checkpoint; None: none."""
        first, second = self.confirmed, self.candidate
        return (None if first == NO_TS else first, None if second == NO_TS else second)

    def restore_times(self, event_times: tuple[int | None, int | None]) -> None:
        """Take the event times a checkpoint stored (``event_times()`` then)."""
        first, second = event_times
        self.confirmed = NO_TS if first is None else first
        self.candidate = NO_TS if second is None else second
        self.restored = True

    def restart(self) -> None:
        """After a restore: the idle fallback counts from now and from today's watermark."""
        self._wm_at_last_event = self.watermark
        self._last_event_wall = self._clock()
        self.fresh = False
