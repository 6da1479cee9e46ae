"""PartitionClock: the event-time watermark of one partition (docs/semantics.md section 3).

watermark = confirmed event time - lateness, never going back. The partition's events are
taken in blocks of ``quorum`` consecutive events; when a block is full, its earliest time is
confirmed. So a time moves the watermark only once a whole block of events has reached it: one
record never does, whatever its lead, nor a producer with a skewed clock unless a whole block
is its own, and a jump of the whole stream does within ``2 * quorum - 1`` events. Blocks,
not a sliding window: ``see`` runs on every event and only appends. When the partition is
quiet for ``idle_timeout`` of wall time (read from an injectable clock), the watermark follows
the wall clock instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from evald.stats import Stats

NO_TS = -(1 << 62)  # "no event time yet" (below every event time)


@dataclass(frozen=True, slots=True)
class EventTimes:
    """What the watermark's next moves depend on, checkpointed with it (docs/semantics.md §6).

    ``confirmed``: the newest confirmed event time (None: none yet). ``block``: the times of
    the block being filled, in partition order. ``ahead``: the times of the last full block
    still more than ``lateness`` ahead of the confirmed one (counted as outliers if the next
    block leaves them there)."""

    confirmed: int | None
    block: tuple[int, ...] = ()
    ahead: tuple[int, ...] = ()


class PartitionClock:
    """Watermark, confirmed event time, the block being filled and the idle fallback of one
    partition.

    The methods that can move the watermark return the new value (None: it did not move), so
    the owner closes what became due; this class knows nothing of what is pending.
    """

    def __init__(
        self,
        *,
        lateness: int,
        quorum: int,
        idle_timeout: int,
        clock: Callable[[], float],
        stats: Stats,
    ) -> None:
        self.lateness, self.quorum, self.idle_timeout = lateness, quorum, idle_timeout
        self._clock, self._stats = clock, stats
        self.watermark: int | None = None
        self.confirmed = NO_TS  #: newest confirmed event time; NO_TS: none
        self._block: list[int] = []  # times of the block being filled
        self._ahead: list[int] = []  # see EventTimes.ahead
        #: the event times came from a checkpoint, so re-fed events must not count again
        self.restored = False
        self._last_event_wall = clock()  # wall time of the tick that first saw the last event
        self._wm_at_last_event: int | None = None
        self.fresh = False  # events arrived since the last tick
        #: events whose time was behind the watermark when they came (more than the lateness
        #: behind the newest confirmed time): the input is out of order past what it allows
        self.behind = 0

    def see(self, ts: int, replayed: bool) -> int | None:
        """An event at ``ts`` was joined; returns the new watermark, or None if it did not move.

        Runs on every event, so it only appends; the block is read when it is full. An event a
        restore re-feeds does not count when the checkpoint's event times were restored (they
        include it)."""
        self.fresh = True
        if not replayed:
            wm = self.watermark
            if wm is not None and ts < wm:
                self.behind += 1
        elif self.restored:
            return None
        block = self._block
        block.append(ts)
        if len(block) < self.quorum:
            return None
        return self._confirm(block)

    def _confirm(self, block: list[int]) -> int | None:
        """A block is full: its earliest time is confirmed (if newer); times of the previous
        block still more than ``lateness`` ahead of the confirmed one are counted as outliers
        (``Stats.watermark_outliers``): a whole block of later events has not reached them."""
        self._block = []
        confirmed = self.confirmed = max(self.confirmed, min(block))
        bound = confirmed + self.lateness
        if self._ahead:
            self._stats.watermark_outliers += sum(1 for ts in self._ahead if ts > bound)
        self._ahead = [ts for ts in block if ts > bound]
        return self.advance(confirmed - self.lateness)

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

    def event_times(self) -> EventTimes:
        """The confirmed time, the block being filled and the times still ahead, for the
        checkpoint."""
        confirmed = None if self.confirmed == NO_TS else self.confirmed
        return EventTimes(confirmed, tuple(self._block), tuple(self._ahead))

    def restore_times(self, times: EventTimes) -> None:
        """Take the event times a checkpoint stored (``event_times()`` then)."""
        self.confirmed = NO_TS if times.confirmed is None else times.confirmed
        self._block = list(times.block)
        self._ahead = list(times.ahead)
        self.restored = True

    def restart(self) -> None:
        """After a restore: the idle fallback counts from now and from today's watermark."""
        self._wm_at_last_event = self.watermark
        self._last_event_wall = self._clock()
        self.fresh = False
