"""The repartition stage's merge of many source partitions into one record-timestamp order.

Why: the main stage merges an internal partition's impressions and feedback by timestamp and
assumes, like for a topic keyed by request id, that timestamps do not decrease within a
partition of each topic (evald/daemon/merge.py). An internal partition gets records from every
source partition; written in fetch order (a batch of source partition 0, then one of partition
1, ...), its timestamps would jump back by a batch's time span at every switch, and which
feedback is late would depend on fetch sizes. So the stage releases what it fetched in
timestamp order across all its source partitions, with the rule of merge.py generalised to
*n* queues: the smallest buffered head goes once every source partition with nothing buffered
has either delivered a later timestamp already, or is caught up and the head waited
``hold_s``; ``max_hold_s`` bounds every wait (liveness over exactness when a source stalls).
Ties go to impressions first, then by partition and offset, so the order is a function of the
data alone.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["Interleaver"]

S = TypeVar("S", bound=Hashable)


class Interleaver(Generic[S]):
    """Buffers records per source (a topic partition) and releases them in timestamp order.

    Records are anything with ``timestamp`` and ``offset`` attributes; ``rank(source)`` breaks
    ties between sources with equal timestamps (smaller first).
    """

    def __init__(
        self,
        hold_s: float,
        clock: Callable[[], float],
        rank: Callable[[S], Any],
        max_hold_s: float | None = None,
    ) -> None:
        self.hold_s = hold_s
        self.max_hold_s = max_hold_s if max_hold_s is not None else 15 * hold_s
        self._clock = clock
        self._rank = rank
        self._queues: dict[S, deque[tuple[int, float, Any]]] = {}
        #: per source, the timestamp of the latest record buffered (where its stream is)
        self._seen: dict[S, float] = {}

    def extend(self, source: S, records: Sequence[Any]) -> None:
        """Buffer a fetched batch of one source (offset order), all arrived now."""
        if not records:
            return
        now = self._clock()
        queue = self._queues.setdefault(source, deque())
        queue.extend((record.timestamp, now, record) for record in records)
        self._seen[source] = records[-1].timestamp

    def buffered(self, source: S) -> int:
        """Records held for ``source``."""
        return len(self._queues.get(source, ()))

    def next_offset(self, source: S) -> int | None:
        """The offset of ``source``'s first record still held (None: nothing held)."""
        queue = self._queues.get(source)
        return queue[0][2].offset if queue else None

    def clear(self) -> None:
        """Forget every source (the session is over)."""
        self._queues.clear()
        self._seen.clear()

    def drop(self, source: S) -> None:
        """Forget ``source`` (revoked, or read again from its committed offset)."""
        self._queues.pop(source, None)
        self._seen.pop(source, None)

    def release(self, sources: Sequence[S], caught_up: Callable[[S], bool]) -> list[Any]:
        """Pop every record that may go now, in order. ``sources``: every source assigned
        (one with nothing buffered can still hold the others back); ``caught_up(source)``:
        fetched to its high watermark."""
        now = self._clock()
        heap = [
            (queue[0][0], self._rank(source), queue[0][2].offset, source)
            for source, queue in self._queues.items()
            if queue
        ]
        heapq.heapify(heap)
        # the lowest "latest timestamp" among empty sources, split by whether they are caught
        # up: a head at or past it waits (hold_s for a caught-up source, max_hold_s otherwise)
        waiting = [math.inf, math.inf]  # [caught up, behind]
        for source in sources:
            if not self._queues.get(source):
                self._note_empty(source, caught_up, waiting)
        out: list[Any] = []
        while heap:
            timestamp, _, _, source = heap[0]
            queue = self._queues[source]
            waited = now - queue[0][1]
            if (timestamp >= waiting[0] and waited < self.hold_s) or (
                timestamp >= waiting[1] and waited < self.max_hold_s
            ):
                break
            out.append(queue.popleft()[2])
            if queue:
                heapq.heapreplace(heap, (queue[0][0], heap[0][1], queue[0][2].offset, source))
            else:
                heapq.heappop(heap)
                self._note_empty(source, caught_up, waiting)
        return out

    def _note_empty(self, source: S, caught_up: Callable[[S], bool], waiting: list[float]) -> None:
        # a head before its latest timestamp goes: whatever it sends next comes later still
        seen = self._seen.get(source, -math.inf)
        slot = 0 if caught_up(source) else 1
        waiting[slot] = min(waiting[slot], seen)
