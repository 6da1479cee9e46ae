"""KeyIndex: int64 key -> int64 value, open addressing in numpy, looked up a batch at a time.

The click models map every (query, item) pair and every (pair, segment, rank) cell of a batch
of lists to a row of their statistics. A dict costs a Python call per cell (about 10 cells per
list); here a batch is probed in a few vectorised rounds (linear probing, at most half full, so
most keys are found in the first round). Keys are spread by a multiplicative hash first:
structured keys (a slot in the high bits, a rank in the low ones) would otherwise cluster.
Models evict in bulk, and an eviction renumbers the entries kept (``remap``): one pass over the
buckets, where removed entries leave a tombstone (a probe walks past it, an insert may reuse
it) instead of the table being rebuilt from the entries kept; tombstones count towards the
load, and an insert that would fill the table past half rebuilds it without them.
"""

from __future__ import annotations

import numpy as np

#: keys left of a batch below which ``find`` and ``_place`` probe one key at a time
TAIL = 24
#: a bucket's value when it never held an entry (a probe stops there), and when its entry
#: was removed (a probe walks on); values >= 0 are entries
EMPTY = -1
TOMB = np.iinfo(np.int64).min
#: Knuth's multiplicative constant for 64 bits (odd), as uint64
_SPREAD = np.uint64(0x9E3779B97F4A7C15)


class KeyIndex:
    """A set of distinct int64 keys, each with an int64 value >= 0."""

    def __init__(self, capacity: int = 64) -> None:
        self._alloc(max(64, 1 << int(capacity - 1).bit_length()))
        self._live = 0

    def _alloc(self, capacity: int) -> None:
        self._keys = np.zeros(capacity, np.int64)
        self._vals = np.full(capacity, -1, np.int64)
        self._shift = np.uint64(64 - (capacity.bit_length() - 1))
        self._mask = capacity - 1
        self._dead = 0  # tombstones (at most: one reused by an insert still counts)

    def __len__(self) -> int:
        return self._live

    def _home(self, keys: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return ((keys.astype(np.uint64) * _SPREAD) >> self._shift).astype(np.intp)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """int64 values of ``keys`` (1-D), -1 where a key is absent."""
        return self.probe(keys)[0]

    def probe(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(``find``'s values, the bucket where each absent key's probe ended): an empty
        bucket, where ``add`` may start placing it while the index is unchanged."""
        out = np.full(len(keys), -1, np.int64)
        todo = np.arange(len(keys))
        pos = self._home(keys)
        while len(todo) > TAIL:
            p = pos[todo]
            vals = self._vals[p]
            hit = (self._keys[p] == keys[todo]) & (vals >= 0)
            out[todo[hit]] = vals[hit]
            todo = todo[(vals != EMPTY) & ~hit]
            pos[todo] = (pos[todo] + 1) & self._mask
        if len(todo):
            self._find_tail(keys, todo, pos, out)
        return out, pos

    def _find_tail(
        self, keys: np.ndarray, todo: np.ndarray, pos: np.ndarray, out: np.ndarray
    ) -> None:
        """The last few keys of ``find``, probed one by one: a vectorised round costs the
        same for 3 keys as for 300, and the longest probe sets how many rounds run."""
        table, vals, mask = self._keys, self._vals, self._mask
        for i, key, p in zip(todo.tolist(), keys[todo].tolist(), pos[todo].tolist(), strict=True):
            while True:
                value = int(vals[p])
                if value == EMPTY:
                    pos[i] = p
                    break
                if value >= 0 and int(table[p]) == key:
                    out[i] = value
                    break
                p = (p + 1) & mask

    def add(self, keys: np.ndarray, values: np.ndarray, ends: np.ndarray | None = None) -> None:
        """Add distinct keys known to be absent, each with its value (>= 0); ``ends``: where
        their ``probe`` ended, if the index did not change since (a probe from there on is
        the rest of the one from their home bucket)."""
        if (self._live + self._dead + len(keys)) * 2 > self._mask + 1:
            self._regrow(self._live + len(keys))
            ends = None
        self._place(keys.astype(np.int64), values.astype(np.int64), ends)
        self._live += len(keys)

    def remap(self, values: np.ndarray) -> None:
        """Give each entry the value ``values[its value]``, and remove those where that is
        -1 (an eviction: the rows kept renumbered in one pass, the rest left as tombstones)."""
        vals = self._vals
        where = np.flatnonzero(vals >= 0)
        new = values[vals[where]]
        gone = new < 0
        vals[where] = np.where(gone, TOMB, new)
        removed = int(gone.sum())
        self._live -= removed
        self._dead += removed

    def _place(self, keys: np.ndarray, values: np.ndarray, ends: np.ndarray | None = None) -> None:
        pos = self._home(keys) if ends is None else ends.astype(np.intp)
        todo = np.arange(len(keys))
        vals = self._vals
        while len(todo) > TAIL:  # one probe step per round; a free bucket goes to one claimant
            p = pos[todo]
            free = vals[p] < 0
            claims, where = todo[free], p[free]
            vals[where] = -2 - claims  # each claimant marks its bucket; one mark stays
            kept = vals[where] == -2 - claims
            won, where = claims[kept], where[kept]
            self._keys[where] = keys[won]
            vals[where] = values[won]
            placed = np.zeros(len(keys), bool)
            placed[won] = True
            todo = todo[~placed[todo]]
            pos[todo] = (pos[todo] + 1) & self._mask
        table, mask = self._keys, self._mask
        for i, p in zip(todo.tolist(), pos[todo].tolist(), strict=True):  # the last few alone
            while vals[p] >= 0:
                p = (p + 1) & mask
            table[p] = keys[i]
            vals[p] = values[i]

    def _regrow(self, size: int) -> None:
        live = self._vals >= 0
        keys, vals = self._keys[live], self._vals[live]
        capacity = self._mask + 1
        while size * 2 > capacity:
            capacity *= 2
        self._alloc(capacity)
        self._place(keys, vals)

    def rebuild(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Replace every entry by ``keys`` -> ``values`` (distinct keys)."""
        capacity = 64
        while len(keys) * 2 > capacity:
            capacity *= 2
        self._alloc(capacity)
        self._place(keys.astype(np.int64), values.astype(np.int64))
        self._live = len(keys)


def first_appearance(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct ``keys`` in order of first appearance, each element's index in it)."""
    distinct, position, _ = first_appearances(keys)
    return distinct, position


def first_appearances(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``first_appearance``, and the index in ``keys`` of each distinct key's first."""
    distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    position = np.empty(len(order), np.intp)
    position[order] = np.arange(len(order))
    return distinct[order], position[inverse.reshape(-1)], first[order]
