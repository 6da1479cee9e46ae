"""Lists made of several records: what the join keeps per open list besides its pending slot.

A mapping with ``repeats: merge`` or ``shown_actions`` (the UBI preset; docs/mapping.md, "Lists
of several records") lets one request id's list come in several records: query records with
or without items, and shown items (per-item impression events, :class:`evald.events.Shown`).
The first record opens the list (a pending slot, as any impression); :class:`OpenList` holds
what the later ones add and :class:`ShownItems` the shown items; the store's
:class:`ReplayMarks` take the records a restore's replay must not let open a list again
(docs/design.md, "Lists of several records across a restore").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from evald.join.offset_log import OffsetLog
from evald.join.replay_marks import ReplayMarks

#: column name -> dtype; ``next`` chains a list's entries (0 = end, else entry + 1) and
#: ``offset`` is the source offset + 1 (0: none)
COLUMNS: dict[str, type] = {
    "item": np.int64,
    "position": np.int64,
    "ts": np.int64,
    "next": np.int32,
    "offset": np.int64,
}


class ShownItems:
    """Shown items of the open lists: numpy columns, one chain per list (named by its head,
    entry + 1; 0: empty), newest first, so a list of 20 items owns no Python object."""

    def __init__(self, capacity: int = 256) -> None:
        self._arrays: dict[str, np.ndarray] = {
            name: np.zeros(capacity, dtype) for name, dtype in COLUMNS.items()
        }
        self._free: list[int] = []
        self._top = 0
        self._offsets = OffsetLog()

    def add(self, head: int, item: int, position: int, ts: int, off: int) -> int:
        """Put an entry (``off``: source offset + 1, 0 none) in front of the chain at
        ``head``; returns the new head."""
        if self._free:
            entry = self._free.pop()
        else:
            entry = self._top
            self._top += 1
            if entry >= len(self._arrays["item"]):
                for name, old in self._arrays.items():
                    new = np.zeros(len(old) * 2, old.dtype)
                    new[: len(old)] = old
                    self._arrays[name] = new
        a = self._arrays
        a["item"][entry], a["position"][entry], a["ts"][entry] = item, position, ts
        a["next"][entry] = head
        if off:
            a["offset"][entry] = off
            self._offsets.push(off - 1, entry)
        return entry + 1

    def _entries(self, head: int) -> list[int]:
        """The chain's entries in the order they were added."""
        nexts = self._arrays["next"]
        out = []
        link = head
        while link:
            out.append(link - 1)
            link = int(nexts[link - 1])
        out.reverse()
        return out

    def items(self, head: int) -> list[int]:
        """The item hashes of the chain in position order (equal positions in the order they
        came); an item shown twice at one position counts once."""
        a = self._arrays
        entries = self._entries(head)
        seen: set[tuple[int, int]] = set()
        ordered = []
        for entry in sorted(entries, key=lambda e: int(a["position"][e])):
            pair = (int(a["position"][entry]), int(a["item"][entry]))
            if pair not in seen:
                seen.add(pair)
                ordered.append(pair[1])
        return ordered

    def release(self, head: int) -> list[tuple[int, int]]:
        """Free the chain; returns (source offset, time) of its entries that had an offset."""
        a = self._arrays
        entries = self._entries(head)
        kept = [(int(a["offset"][e]) - 1, int(a["ts"][e])) for e in entries if a["offset"][e]]
        a["offset"][entries] = 0
        self._free.extend(entries)
        return kept

    def offsets(self, head: int) -> list[int]:
        """Source offsets on the chain (for checks: ``low_offset`` is the fast way)."""
        offset = self._arrays["offset"]
        return [int(offset[e]) - 1 for e in self._entries(head) if offset[e]]

    def low_offset(self) -> int | None:
        """Smallest source offset of any entry, or None."""
        return self._offsets.low(self._arrays["offset"])


class OpenList:
    """What an open list of several records holds besides its pending slot."""

    __slots__ = ("count", "head", "joiners", "opener", "queried")

    def __init__(self, opener: tuple[str, int] | None, queried: bool) -> None:
        #: (kind, source offset) of the record that opened the list; None: no offset known
        self.opener = opener
        #: a query record gave the list its labels, user and query
        self.queried = queried
        #: (source offset, time) of the query records that came after the opener
        self.joiners: list[tuple[int, int]] = []
        #: its shown items' chain (``ShownItems``) and their number
        self.head = 0
        self.count = 0


class Lists:
    """The open lists of several records of one partition, for a mapping that merges a
    request id's records (the join store has one when the decoder says so, none otherwise)."""

    def __init__(
        self,
        marks: ReplayMarks,
        max_items: int,
        user_cluster: Callable[[str], int] | None,
    ) -> None:
        #: pending slot -> its list's later records (a slot opened by one record with its
        #: items and never joined has none)
        self.open: dict[int, OpenList] = {}
        self.shown = ShownItems()
        #: the store's marks, which the records of the lists scored join
        self.marks = marks
        self.max_items = max_items
        #: the user id -> cluster key function of the store (None: clusters not kept)
        self.user_cluster = user_cluster

    def of(self, slot: int, opener_offset: int) -> OpenList:
        """The slot's list, made for a slot a query record opened (``opener_offset``: its
        source offset + 1, 0 none) when a second record joins it."""
        found = self.open.get(slot)
        if found is None:
            opener = ("impression", opener_offset - 1) if opener_offset else None
            found = self.open[slot] = OpenList(opener, queried=True)
        return found

    def taken(
        self, slots: list[int], reasons: list[str], given: list[int], times: list[int]
    ) -> dict[int, list[int]]:
        """The lists of ``slots`` (closed for ``reasons``) are scored now: returns row ->
        item hashes for the rows whose items no record gave (``given[row]``: how many it
        gave) but shown items did, frees their state and marks their records for a restore
        (``times[row]``: the list's time)."""
        rows: dict[int, list[int]] = {}
        marks, shown = self.marks, self.shown
        for row, slot in enumerate(slots):
            entry = self.open.pop(slot, None)
            if entry is None:
                continue
            if entry.head and not given[row]:
                rows[row] = shown.items(entry.head)
            for offset, ts in entry.joiners:
                marks.add("impression", offset, ts)
            for offset, ts in shown.release(entry.head):
                marks.add("feedback", offset, ts)
            if reasons[row] == "cap" and entry.opener is not None:
                marks.add(entry.opener[0], entry.opener[1], times[row])
        return rows


def widen(
    items: np.ndarray, mask: np.ndarray, lengths: np.ndarray, rows: dict[int, list[int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The padded (item hashes, valid mask, lengths) of a batch with ``rows`` replaced."""
    width = max(items.shape[1], *(len(v) for v in rows.values()))
    if width > items.shape[1]:
        wide = np.zeros((items.shape[0], width), items.dtype)
        wide[:, : items.shape[1]] = items
        items = wide
    mask = np.arange(width) < lengths[:, None]
    for row, hashes in rows.items():
        items[row, : len(hashes)] = hashes
        mask[row] = np.arange(width) < len(hashes)
        lengths[row] = len(hashes)
    return items, mask, lengths
