"""The request-id table: 64-bit request-id key -> pending slot, in two numpy arrays."""

from __future__ import annotations

import numpy as np

NONE = -1  # "no slot"
_EMPTY, _TOMB = 0, 1  # reserved keys


class RidTable:
    """request-id hash -> slot; open addressing with linear probing over two numpy arrays.

    Keys are ``hash(request_id)``; the two the table reserves (0, 1) are stored shifted by 2.

    12 bytes a bucket at most 60% full, instead of a dict entry plus a string and an int
    object per pending impression. Two ids with the same 64-bit hash would be taken for one
    (probability ~n^2 / 2^65).
    """

    def __init__(self, capacity: int = 1 << 12) -> None:
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        self._keys = np.zeros(capacity, np.int64)
        self._vals = np.zeros(capacity, np.int32)
        # memoryviews: scalar access from Python is ~2x cheaper than numpy indexing
        self._k, self._v = self._keys.data, self._vals.data
        self._mask = capacity - 1
        self._live = 0
        self._used = 0  # live + tombstones

    def __len__(self) -> int:
        return self._live

    def get(self, key: int) -> int:
        """Slot of ``key`` or -1."""
        if 0 <= key <= 1:
            key += 2
        keys = self._k
        mask = self._mask
        i = key & mask
        while True:
            k = keys[i]
            if k == key:
                return self._v[i]
            if k == _EMPTY:
                return NONE
            i = (i + 1) & mask

    def insert(self, key: int, slot: int) -> int:
        """Add ``key`` -> ``slot`` unless ``key`` is present; returns the present slot or -1.

        One probe run serves both the duplicate check and the insertion.
        """
        if 0 <= key <= 1:
            key += 2
        if (self._used + 1) * 5 > (self._mask + 1) * 3:
            self._rebuild()
        keys = self._k
        mask = self._mask
        i = key & mask
        free = -1
        while True:
            k = keys[i]
            if k == key:
                return self._v[i]
            if k == _EMPTY:
                break
            if k == _TOMB and free < 0:
                free = i
            i = (i + 1) & mask
        if free < 0:
            free = i
            self._used += 1
        keys[free] = key
        self._v[free] = slot
        self._live += 1
        return NONE

    def clear(self) -> None:
        """Remove every key, keeping the capacity."""
        self._keys.fill(_EMPTY)
        self._live = self._used = 0

    def remove(self, key: int) -> None:
        """Remove a key known to be present (leaves a tombstone)."""
        if 0 <= key <= 1:
            key += 2
        keys = self._k
        mask = self._mask
        i = key & mask
        while keys[i] != key:
            i = (i + 1) & mask
        keys[i] = _TOMB
        self._live -= 1

    def _rebuild(self) -> None:
        """Drop tombstones, growing so the table is at most 30% full afterwards (it is
        rebuilt at 60% including tombstones: short probe runs, 12-40 bytes per live id)."""
        live = (self._keys != _EMPTY) & (self._keys != _TOMB)
        keys, vals = self._keys[live], self._vals[live]
        capacity = self._mask + 1
        while len(keys) * 10 > capacity * 3:
            capacity *= 2
        self._alloc(capacity)
        pos = keys & self._mask
        todo = np.arange(len(keys))
        while len(todo):  # vectorised linear probing, one probe step per round
            p = pos[todo]
            free = self._keys[p] == _EMPTY
            cand, where = todo[free], p[free]
            where, first = np.unique(where, return_index=True)
            won = cand[first]
            self._keys[where] = keys[won]
            self._vals[where] = vals[won]
            placed = np.zeros(len(keys), np.bool_)
            placed[won] = True
            todo = todo[~placed[todo]]
            pos[todo] = (pos[todo] + 1) & self._mask
        self._live = self._used = len(keys)
