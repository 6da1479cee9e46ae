"""Per-partition merge of the impressions and feedback topics into one timestamp order.

Why: the engine's watermark for partition p is the largest event time it has seen, and a
feedback event is late when the watermark has already passed its impression's window. If the
daemon fed whatever each fetch happened to return (a burst of impressions, then a burst of
feedback), which feedback counts as late would depend on fetch sizes and timing, and a restart
would not reproduce an uninterrupted run. Feeding partition p's records of both topics in
record-timestamp order (impressions first on equal timestamps) makes the sequence the engine
sees a function of the data alone. A record is released once the other topic has a record
buffered that sorts after it, or when the other topic is caught up and the record waited
``hold_s`` (see :meth:`Merger.release`). Records more than ``hold_s`` apart in arrival are
still fed in arrival order, and ``max_hold_s`` bounds every wait: liveness beats exactness when
a producer or a fetch is stuck.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["KINDS", "Merger"]

KINDS: tuple[str, str] = ("impression", "feedback")
_RANK = {"impression": 0, "feedback": 1}

R = TypeVar("R")


@dataclass
class _Held(Generic[R]):
    timestamp: int
    since: float
    record: R


class Merger(Generic[R]):
    """Buffers one partition's records per kind and releases them in (timestamp, kind) order."""

    def __init__(
        self, hold_s: float, clock: Callable[[], float], max_hold_s: float | None = None
    ) -> None:
        self.hold_s = hold_s
        self.max_hold_s = max_hold_s if max_hold_s is not None else 15 * hold_s
        self._clock = clock
        self._queues: dict[str, deque[_Held[R]]] = {kind: deque() for kind in KINDS}

    def push(self, kind: str, timestamp: int, record: R) -> None:
        """Buffer a record; within a kind, records keep their offset order."""
        self._queues[kind].append(_Held(timestamp, self._clock(), record))

    def buffered(self, kind: str | None = None) -> int:
        """Records held (of one kind, or in total)."""
        if kind is not None:
            return len(self._queues[kind])
        return sum(len(q) for q in self._queues.values())

    def release(self, caught_up: Mapping[str, bool]) -> list[tuple[str, R]]:
        """Pop every record that can be fed now, in feed order.

        A record with nothing of the other kind buffered goes once it waited ``hold_s`` *and*
        the other topic partition is caught up (``caught_up[kind]``: fetched to the high
        watermark, or deliberately paused), or once it waited ``max_hold_s`` regardless. Both
        conditions matter: right after an assignment one topic's first fetch can arrive
        seconds after the other's, and a topic that looks caught up may still have records in
        a producer's buffer.
        """
        out: list[tuple[str, R]] = []
        imp, fb = self._queues["impression"], self._queues["feedback"]
        now = self._clock()
        while imp or fb:
            if imp and fb:
                kind = "impression" if (imp[0].timestamp, 0) <= (fb[0].timestamp, 1) else "feedback"
            else:
                kind = "impression" if imp else "feedback"
                other = "feedback" if imp else "impression"
                waited = now - self._queues[kind][0].since
                if waited < self.hold_s or (
                    waited < self.max_hold_s and not caught_up.get(other, False)
                ):
                    break
            out.append((kind, self._queues[kind].popleft().record))
        return out

    def clear(self) -> None:
        """Forget everything held (the partition is being revoked or resynchronised)."""
        for queue in self._queues.values():
            queue.clear()
