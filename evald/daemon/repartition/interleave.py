"""The repartition stage's merge of many source partitions into one record-timestamp order.

Why: the main stage merges an internal partition's impressions and feedback by timestamp and
assumes, like for a topic keyed by request id, that timestamps do not decrease within a
partition of each topic (evald/daemon/main/merge.py). An internal partition gets records from every
source partition; written in fetch order (a batch of source partition 0, then one of partition
1, ...), its timestamps would jump back by a batch's time span at every switch, and which
feedback is late would depend on fetch sizes. So the stage releases what it fetched in
timestamp order across all its source partitions, with the rule of merge.py generalised to
*n* queues: the smallest buffered head goes once every source partition with nothing buffered
has either delivered a later timestamp already, or the head waited ``hold_s`` and that source
was caught up *as of a time after the head arrived*; ``max_hold_s`` bounds every wait
(liveness over exactness when a source stalls). Ties go to impressions first, then by
partition and offset, so the order is a function of the data alone.

Why "as of a time after the head arrived" (issue #12): "caught up" once meant "position ≥
``consumer.highwater``", the watermark of whichever fetch answered last. While a source
partition's leader moves its fetches fail, that watermark goes stale, and the source looked
caught up while records written before the head were still on the broker. The head then went
after ``hold_s`` and those records were copied after it, in a later cycle and transaction. The
copies stay exactly once, but their order changes: an internal partition gets a timestamp
that goes back (two sources of one topic), and feedback can be committed before the impression
it follows (an impressions source stalled, a feedback head released). The main stage trusts
both orders: it merges an internal partition's two topics by timestamp, assuming each is in
order, and the internal impressions partition is genuinely caught up while the impression is
not yet copied, so it feeds the click first and its watermark moves ahead; which feedback is
late then differs from an uninterrupted run. Now a source's "caught up" carries the time of
the fetch request that confirmed it (``FetchWatch``), and a failing source holds the heads at
or after its latest timestamp until a fetch built after they arrived succeeds, or
``max_hold_s`` passes.
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

    def release(self, sources: Sequence[S], caught_up: Callable[[S], float]) -> list[Any]:
        """Pop every record that may go now, in order. ``sources``: every source assigned (one
        with nothing buffered can still hold the others back); ``caught_up(source)``: the time,
        on this clock, as of which ``source`` is known to be fetched to its end (``-inf``:
        unknown). A head that arrived at or after that time may be waiting for records the
        source held then, so only a later time lets it go before ``max_hold_s``."""
        now = self._clock()
        heap = [
            (queue[0][0], self._rank(source), queue[0][2].offset, source)
            for source, queue in self._queues.items()
            if queue
        ]
        heapq.heapify(heap)
        # per empty source: (latest timestamp, caught up as of); a head before every latest
        # timestamp (``floor``) goes at once: whatever they send next comes later still
        empty = [
            self._empty(source, caught_up) for source in sources if not self._queues.get(source)
        ]
        floor = min((seen for seen, _ in empty), default=math.inf)
        out: list[Any] = []
        while heap:
            timestamp, _, _, source = heap[0]
            queue = self._queues[source]
            if timestamp >= floor and self._held(timestamp, queue[0][1], now, empty):
                break
            out.append(queue.popleft()[2])
            if queue:
                heapq.heapreplace(heap, (queue[0][0], heap[0][1], queue[0][2].offset, source))
            else:
                heapq.heappop(heap)
                empty.append(self._empty(source, caught_up))
                floor = min(floor, empty[-1][0])
        return out

    def _empty(self, source: S, caught_up: Callable[[S], float]) -> tuple[float, float]:
        return self._seen.get(source, -math.inf), caught_up(source)

    def _held(
        self, timestamp: float, arrived: float, now: float, empty: list[tuple[float, float]]
    ) -> bool:
        """Whether a head at ``timestamp`` that arrived at ``arrived`` waits for an empty
        source not yet past its timestamp: ``hold_s`` at least, then until that source was
        caught up as of a time after the head arrived, ``max_hold_s`` at most."""
        waited = now - arrived
        if waited >= self.max_hold_s:
            return False
        if waited < self.hold_s:
            return True
        return any(seen <= timestamp and since <= arrived for seen, since in empty)
