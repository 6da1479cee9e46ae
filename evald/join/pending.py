"""PendingImpressions: the columns and arenas of the impressions waiting for their window.

A pending impression owns no Python object. Its item ids are 64-bit hashes in one flat
``array('q')`` arena and its request id is UTF-8 in one ``bytearray`` arena (each compacted when
half garbage); of its user id only the cluster key is kept, of its query only an id into the
store's query table (``evald.join.queries``); fixed-width numpy columns hold the rest, one row
per slot. Slots are recycled.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from evald.join.item_keys import KeyArena
from evald.join.queries import QueryTable
from evald.join.teams import TeamBook
from evald.query import QueryNormalizer

#: column name -> dtype. ``label``, ``offset`` and ``head`` store id + 1 (0: none; a 0 label
#: marks a free slot); ``start`` / ``rid_start`` index the arenas; ``key`` is the rid-table key;
#: ``query`` the query-table id (0: no query);
#: ``cluster`` (``CLUSTER``) is the bootstrap cluster key of the impression's user id (0: none
#: or not kept); it is allocated with the first impression that has one, so traffic without
#: user ids does not pay its 8 bytes per slot.
COLUMNS: dict[str, type] = {
    "ts": np.int64,
    "start": np.int64,
    "length": np.int32,
    "rid_start": np.int64,
    "rid_len": np.int32,
    "key": np.int64,
    "label": np.int32,
    "offset": np.int64,
    "head": np.int32,
    "query": np.int32,
}
CLUSTER = ("cluster", np.uint64)


class PendingImpressions:
    """Slot columns plus the item and request-id arenas.

    Per-slot reads and writes go through the memoryview attributes (``ts[slot]``...): a
    memoryview item is about twice as cheap to touch from Python as a numpy scalar index.
    ``column(name)`` is the numpy array behind one, for vectorised work over many slots.
    ``teams``: the teams of the interleaved ones (most lists have none: a dict, not a column).
    ``keys``: the stable keys of each list's first items (None: not kept).

    Long because: each hot column is bound as a memoryview attribute of its own (``_bind``), and
    the optional stable-key arena sits beside them.
    """

    def __init__(
        self, capacity: int = 1024, queries: QueryTable | None = None, key_depth: int = 0
    ) -> None:
        """``queries``: interns the slots' normalised queries (default: the rule, 100
        characters). ``key_depth``: the first items of each list whose stable keys are kept
        (``keys``, evald.join.item_keys) for the zero-feedback signals; 0: none, nothing paid."""
        self.teams = TeamBook()
        self.keys = KeyArena(key_depth) if key_depth else None
        self.queries = queries if queries is not None else QueryTable(QueryNormalizer(100))
        self._arrays: dict[str, np.ndarray] = {
            name: np.zeros(capacity, dtype) for name, dtype in COLUMNS.items()
        }
        self._bind()
        self._top = 0
        self._free: list[int] = []
        self._items = array("q")
        self._items_garbage = 0
        self._rids = bytearray()
        self._rids_garbage = 0

    def _bind(self) -> None:
        a = self._arrays
        self.ts, self.key = a["ts"].data, a["key"].data
        self.offset, self.head = a["offset"].data, a["head"].data
        self._start, self._length = a["start"].data, a["length"].data
        self._rid_start, self._rid_len = a["rid_start"].data, a["rid_len"].data
        self._label, self._query = a["label"].data, a["query"].data
        self._cluster = a["cluster"].data if "cluster" in a else None

    def column(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def new_slot(self) -> int:
        """A free slot (recycled first), growing the columns when all are used."""
        if self._free:
            return self._free.pop()
        slot = self._top
        self._top += 1
        if slot >= len(self._arrays["ts"]):
            for name, old in self._arrays.items():
                new = np.zeros(len(old) * 2, old.dtype)
                new[: len(old)] = old
                self._arrays[name] = new
            self._bind()
        return slot

    def free_slot(self, slot: int) -> None:
        """Give back a slot ``new_slot`` returned and nothing was written to."""
        self._free.append(slot)

    def fill(
        self,
        slot: int,
        ts: int,
        key: int,
        label: int,
        item_ids: Sequence[str],
        rid: str,
        cluster: int = 0,
        query: int = 0,
    ) -> None:
        """Write an impression into ``slot``: its columns and its two arena spans;
        ``cluster``: its user's cluster key (0: none); ``query``: its query-table id."""
        items = self._items
        self._start[slot] = len(items)
        self._length[slot] = len(item_ids)
        items.fromlist(list(map(hash, item_ids)))  # ~25% cheaper than extend(map(...))
        if self.keys is not None:
            self.keys.set(slot, item_ids)
        rids = self._rids
        raw_rid = rid.encode()
        self._rid_start[slot] = len(rids)
        self._rid_len[slot] = len(raw_rid)
        rids += raw_rid
        self.ts[slot] = ts
        self.key[slot] = key
        self._label[slot] = label + 1
        self._query[slot] = query
        if cluster:
            if self._cluster is None:
                name, dtype = CLUSTER
                self._arrays[name] = np.zeros(len(self._arrays["ts"]), dtype)
                self._bind()
            self._cluster[slot] = cluster  # type: ignore[index]

    def set_items(self, slot: int, item_ids: Sequence[str]) -> None:
        """Give ``slot``, filled without items, its items (a later record of its list)."""
        items = self._items
        self._start[slot] = len(items)
        self._length[slot] = len(item_ids)
        items.fromlist(list(map(hash, item_ids)))
        if self.keys is not None:
            self.keys.set(slot, item_ids)

    def item_hashes(self, slot: int) -> list[int]:
        """The item hashes of ``slot``, in served order."""
        start = self._start[slot]
        return self._items[start : start + self._length[slot]].tolist()

    def length(self, slot: int) -> int:
        return int(self._length[slot])

    def label_of(self, slot: int) -> int:
        """The label id of ``slot`` (as ``fill`` was given it)."""
        return int(self._label[slot]) - 1

    def query_of(self, slot: int) -> int:
        """The query-table id of ``slot`` (0: no query)."""
        return int(self._query[slot])

    def requery(self, slot: int, query: int) -> None:
        """Give ``slot`` another query-table id (a later record of its list)."""
        self._query[slot] = query

    def relabel(self, slot: int, label: int, cluster: int) -> None:
        """Give ``slot`` another label id and user cluster (a later record of its list)."""
        self._label[slot] = label + 1
        if cluster or self._cluster is not None:
            if self._cluster is None:
                name, dtype = CLUSTER
                self._arrays[name] = np.zeros(len(self._arrays["ts"]), dtype)
                self._bind()
            self._cluster[slot] = cluster  # type: ignore[index]

    def live_slots(self) -> np.ndarray:
        """Every slot holding an impression (open, or closed and not yet taken)."""
        return np.flatnonzero(self._arrays["label"][: self._top])

    def items(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(item hashes, 0-padded (n, width); valid-cell mask; lengths) of slots ``idx``."""
        lengths = self._arrays["length"][idx].astype(np.int64)
        width = max(int(lengths.max(initial=0)), 1)
        cols = np.arange(width)
        mask = cols < lengths[:, None]
        pos = np.where(mask, self._arrays["start"][idx][:, None] + cols, 0)
        view = np.frombuffer(self._items, np.int64) if len(self._items) else np.zeros(1, np.int64)
        items = view[pos]
        del view
        return items, mask, lengths

    def request_ids(self, idx: np.ndarray) -> list[str]:
        """Decode the request ids of slots ``idx`` from the arena in one gather."""
        lens = self._arrays["rid_len"][idx].astype(np.int64)
        total = int(lens.sum())
        if not total:
            return [""] * len(idx)
        ends = np.cumsum(lens)
        src = np.repeat(self._arrays["rid_start"][idx] - (ends - lens), lens) + np.arange(total)
        view = np.frombuffer(self._rids, np.uint8)
        raw = view[src].tobytes()
        del view
        bounds = [0, *ends.tolist()]
        return [raw[bounds[i] : bounds[i + 1]].decode() for i in range(len(idx))]

    def clusters(self, idx: np.ndarray) -> np.ndarray:
        """The user cluster key (uint64, 0: none) of slots ``idx``."""
        column = self._arrays.get("cluster")
        return np.zeros(len(idx), np.uint64) if column is None else column[idx]

    def label_ids(self, idx: np.ndarray) -> list[int]:
        return list((self._arrays["label"][idx] - 1).tolist())

    def query_ids(self, idx: np.ndarray) -> list[int]:
        """The query-table ids of slots ``idx`` (0: no query)."""
        return list(self._arrays["query"][idx].tolist())

    def release(self, slots: list[int]) -> None:
        """Free taken slots; an arena more than half garbage is compacted."""
        idx = np.asarray(slots, dtype=np.intp)
        a = self._arrays
        self._items_garbage += int(a["length"][idx].astype(np.int64).sum())
        self._rids_garbage += int(a["rid_len"][idx].astype(np.int64).sum())
        a["label"][idx] = 0
        if "cluster" in a:
            a["cluster"][idx] = 0
        if self._items_garbage > max(len(self._items) // 2, 1 << 16):
            self.compact_items()
        if self._rids_garbage > max(len(self._rids) // 2, 1 << 16):
            self.compact_rids()
        a["head"][idx] = 0
        a["offset"][idx] = 0
        if self.keys is not None:
            self.keys.release(idx)
        self._free.extend(slots)

    def compact_items(self) -> None:
        """Rewrite the item arena with only the live slots' items."""
        kept, new_start = self._compact(np.frombuffer(self._items, np.int64), "start", "length")
        self._items = array("q")
        self._items.frombytes(kept)
        self._arrays["start"][self.live_slots()] = new_start
        self._items_garbage = 0

    def compact_rids(self) -> None:
        """Rewrite the request-id arena with only the live slots' ids."""
        kept, new_start = self._compact(np.frombuffer(self._rids, np.uint8), "rid_start", "rid_len")
        self._rids = bytearray(kept)
        self._arrays["rid_start"][self.live_slots()] = new_start
        self._rids_garbage = 0

    def _compact(self, view: np.ndarray, start: str, length: str) -> tuple[bytes, np.ndarray]:
        """(live spans of ``view`` back to back, their new starts in live-slot order)."""
        slots = self.live_slots()
        starts, lens = self._arrays[start][slots], self._arrays[length][slots].astype(np.int64)
        new_start = np.zeros(len(slots), np.int64)
        if len(slots):
            np.cumsum(lens[:-1], out=new_start[1:])
        src = np.repeat(starts - new_start, lens) + np.arange(int(lens.sum()))
        kept = view[src].tobytes()
        del view
        return kept, new_start
