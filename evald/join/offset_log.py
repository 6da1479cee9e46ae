"""OffsetLog: the smallest source offset still needed, in amortised O(1) per event."""

from __future__ import annotations

import heapq
from array import array

import numpy as np


class OffsetLog:
    """Source offsets of live entries (pending impressions or attached feedback), so their
    minimum costs amortised O(1) per event instead of a scan of the pending state per commit.

    An entry is (offset, ref); it is live while ``stored[ref] == offset + 1`` (the owner zeroes
    or overwrites a ref's column when it frees or reuses it). Offsets pushed in increasing
    order, the rule on a Kafka partition, go to a FIFO; others (held feedback attached later,
    out-of-order callers) to a heap. Dead entries are dropped when they reach the front.
    """

    def __init__(self) -> None:
        self._off = array("q")
        self._ref = array("i")
        self._head = 0
        self._last = -1
        self._heap: list[tuple[int, int]] = []

    def push(self, offset: int, ref: int) -> None:
        if offset >= self._last:
            self._off.append(offset)
            self._ref.append(ref)
            self._last = offset
        else:
            heapq.heappush(self._heap, (offset, ref))

    def push_many(self, offsets: list[int], refs: list[int]) -> None:
        if offsets and offsets[0] >= self._last and offsets == sorted(offsets):
            self._off.extend(offsets)
            self._ref.extend(refs)
            self._last = offsets[-1]
        else:
            for offset, ref in zip(offsets, refs, strict=True):
                self.push(offset, ref)

    def low(self, stored: np.ndarray) -> int | None:
        """Smallest live offset, or None."""
        off, ref, head = self._off, self._ref, self._head
        while head < len(off):  # skip dead entries, a numpy chunk at a time
            end = min(len(off), head + 4096)
            offs = np.frombuffer(off, np.int64)[head:end]
            alive = stored[np.frombuffer(ref, np.int32)[head:end]] == offs + 1
            del offs
            if alive.any():
                head += int(alive.argmax())
                break
            head = end
        if head >= 4096 and head * 2 >= len(off):
            del off[:head], ref[:head]
            head = 0
        self._head = head
        heap = self._heap
        while heap and stored[heap[0][1]] != heap[0][0] + 1:
            heapq.heappop(heap)
        first = off[head] if head < len(off) else None
        if heap and (first is None or heap[0][0] < first):
            return heap[0][0]
        return first
