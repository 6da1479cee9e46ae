"""Feedback inside the join: attached to a pending impression, or held waiting for one."""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from typing import cast

import numpy as np

from evald.join.offset_log import OffsetLog
from evald.join.queues import DeadlineQueue, ObjectFifo

#: column name -> dtype; ``next`` chains a slot's entries (0 = end, else entry + 1) and
#: ``offset`` is the source offset + 1 (0: none)
COLUMNS: dict[str, type] = {
    "item": np.int64,
    "grade": np.float64,
    "next": np.int32,
    "evid": np.int64,
    "offset": np.int64,
}


class AttachedFeedback:
    """Feedback attached to pending impressions: numpy columns, one chain per impression.

    A chain is named by its head (entry + 1, 0: empty), which the impression's slot stores.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._arrays: dict[str, np.ndarray] = {
            name: np.zeros(capacity, dtype) for name, dtype in COLUMNS.items()
        }
        self._bind()
        self._free: list[int] = []
        self._top = 0
        self._offsets = OffsetLog()

    def _bind(self) -> None:
        a = self._arrays
        # typeshed lets a memoryview hold ints only; this one is float64
        self._grade = cast("MutableSequence[float]", a["grade"].data)
        self._item = a["item"].data
        self._next, self._evid = a["next"].data, a["evid"].data
        self._offset = a["offset"].data

    def has_event(self, head: int, evid: int) -> bool:
        """Whether the chain starting at ``head`` holds event id ``evid``."""
        evids, nexts = self._evid, self._next
        link = head
        while link:
            if evids[link - 1] == evid:
                return True
            link = nexts[link - 1]
        return False

    def add(self, head: int, item: int, grade: float, evid: int, off: int) -> int:
        """Put an entry in front of the chain at ``head``; returns the new head."""
        if self._free:
            entry = self._free.pop()
        else:
            entry = self._top
            self._top += 1
            if entry >= len(self._arrays["item"]):
                self._grow()
        self._item[entry] = item
        self._grade[entry] = grade
        if evid:
            self._evid[entry] = evid
        if off:
            self._offset[entry] = off
            self._offsets.push(off - 1, entry)
        self._next[entry] = head
        return entry + 1

    def _grow(self) -> None:
        for name, old in self._arrays.items():
            new = np.zeros(len(old) * 2, old.dtype)
            new[: len(old)] = old
            self._arrays[name] = new
        self._bind()

    def chains(self, heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index in ``heads``, entry) of every entry on the chains starting at ``heads``.

        Chains are walked one link per numpy round while many are left; the few long ones
        (a list with lots of feedback) are finished in Python so no round is nearly empty.
        """
        rows = np.flatnonzero(heads)
        links = heads[rows].astype(np.intp) - 1
        row_parts, entry_parts = [], []
        next_col = self._arrays["next"]
        while len(links) > 16:
            row_parts.append(rows)
            entry_parts.append(links)
            nxt = next_col[links]
            more = nxt != 0
            rows, links = rows[more], nxt[more].astype(np.intp) - 1
        tail_rows: list[int] = []
        tail_entries: list[int] = []
        fb_next = self._next.__getitem__
        for row, entry in zip(rows.tolist(), links.tolist(), strict=True):
            while True:
                tail_rows.append(row)
                tail_entries.append(entry)
                link = fb_next(entry)
                if not link:
                    break
                entry = link - 1
        row_parts.append(np.asarray(tail_rows, dtype=np.intp))
        entry_parts.append(np.asarray(tail_entries, dtype=np.intp))
        return np.concatenate(row_parts), np.concatenate(entry_parts)

    def credit(
        self,
        heads: np.ndarray,
        items: np.ndarray,
        mask: np.ndarray,
        grades: np.ndarray,
    ) -> int:
        """Grade served items from the chains at ``heads`` (row r of ``items`` / ``mask`` /
        ``grades`` is chain r) and free those entries; returns how many entries named an item
        the impression did not serve. Re-fed entries count too: an impression is graded once,
        when it closes, and one a restore rebuilt was still open at the checkpoint."""
        r, e = self.chains(heads)
        if not len(e):
            return 0
        a = self._arrays
        hit = (items[r] == a["item"][e][:, None]) & mask[r]
        col = hit.argmax(axis=1)  # an item served twice is credited at its first rank
        matched = hit[np.arange(len(e)), col]
        missing = int((~matched).sum())
        np.maximum.at(grades, (r[matched], col[matched]), a["grade"][e][matched])
        a["evid"][e] = 0
        a["offset"][e] = 0
        self._free.extend(e.tolist())
        return missing

    def offsets(self, head: int) -> list[int]:
        """Source offsets on the chain at ``head`` (for checks: ``low_offset`` is the fast way)."""
        found = []
        link = head
        while link:
            if self._offset[link - 1]:
                found.append(self._offset[link - 1] - 1)
            link = self._next[link - 1]
        return found

    def low_offset(self) -> int | None:
        """Smallest source offset of any attached entry, or None."""
        return self._offsets.low(self._arrays["offset"])


class HeldEntry:
    """Feedback waiting for its impression (a Python object: these are few and short-lived).
    ``replayed``: a restore re-fed it and its outcome was counted before the checkpoint (it
    was attached to an impression emitted since), so it leaves without a count."""

    __slots__ = ("alive", "deadline", "evid", "grade", "item", "offset", "replayed", "rid", "ts")

    def __init__(
        self,
        rid: str,
        ts: int,
        item: int,
        grade: float,
        evid: int,
        offset: int,
        replayed: bool,
        deadline: int,
    ) -> None:
        self.rid, self.ts, self.item, self.grade = rid, ts, item, grade
        self.evid, self.offset, self.replayed, self.deadline = evid, offset, replayed, deadline
        self.alive = True


def _deadline_of(entry: HeldEntry) -> int:
    return entry.deadline


class HeldFeedback:
    """Feedback whose impression is not pending, by request id and in deadline order.

    An entry leaves by being claimed (its impression arrived) or expired (orphaned); the queue
    drops claimed entries lazily, when they reach its front.
    """

    def __init__(self, limit: int = 1 << 62) -> None:
        self._by_rid: dict[str, list[HeldEntry]] = {}
        self._queue: DeadlineQueue[HeldEntry] = DeadlineQueue(_deadline_of, ObjectFifo())
        self.count = 0  #: live entries
        #: live entries a replay re-fed whose outcome was decided before (``replayed``)
        self.replayed = 0
        self.limit = limit  #: live entries at most (``full``)

    def full(self) -> bool:
        """At ``limit``: the oldest entry must go before another is added."""
        return self.count >= self.limit

    def __len__(self) -> int:
        return self.count

    def waiting(self) -> int:
        """Request ids with held feedback."""
        return len(self._by_rid)

    def has_event(self, rid: str, evid: int) -> bool:
        return any(h.alive and h.evid == evid for h in self._by_rid.get(rid, ()))

    def add(self, entry: HeldEntry) -> None:
        waiting = self._by_rid.get(entry.rid)
        if waiting is None:
            self._by_rid[entry.rid] = [entry]
        else:
            waiting.append(entry)
        self._queue.push(entry.deadline, entry)
        self.count += 1
        self.replayed += entry.replayed

    def claim(self, rid: str) -> Sequence[HeldEntry]:
        """Remove and return the live entries for ``rid`` (its impression arrived)."""
        if not self._by_rid:
            return ()
        entries = [h for h in self._by_rid.pop(rid, ()) if h.alive]
        for entry in entries:
            entry.alive = False
            self.replayed -= entry.replayed
        self.count -= len(entries)
        return entries

    def forget_replayed(self) -> None:
        """Drop every ``replayed`` entry, uncounted: once a replay is fed, those left held
        belong to impressions emitted before the checkpoint (an uninterrupted engine had
        them attached there), and must neither match a later copy as its duplicate nor be
        claimed by a later list of the same request id."""
        for rid in [rid for rid, w in self._by_rid.items() if any(h.replayed for h in w)]:
            waiting = self._by_rid[rid]
            for entry in waiting:
                if entry.alive and entry.replayed:
                    entry.alive = False
                    self.count -= 1
            waiting[:] = [h for h in waiting if h.alive]
            if not waiting:
                del self._by_rid[rid]
        self.replayed = 0

    def min_deadline(self) -> int | None:
        return self._queue.min_deadline()

    def expire_due(self, watermark: int) -> int:
        """Expire every entry due at ``watermark``; returns how many were fresh (not re-fed)."""
        due, _ = self._queue.pop_due(watermark)
        return sum(self._expire(entry) for entry in due)

    def expire_oldest(self) -> int:
        """Expire the live entry with the earliest deadline; returns 1 if it was fresh."""
        queue = self._queue
        while len(queue):
            entry = queue.pop()
            if entry.alive:
                return self._expire(entry)
        return 0

    def expire_all(self) -> int:
        """Expire every entry (a drain); returns how many were fresh."""
        expired = 0
        while len(self._queue):
            expired += self.expire_oldest()
        return expired

    def _expire(self, entry: HeldEntry) -> int:
        if not entry.alive:
            return 0
        entry.alive = False
        self.count -= 1
        self.replayed -= entry.replayed
        waiting = self._by_rid.get(entry.rid)
        if waiting is not None:
            waiting.remove(entry)
            if not waiting:
                del self._by_rid[entry.rid]
        return 0 if entry.replayed else 1

    def offsets(self) -> list[int]:
        """Source offsets of the live entries."""
        return [h.offset - 1 for w in self._by_rid.values() for h in w if h.alive and h.offset > 0]

    def uncounted_offsets(self) -> list[int]:
        """Source offsets of the live entries whose outcome is still to be counted (not
        ``replayed``): what a checkpoint lists for the next restore."""
        return [
            h.offset - 1
            for w in self._by_rid.values()
            for h in w
            if h.alive and h.offset > 0 and not h.replayed
        ]
