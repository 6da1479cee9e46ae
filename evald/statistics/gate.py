"""ShareGate: when a window of the partitions' final shares is complete.

The comparisons' fold (live.py) and the interleaving test's (evald/interleaving/live.py) wait
for the same thing: a window is complete once *every* partition's final mark has passed its
end, and it is handed out in window order with its shares in (partition, chunk) order, so the
sum is the same wherever it is folded. A share counts once per (window, partition, chunk): a
copy, a share of a window already handed out, one of another window width, or one its owner
does not accept (written before a settings change) is ignored and counted. One gate holds both
folds' bookkeeping so that they cannot drift apart. Not thread-safe: its owner holds its lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

__all__ = ["GateShare", "ShareGate"]


class GateShare(Protocol):
    """What the gate reads of a share."""

    @property
    def start(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def partition(self) -> int: ...
    @property
    def chunk(self) -> int: ...


S = TypeVar("S", bound=GateShare)


class ShareGate(Generic[S]):
    """Shares per window until it is complete, and each partition's final mark."""

    def __init__(self, width: int) -> None:
        self.width = width
        #: window start -> (partition, chunk) -> the share, until the window is handed out
        self._shares: dict[int, dict[tuple[int, int], S]] = {}
        #: partition -> every window ending at or before it is final there
        self._final: dict[int, int] = {}
        #: windows ending at or before it are handed out (later shares of them are ignored)
        self._folded_until: int | None = None
        #: shares ignored (see the module docstring)
        self.ignored = 0

    def add(self, share: S, *, accepted: bool = True) -> None:
        """Keep ``share`` until its window is complete; ``accepted`` False: ignore it."""
        folded = self._folded_until
        window = self._shares.get(share.start, {})
        if (
            not accepted
            or share.width != self.width
            or (folded is not None and share.start + share.width <= folded)
            or (share.partition, share.chunk) in window
        ):
            self.ignored += 1
            return
        self._shares.setdefault(share.start, window)[(share.partition, share.chunk)] = share

    def mark(self, partition: int, final_until: int) -> None:
        """Partition ``partition`` has published every window ending at or before
        ``final_until`` (a mark never moves back)."""
        self._final[partition] = max(self._final.get(partition, final_until), final_until)

    def final_until(self, partitions: Iterable[int] | None = None) -> int | None:
        """The least final mark over ``partitions`` (None: those that sent one); None while
        one of them has none."""
        marks = [self._final.get(p) for p in (self._final if partitions is None else partitions)]
        if not marks or any(m is None for m in marks):
            return None
        return min(m for m in marks if m is not None)

    def unmarked(self, partitions: Iterable[int]) -> list[int]:
        """The partitions with no final mark yet: each holds every window back."""
        return [p for p in partitions if p not in self._final]

    def complete(self, partitions: Iterable[int] | None = None) -> list[tuple[int, list[S]]]:
        """Hand out, in window order, every window complete in all ``partitions`` (None: every
        partition that sent a mark), each with its shares in (partition, chunk) order, and
        forget them."""
        limit = self.final_until(partitions)
        if limit is None:
            return []
        out = []
        for start in sorted(self._shares):
            if start + self.width > limit:
                break
            shares = self._shares.pop(start)
            out.append((start, [shares[key] for key in sorted(shares)]))
        if self._folded_until is None or limit > self._folded_until:
            self._folded_until = limit
        return out
