"""PairTable: the (query, item) pairs a model keeps parameters for, at most ``cap`` of them.

Each kept pair has a slot (an index into the model's per-pair arrays) and a weight: its
impressions under the horizon's decay. When more than ``cap`` pairs are kept, the table drops
the lightest down to ``cap - cap // 16`` (so a full table does not evict on every new pair);
among equal weights the pair that came first goes first. A dropped pair is cold again: the model
answers its prior for it until it is seen anew. Which pairs are kept and which slot each gets
depend only on the sessions and their order, never on key values, so a replay always keeps the
same ones in the same slots.
"""

from __future__ import annotations

import numpy as np

from evald.clicks.keyindex import KeyIndex, first_appearance

#: a table drops this share of its cap at once when it overflows (cap // EVICT_SHARE pairs)
EVICT_SHARE = 16


class PairTable:
    """Pair key -> slot, with per-slot weights; free slots are reused smallest first."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError("cap must be >= 1")
        self.cap = cap
        self._index = KeyIndex()
        self.keys = np.zeros(0, np.int64)  # per slot (0 when free)
        self.born = np.zeros(0, np.int64)  # insertion sequence number per slot (-1: free)
        self.weight = np.zeros(0, np.float64)
        self._free = np.zeros(0, np.int64)  # free slots, ascending
        self._next_born = 0

    def __len__(self) -> int:
        return len(self._index)

    @property
    def size(self) -> int:
        """Slots allocated (used or free): the length of every per-slot array."""
        return len(self.keys)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """intp slots of ``keys`` (any shape), -1 where the pair is not kept."""
        return self._index.find(keys.reshape(-1)).astype(np.intp).reshape(keys.shape)

    def insert(self, keys: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Give the elements of ``keys`` (1-D) whose ``slots`` are -1 a slot, new pairs in order
        of first appearance; returns the completed slots. The table may then hold more than
        ``cap`` pairs until ``evict`` runs."""
        out = slots.copy()
        cells = np.flatnonzero(out < 0)
        if not len(cells):
            return out
        fresh, which = first_appearance(keys[cells])
        new = self._take(len(fresh))
        self.keys[new] = fresh
        self.born[new] = np.arange(self._next_born, self._next_born + len(fresh))
        self._next_born += len(fresh)
        self._index.add(fresh, new)
        out[cells] = new[which]
        return out

    def _take(self, count: int) -> np.ndarray:
        """``count`` free slots, smallest first, growing the arrays when too few are free."""
        if len(self._free) < count:
            old = len(self.keys)
            size = max(16, 2 * old, old + count - len(self._free))
            self.keys = _grow(self.keys, size, 0)
            self.born = _grow(self.born, size, -1)
            self.weight = _grow(self.weight, size, 0.0)
            self._free = np.concatenate([self._free, np.arange(old, size, dtype=np.int64)])
        taken, self._free = self._free[:count], self._free[count:]
        return taken.astype(np.intp)

    def evict(self) -> np.ndarray:
        """Drop the lightest pairs when more than ``cap`` are kept; returns the freed slots,
        ascending (the caller clears their statistics)."""
        used = len(self._index)
        if used <= self.cap:
            return np.zeros(0, np.intp)
        live = self.live()
        order = np.lexsort((self.born[live], self.weight[live]))
        drop = np.sort(live[order[: used - (self.cap - self.cap // EVICT_SHARE)]])
        self.keys[drop] = 0
        self.born[drop] = -1
        self.weight[drop] = 0.0
        self._free = np.sort(np.concatenate([self._free, drop]))  # disjoint: free and used
        renumber = np.arange(len(self.keys))
        renumber[drop] = -1
        self._index.remap(renumber)  # the pairs kept keep their slots
        return drop

    def scale(self, factor: float) -> None:
        if factor != 1.0:
            self.weight *= factor

    def live(self) -> np.ndarray:
        """The used slots, ascending."""
        return np.flatnonzero(self.born >= 0)

    # ------------------------------------------------------------------ state

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "pair_keys": self.keys.copy(),
            "pair_born": self.born.copy(),
            "pair_weight": self.weight.copy(),
            "pair_free": self._free.copy(),
        }

    def meta(self) -> dict[str, int]:
        return {"cap": self.cap, "next_born": self._next_born}

    @classmethod
    def build(cls, meta: dict[str, int], arrays: dict[str, np.ndarray]) -> PairTable:
        table = cls(int(meta["cap"]))
        table.keys = arrays["pair_keys"].astype(np.int64)
        table.born = arrays["pair_born"].astype(np.int64)
        table.weight = arrays["pair_weight"].astype(np.float64)
        table._free = arrays["pair_free"].astype(np.int64)
        table._next_born = int(meta["next_born"])
        live = table.live()
        if len(np.unique(table.keys[live])) != len(live):
            raise ValueError("pair table: a key is kept twice")
        table._index.rebuild(table.keys[live], live)
        return table


def _grow(array: np.ndarray, size: int, fill: float) -> np.ndarray:
    out = np.full(size, fill, array.dtype)
    out[: len(array)] = array
    return out
