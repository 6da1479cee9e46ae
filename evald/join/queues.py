"""Ordered containers of the join: an int FIFO and a queue popped in deadline order."""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import numpy as np

from evald.join.window import deadline, is_closed

V = TypeVar("V")
_BIG = 1 << 62  # later than every deadline


class IntFifo:
    """FIFO of ints in an ``array('i')`` (4 bytes each), compacted as it drains."""

    def __init__(self) -> None:
        self._a = array("i")
        self._head = 0
        #: the array's own append (C): a push costs no Python frame of this class
        self.append: Callable[[int], None] = self._a.append

    def __len__(self) -> int:
        return len(self._a) - self._head

    def __getitem__(self, index: int) -> int:
        return self._a[self._head + index]

    def take_all(self) -> list[int]:
        """Remove and return every value, oldest first."""
        values = self._a[self._head :].tolist()
        self._a = array("i")
        self._head = 0
        self.append = self._a.append
        return values

    def popleft(self) -> int:
        value = self._a[self._head]
        self._head += 1
        if self._head >= 4096 and self._head * 2 >= len(self._a):
            del self._a[: self._head]
            self._head = 0
        return value


class ObjectFifo(deque[V]):
    """A deque with ``IntFifo``'s ``take_all``: the FIFO of a queue of Python objects."""

    def take_all(self) -> list[V]:
        values = list(self)
        self.clear()
        return values


class _Fifo(Protocol[V]):
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> V: ...
    def append(self, value: V) -> None: ...
    def popleft(self) -> V: ...
    def take_all(self) -> list[V]: ...


class DeadlineQueue(Generic[V]):
    """Pop-in-deadline-order queue, O(1) for the common in-order arrivals.

    Values pushed with a deadline >= the last one go to a FIFO that stores only the value (its
    deadline is recomputed by ``deadline_of`` when it reaches the head, so an in-order pending
    impression costs 4 bytes here); earlier ones (out-of-order arrivals) go to a heap of
    (deadline, seq, value). The minimum is at the head of one of the two; on a tie the FIFO
    goes first.
    """

    def __init__(self, deadline_of: Callable[[V], int], fifo: _Fifo[V]) -> None:
        self._fifo = fifo
        self._heap: list[tuple[int, int, V]] = []
        self._deadline_of = deadline_of
        self._tail = -_BIG
        self._seq = 0

    def __len__(self) -> int:
        return len(self._fifo) + len(self._heap)

    def push(self, due: int, value: V) -> None:
        if due >= self._tail:
            self._fifo.append(value)
            self._tail = due
        else:
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, value))

    def min_deadline(self) -> int | None:
        fifo, heap = self._fifo, self._heap
        if fifo:
            head = self._deadline_of(fifo[0])
            return min(head, heap[0][0]) if heap else head
        return heap[0][0] if heap else None

    def pop(self) -> V:
        """Remove the value with the earliest deadline (the queue must not be empty)."""
        fifo, heap = self._fifo, self._heap
        if heap and (not fifo or heap[0][0] < self._deadline_of(fifo[0])):
            return heapq.heappop(heap)[2]
        return fifo.popleft()

    def pop_due(self, watermark: int) -> tuple[list[V], int]:
        """Remove every value closed at ``watermark``, in ``pop`` order; returns them and the
        earliest deadline left (a large number when empty), found by the same merge walk:
        this runs on nearly every event once the window is full."""
        fifo, heap, deadline_of = self._fifo, self._heap, self._deadline_of
        due: list[V] = []
        while True:
            first = deadline_of(fifo[0]) if fifo else _BIG
            other = heap[0][0] if heap else _BIG
            if first <= other:
                if not is_closed(first, watermark):
                    return due, first
                due.append(fifo.popleft())
            else:
                if not is_closed(other, watermark):
                    return due, other
                due.append(heapq.heappop(heap)[2])

    def take_all_slots(self: DeadlineQueue[int], ts: np.ndarray, window: int) -> list[int]:
        """Empty a queue of slots whose deadline is ``deadline(ts[slot], window)``; returns
        them in the order repeated ``pop`` calls would (deadline, FIFO before heap on ties,
        heap by push order), sorted in one numpy pass."""
        in_order = self._fifo.take_all()
        if not self._heap:
            return in_order
        heap = sorted(self._heap)
        self._heap = []
        slots = np.asarray(in_order + [value for _, _, value in heap], dtype=np.intp)
        deadlines = deadline(ts[slots], window)
        source = np.zeros(len(slots), np.int8)
        source[len(in_order) :] = 1  # position within each source is already pop order
        order = np.lexsort((np.arange(len(slots)), source, deadlines))
        return list(slots[order].tolist())
