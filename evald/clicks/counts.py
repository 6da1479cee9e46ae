"""RankCounts: weighted impressions and clicks per (pair, segment, rank).

These are the sufficient statistics of the position-based model and of COEC: the likelihood of
every session depends on the data only through how often each pair was shown at each rank of
each segment and how often it was clicked there. So an EM over these rows *is* the batch EM over
the sessions they came from, adding two tables is the table of the union (what makes a partition
mergeable), and memory is bounded by the pairs kept times the (segment, rank) cells each was
shown in. Rows are appended in order of first appearance and never reordered except to drop the
rows of evicted pairs, so sums over them come out the same way in every replay.
"""

from __future__ import annotations

import numpy as np

from evald.clicks.keyindex import KeyIndex, first_appearances

_RANK_BITS = 8
_SEGMENT_BITS = 24
_COLUMNS = ("slot", "segment", "rank", "n", "c")


class RankCounts:
    """Rows (slot, segment, rank) with weighted impressions ``n`` and clicks ``c``."""

    def __init__(self) -> None:
        self._index = KeyIndex()
        self.slot = np.zeros(0, np.int64)
        self.segment = np.zeros(0, np.int64)
        self.rank = np.zeros(0, np.int64)
        self.n = np.zeros(0, np.float64)
        self.c = np.zeros(0, np.float64)
        self._used = 0
        #: changes whenever a row is added, scaled or dropped: what a fit derived from the
        #: rows (e.g. PBM's per-refit denominators) is still valid for while it is the same
        self.version = 0

    def __len__(self) -> int:
        return self._used

    def add_cells(
        self,
        cells: np.ndarray,
        slots: np.ndarray,
        segments: np.ndarray,
        clicks: np.ndarray,
        weights: np.ndarray,
    ) -> None:
        """``add`` the (list, rank) cells in the bool mask ``cells``: each is one impression of
        its slot at its rank, weighted by its list's weight (``weights``, one per list, as
        ``segments``), and a click where ``clicks`` says so; cells in row-major order."""
        lists, ranks = np.nonzero(cells)
        w = weights[lists]
        self.add(slots[cells], segments[lists], ranks, w, w * clicks[cells])

    def add(
        self,
        slots: np.ndarray,
        segments: np.ndarray,
        ranks: np.ndarray,
        n: np.ndarray,
        c: np.ndarray,
    ) -> None:
        """Add ``n`` impressions and ``c`` clicks (weighted) to the row of each element (flat
        arrays of one length); new rows in order of first appearance."""
        if segments.size and int(segments.max()) >= 1 << _SEGMENT_BITS:
            raise ValueError("too many segments for a rank-count row key")
        keys = _key(slots.astype(np.int64), segments.astype(np.int64), ranks.astype(np.int64))
        rows, ends = self._index.probe(keys)
        cells = np.flatnonzero(rows < 0)
        if len(cells):
            fresh, which, first = first_appearances(keys[cells])
            new = self._append(fresh)
            self._index.add(fresh, new, ends[cells[first]])  # placed where their probe ended
            rows[cells] = new[which]
        np.add.at(self.n, rows, n.astype(np.float64))
        np.add.at(self.c, rows, c.astype(np.float64))
        self.version += 1

    def _append(self, keys: np.ndarray) -> np.ndarray:
        start, count = self._used, len(keys)
        if start + count > len(self.n):
            size = max(64, 2 * len(self.n), start + count)
            for name in _COLUMNS:
                old = getattr(self, name)
                new = np.zeros(size, old.dtype)
                new[:start] = old[:start]
                setattr(self, name, new)
        rows = np.arange(start, start + count)
        self.slot[rows] = keys >> (_SEGMENT_BITS + _RANK_BITS)
        self.segment[rows] = (keys >> _RANK_BITS) & ((1 << _SEGMENT_BITS) - 1)
        self.rank[rows] = keys & ((1 << _RANK_BITS) - 1)
        self._used += count
        return rows

    def view(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(slot, segment, rank, n, c) of the used rows, in row order (views, not copies)."""
        u = self._used
        return self.slot[:u], self.segment[:u], self.rank[:u], self.n[:u], self.c[:u]

    def drop_slots(self, slots: np.ndarray) -> None:
        """Remove every row of ``slots`` (evicted pairs); the others keep their order."""
        if not len(slots) or not self._used:
            return
        slot = self.slot[: self._used]
        dropped = np.zeros(max(int(slot.max()), int(np.max(slots))) + 1, bool)
        dropped[slots] = True  # a mask by slot: a gather where ``isin`` sorts
        keep = ~dropped[slot]
        u = self._used
        for name in _COLUMNS:  # the rows kept, in their order
            setattr(self, name, getattr(self, name)[:u][keep])
        self._used = len(self.slot)
        renumber = np.cumsum(keep) - 1
        renumber[~keep] = -1
        self._index.remap(renumber)
        self.version += 1

    def scale(self, factor: float) -> None:
        if factor != 1.0:
            self.n *= factor
            self.c *= factor
            self.version += 1

    def _load(
        self, slot: np.ndarray, segment: np.ndarray, rank: np.ndarray, n: np.ndarray, c: np.ndarray
    ) -> None:
        self.slot, self.segment, self.rank = (a.astype(np.int64) for a in (slot, segment, rank))
        self.n, self.c = n.astype(np.float64), c.astype(np.float64)
        self._used = len(slot)
        self._index.rebuild(_key(self.slot, self.segment, self.rank), np.arange(self._used))
        self.version += 1

    # ------------------------------------------------------------------ state

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The rows as named arrays: (slot, segment, rank) packed in one int64 key per row (a
        third of the bytes a checkpoint of ``evald run`` compresses), ``n`` and ``c``."""
        slot, segment, rank, n, c = self.view()
        return {
            f"{prefix}_key": _key(slot, segment, rank),
            f"{prefix}_n": n.copy(),
            f"{prefix}_c": c.copy(),
        }

    @classmethod
    def build(cls, prefix: str, arrays: dict[str, np.ndarray]) -> RankCounts:
        counts = cls()
        key = arrays[f"{prefix}_key"].astype(np.int64)
        slot = key >> (_SEGMENT_BITS + _RANK_BITS)
        segment = (key >> _RANK_BITS) & ((1 << _SEGMENT_BITS) - 1)
        rank = key & ((1 << _RANK_BITS) - 1)
        counts._load(slot, segment, rank, arrays[f"{prefix}_n"], arrays[f"{prefix}_c"])
        return counts


def _key(slot: np.ndarray, segment: np.ndarray, rank: np.ndarray) -> np.ndarray:
    return (slot << (_SEGMENT_BITS + _RANK_BITS)) | (segment << _RANK_BITS) | rank
