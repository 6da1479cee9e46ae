"""Per-partition merge of the impressions and feedback topics into one timestamp order.

Why: the engine's watermark for partition p is the largest event time it has seen, and a
feedback event is late when the watermark has already passed its impression's window. If the
daemon fed whatever each fetch happened to return (a burst of impressions, then a burst of
feedback), which feedback counts as late would depend on fetch sizes and timing, and a restart
would not reproduce an uninterrupted run. Feeding partition p's records of both topics in
record-timestamp order (impressions first on equal timestamps) makes the sequence the engine
sees a function of the data alone. A record is released once the other topic has a record
buffered that sorts after it, or when the record waited ``hold_s`` and the other topic is known
to be caught up *as of a time after the record arrived* (see :meth:`Merger.release_runs`).
Records more than ``hold_s`` apart in arrival are still fed in arrival order, and ``max_hold_s``
bounds every wait: liveness beats exactness when a producer or a fetch is stuck.

A lone record also goes at once when the other topic's latest record sorts after it: that
stream is past this timestamp, and anything of it still to come with an earlier timestamp would
be out of order within its own topic, which no wait repairs (the merge of two buffered heads
assumes the same: timestamps that do not decrease within a partition of each topic). This lets
the topic that is behind in timestamps catch up without the hold: a restart replaying pending
impressions behind feedback that is further on, a topic recovering from a stalled producer.
Nothing here reads the wall clock or trusts a record timestamp to say when the record was
written, so a producer writing old event times (a backfill, `evald produce`) while the daemon
reads is ordered by the same rules as live traffic: exactly, as long as it writes the two topics
within ``hold_s`` of each other.

Records a restarted daemon re-reads to rebuild its pending joins (below the offsets its checkpoint
had consumed) enter as *replayed*: they count as having served their hold already. Every record
they were merged with before the crash is below the other topic's consumed offset too, on the
broker since then, so once the other topic is fetched that far (the caller's ``caught_up``) there
is nothing left to wait for; the records the other topic got later were fed after them before.
Their ``max_hold_s`` fallback comes ``hold_s`` early (28 s of a 30 s bound), which is only
liveness.

Until every replayed record is fed, the records after the replay wait aside (:meth:`Merger.defer`,
then :meth:`Merger.end_replay`): before the crash all of the replay was fed before any of
them, whatever their timestamps, and one of them fed earlier (a producer more than ``hold_s``
out of order, a fetch stalled past ``max_hold_s``) could move the watermark past a replayed
impression that was pending at the checkpoint, which the replay would then skip as emitted.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Generic, TypeVar

__all__ = ["KINDS", "Merger"]

KINDS: tuple[str, str] = ("impression", "feedback")

R = TypeVar("R")

#: a run of consecutive released records of one kind, in feed order
Run = tuple[str, list[R]]


class Merger(Generic[R]):
    """Buffers one partition's records per kind and releases them in (timestamp, kind) order.

    Every record passes through here, so the hot path stays in C where it can: a fetched batch
    enters with one ``deque.extend`` over ``(timestamp, arrival, record)`` tuples, and
    :meth:`release_runs` hands back runs of one kind, so the caller does not re-dispatch on
    the kind per record.
    """

    def __init__(
        self, hold_s: float, clock: Callable[[], float], max_hold_s: float | None = None
    ) -> None:
        """``clock`` times the holds (monotonic seconds)."""
        self.hold_s = hold_s
        self.max_hold_s = max_hold_s if max_hold_s is not None else 15 * hold_s
        self._clock = clock
        self._queues: dict[str, deque[tuple[int, float, R]]] = {kind: deque() for kind in KINDS}
        #: per kind, the timestamp of the latest record buffered since the start (or the last
        #: clear): where that topic's stream is. The latest, not the largest, so one record
        #: with a wild timestamp moves it only until the next record of its kind.
        self._seen: dict[str, float] = dict.fromkeys(KINDS, -math.inf)
        #: per kind, records fetched after a replay while it is not all fed (:meth:`defer`)
        self._deferred: dict[str, deque[tuple[int, float, R]]] = {k: deque() for k in KINDS}

    def push(self, kind: str, timestamp: int, record: R) -> None:
        """Buffer a record; within a kind, records keep their offset order."""
        self._queues[kind].append((timestamp, self._clock(), record))
        self._seen[kind] = timestamp

    def extend(
        self,
        kind: str,
        timestamps: Sequence[int],
        records: Sequence[R],
        *,
        replayed: bool = False,
    ) -> None:
        """Buffer a fetched batch of one kind (offset order), all arrived now; ``replayed``
        records count as having waited ``hold_s`` already (see the module docstring)."""
        if len(timestamps) != len(records):
            raise ValueError("one timestamp per record")
        if timestamps:
            arrived = self._clock() - (self.hold_s if replayed else 0.0)
            self._queues[kind].extend(zip(timestamps, repeat(arrived), records))
            self._seen[kind] = timestamps[-1]

    def defer(self, kind: str, timestamps: Sequence[int], records: Sequence[R]) -> None:
        """Buffer a fetched batch of one kind that comes after a replay still being fed: it
        enters the merge only at :meth:`end_replay` (keeping its arrival time for the hold)."""
        if len(timestamps) != len(records):
            raise ValueError("one timestamp per record")
        self._deferred[kind].extend(zip(timestamps, repeat(self._clock()), records))

    def deferred(self) -> int:
        """Records waiting for the end of a replay (:meth:`defer`)."""
        return sum(len(q) for q in self._deferred.values())

    def end_replay(self) -> None:
        """Every replayed record is fed: what waited (:meth:`defer`) enters the merge."""
        for kind, waiting in self._deferred.items():
            if waiting:
                self._seen[kind] = waiting[-1][0]
                self._queues[kind].extend(waiting)
                waiting.clear()

    def buffered(self, kind: str | None = None) -> int:
        """Records held (of one kind, or in total), deferred ones included."""
        if kind is not None:
            return len(self._queues[kind]) + len(self._deferred[kind])
        return sum(len(q) for q in self._queues.values()) + self.deferred()

    def merging(self, kind: str) -> int:
        """Records of ``kind`` in the merge itself (buffered but not deferred)."""
        return len(self._queues[kind])

    def release_runs(self, caught_up: Mapping[str, float]) -> list[Run[R]]:
        """Pop every record that can be fed now, in feed order, grouped in runs of one kind.

        While both kinds are buffered, the head that sorts first goes (impressions first on
        equal timestamps). A record with nothing of the other kind buffered goes at once if it
        sorts before a record the other kind delivered earlier (see the module docstring);
        otherwise once it waited ``hold_s`` *and* the other topic partition was caught up at a
        time after the record arrived, or once it waited ``max_hold_s`` regardless.

        ``caught_up[kind]`` is that time on this merger's clock: the latest moment as of which
        the topic partition of ``kind`` is known to be fetched to its end (the sending of a
        fetch request whose answer showed nothing beyond what was fetched; ``inf`` while it is
        deliberately paused, ``-inf`` when unknown). A high watermark learnt *before* a record
        arrived says nothing about what the other topic held when that record was written:
        while a partition's leader moves, fetches fail and the last watermark goes stale, and
        trusting it fed the other topic ahead (a click counted late after a failover).

        Both conditions of the hold matter: right after an assignment one topic's first fetch
        can arrive seconds after the other's, and a topic that looks caught up may still have
        records in a producer's buffer.
        """
        out: list[Run[R]] = []
        imp, fb = self._queues["impression"], self._queues["feedback"]
        imp_pop, fb_pop = imp.popleft, fb.popleft
        while imp and fb:
            # a run of one kind: everything that sorts before the other kind's head
            bound = fb[0][0]
            if imp[0][0] <= bound:
                run = [imp_pop()[2]]
                while imp and imp[0][0] <= bound:
                    run.append(imp_pop()[2])
                out.append(("impression", run))
                continue
            bound = imp[0][0]
            run = [fb_pop()[2]]
            while fb and fb[0][0] < bound:
                run.append(fb_pop()[2])
            out.append(("feedback", run))
        if imp or fb:
            kind, queue = ("impression", imp) if imp else ("feedback", fb)
            # the other topic was at its end at this time (a head that arrived before it may go)
            caught_up_at = caught_up.get("feedback" if imp else "impression", -math.inf)
            now = self._clock()
            # timestamps below this sort before the other kind's latest record (impressions
            # first on equal timestamps; timestamps are integers, Kafka's milliseconds)
            passed = self._seen["feedback"] + 1 if imp else self._seen["impression"]
            run = []
            while queue:
                timestamp, since, record = queue[0]
                waited = now - since
                if timestamp >= passed and (
                    waited < self.hold_s or (waited < self.max_hold_s and caught_up_at <= since)
                ):
                    break
                queue.popleft()
                run.append(record)
            if run:
                out.append((kind, run))
        return out

    def clear(self) -> None:
        """Forget everything held (the partition is being revoked or resynchronised)."""
        for queue in (*self._queues.values(), *self._deferred.values()):
            queue.clear()
        # the partition is read again from its committed offsets: what was seen is ahead
        self._seen = dict.fromkeys(KINDS, -math.inf)
