"""ReplayMarks: the records a restore's replay must skip although their own time would let
them in.

A replay from a checkpoint's committed offsets re-feeds records the first life decided on;
their time alone tells it which impressions were emitted (``ts + window <= watermark``), but
not a record the first life refused or merged into something emitted since: a repeated
impression (its request id was pending), the later records of a list of several records, a
shown item a full list refused. Re-fed after what they joined was emitted, each would open a
pending impression or list again. Their offsets are marked here until the watermark passes
their own time plus the window (the time rule skips them after that), and each checkpoint
lists the marked offsets it replays (docs/design.md, "Every output exactly once").
"""

from __future__ import annotations

import heapq

KINDS = ("impression", "feedback")


class ReplayMarks:
    """Offsets of records a restore's replay must skip although their time alone would let
    them open a list or an impression: a repeated impression, the later records of a list
    already scored whose own time is later than the list's (or of a list the cap closed),
    a shown item a full list refused. Kept while their time + window is ahead of the
    watermark (after that the time rule skips them: docs/design.md)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._heap: list[tuple[int, int, int]] = []  # (deadline, kind index, offset)

    def add(self, kind: str, offset: int, ts: int) -> None:
        heapq.heappush(self._heap, (ts + self.window, KINDS.index(kind), offset))

    def prune(self, watermark: int | None) -> None:
        """Forget marks the time rule covers at ``watermark``."""
        heap = self._heap
        while heap and watermark is not None and heap[0][0] <= watermark:
            heapq.heappop(heap)

    def offsets(self, kind: str, since: int, watermark: int | None) -> list[int]:
        """Marked offsets of ``kind`` at or after ``since`` still needed at ``watermark``."""
        self.prune(watermark)
        index = KINDS.index(kind)
        return sorted({o for _, k, o in self._heap if k == index and o >= since})

    def __len__(self) -> int:
        return len(self._heap)
