"""Summary: the heavy hitters of one stream of queries, with each one's measure sums.

A weighted Misra–Gries summary (Misra & Gries 1982) in the mergeable form of Agarwal et al.
("Mergeable summaries", PODS 2012). Each held query has a counter, the lists ``seen`` since it
was (last) taken in, and per measure the sum and the number of finite values over those lists.
When a new query makes more than ``2 * capacity`` held, the (capacity+1)-th largest counter
``c`` is subtracted from every counter, the queries left at zero or below are forgotten, and
``offset`` adds ``c``.

The bounds (docs/drilldown.md, "Error bound"), for a query with ``true`` lists among ``N``
(the summary's ``total``):

* ``seen <= true <= counter + offset``: the report's ``lists`` and ``lists_upper``;
* ``offset <= N / (capacity + 1)``: each purge takes ``c`` from at least ``capacity + 1``
  counters, and no more than ``N`` can ever be taken;
* so every query with more than ``N / (capacity + 1)`` lists is held.

Merging adds counters, ``seen``, sums and offsets query by query; the bounds hold for the
merged summary with the merged ``N``. Everything is a function of the sequence of additions
only, never of how it was cut into batches: ``add`` purges exactly where adding one list at a
time would, and float sums are added one value at a time in order (``np.add.at``), so a summary
rebuilt from a snapshot plus the later results equals the uninterrupted one bit for bit.

Why not Apache DataSketches' frequent-items sketch (the well-kept library for the counts): it
keeps one integer weight per item, and the drill-down needs per query a count *and* a float sum
per measure (means, a drop's contributions), which it cannot carry; its purge is the same
reverse purge, so the bounds are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["Entry", "Summary"]


@lru_cache(maxsize=32)
def _cells(rows: int, width: int) -> np.ndarray:
    """The flat index of every cell of a (rows, width) table, by row (a table has few sizes)."""
    cells = np.arange(rows * width).reshape(rows, width)
    cells.flags.writeable = False
    return cells


@dataclass(frozen=True, slots=True)
class Entry:
    """One held query: its lists (lower and upper bound of the exact count) and, per measure,
    the sum and the number of finite values over the ``lists`` it was seen in."""

    query: str
    lists: int
    lists_upper: int
    sums: np.ndarray  # float64 (measures,)
    finite: np.ndarray  # int64 (measures,)

    def mean(self, measure: int) -> float:
        """Mean of measure ``measure`` over the lists seen (NaN: none finite)."""
        n = int(self.finite[measure])
        return float(self.sums[measure]) / n if n else float("nan")


class Summary:
    """Heavy hitters of one stream: at most ``2 * capacity`` queries held, ``capacity`` after a
    purge; the table grows by doubling up to that, so memory is fixed by ``capacity``.

    One float64 table holds a row per query: its counter, ``seen``, the measure sums and the
    finite counts (the snapshot's layout; the integers are exact far beyond any count), so
    adding a batch is one ``np.add.at`` and a purge one compaction."""

    __slots__ = ("_forgotten", "_keys", "_rows", "_table", "capacity", "offset")

    def __init__(self, capacity: int, measures: int) -> None:
        self.capacity = capacity
        self._rows: dict[str, int] = {}
        self._keys: list[str] = []
        self._table = np.zeros((min(8, 2 * capacity + 1), 2 + 2 * measures))
        #: the sum of every purge's subtraction: the counters' largest possible shortfall
        self.offset = 0
        #: the lists seen of the queries purges forgot (so ``total`` stays exact)
        self._forgotten = 0

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def measures(self) -> int:
        return (self._table.shape[1] - 2) // 2

    @property
    def _counts(self) -> np.ndarray:
        """The counters of every row the table holds (a view)."""
        return self._table[:, 0]

    @property
    def total(self) -> int:
        """Lists added in all (N): held counters plus everything purges took, exact."""
        return int(self._table[: len(self._keys), 1].sum()) + self._forgotten

    # ---------------------------------------------------------------- writing

    @staticmethod
    def rows(values: np.ndarray, finite: np.ndarray) -> np.ndarray:
        """The table rows ``add_rows`` takes for lists with ``values`` (n, measures; 0 where
        not ``finite``): a counter and ``seen`` of 1, the values, the finite flags."""
        n, m = values.shape
        out = np.empty((n, 2 + 2 * m))
        out[:, :2] = 1.0
        out[:, 2 : 2 + m] = values
        out[:, 2 + m :] = finite
        return out

    def add(self, queries: Sequence[str], values: np.ndarray, finite: np.ndarray) -> None:
        """Add one list per query (``values``: (n, measures), 0 where not ``finite``), as if one
        at a time: a query that makes more than ``2 * capacity`` held purges right after it."""
        self.add_rows(queries, self.rows(values, finite))

    def add_rows(self, queries: Sequence[str], rows: np.ndarray) -> None:
        """``add`` of the lists whose :meth:`rows` are ``rows``: the rows of a batch's queries
        found in order (a plain loop: cheaper than any numpy call at a batch's few dozen), then
        added at once, up to each purge."""
        held, keys = self._rows, self._keys
        limit, lo = 2 * self.capacity, 0
        idx: list[int] = []
        for pos, query in enumerate(queries):
            row = held.get(query)
            if row is None:
                row = held[query] = len(keys)
                keys.append(query)
                if row >= limit:
                    idx.append(row)
                    self._apply(idx, rows[lo : pos + 1])
                    self.purge()
                    idx, lo = [], pos + 1
                    continue
            idx.append(row)
        if idx:
            self._apply(idx, rows[lo:])

    def _apply(self, idx: list[int], rows: np.ndarray) -> None:
        self._fit(len(self._keys))
        # one row at a time, in order: the float sums are exact across batchings. On the flat
        # table: numpy's one-dimensional ``at`` is several times cheaper than the
        # two-dimensional one, with the same additions in the same order
        table = self._table
        cells = _cells(*table.shape)[idx].reshape(-1)
        np.add.at(table.reshape(-1), cells, rows.reshape(-1))

    def _fit(self, rows: int) -> None:
        """Room for ``rows`` rows: doubling, up to ``2 * capacity + 1``, or more for a summary
        that holds more (merged from two on a restore that folds segments into one)."""
        size = len(self._table)
        if rows > size:
            self._grow(max(rows, min(2 * size, 2 * self.capacity + 1)) - size)

    def _grow(self, extra: int) -> None:
        self._table = np.concatenate([self._table, np.zeros((extra, self._table.shape[1]))])

    def purge(self) -> None:
        """Subtract the (capacity+1)-th largest counter from every counter and forget the
        queries at zero or below (at most ``capacity`` are left), keeping the others' order.
        Chosen in plain Python: at ``2 * capacity`` rows, cheaper than numpy's calls."""
        keys, n, k = self._keys, len(self._keys), self.capacity
        if n <= k:
            return
        table = self._table
        counts = table[:n, 0].tolist()
        cut = sorted(counts)[n - k - 1]
        self.offset += int(cut)
        keep = [i for i, count in enumerate(counts) if count > cut]
        seen = table[:n, 1].tolist()
        self._forgotten += int(sum(seen) - sum([seen[i] for i in keep]))  # integers: exact
        m = len(keep)
        table[:m] = table[keep]
        table[:m, 0] -= cut
        table[m:n] = 0.0
        # in place: ``add_rows`` holds both while it purges
        keys[:] = [keys[i] for i in keep]
        self._rows.clear()
        self._rows.update(zip(keys, range(m), strict=True))

    def merge(self, other: Summary) -> None:
        """Add ``other`` (same measures) query by query, in its order, without a purge: the
        held queries are the union, the offsets add (the bounds hold for both streams)."""
        if other.measures != self.measures:
            raise ValueError("summaries of different measures do not merge")
        self.offset += other.offset
        self._forgotten += other._forgotten
        self._merge_rows(other._keys, other._table[: len(other._keys)])

    def _merge_rows(self, keys: list[str], table: np.ndarray) -> None:
        rows = self._rows
        idx = np.empty(len(keys), np.intp)
        for i, key in enumerate(keys):
            row = rows.get(key)
            if row is None:
                row = rows[key] = len(self._keys)
                self._keys.append(key)
            idx[i] = row
        # a merged summary holds the union of its parts (for reading only)
        self._grow(max(len(self._keys) - len(self._table), 0))
        self._table[idx] += table

    # ---------------------------------------------------------------- reading

    def entry(self, query: str) -> Entry | None:
        row = self._rows.get(query)
        return None if row is None else self._entry(row)

    def _entry(self, row: int) -> Entry:
        m, values = self.measures, self._table[row]
        return Entry(
            self._keys[row],
            int(values[1]),
            int(values[0]) + self.offset,
            values[2 : 2 + m].copy(),
            values[2 + m :].astype(np.int64),
        )

    def entries(self) -> list[Entry]:
        """Every held query, most lists seen first (ties: by query text)."""
        seen, keys = self._table[: len(self._keys), 1].tolist(), self._keys
        order = sorted(range(len(keys)), key=lambda r: (-seen[r], keys[r]))
        return [self._entry(r) for r in order]

    # ---------------------------------------------------------------- snapshots

    def to_arrays(self) -> tuple[list[str], np.ndarray, list[int]]:
        """(queries in row order, float64 (rows, 2 + 2 * measures) of counter, seen, sums and
        finite counts, [offset, forgotten]): exact (the integers are far below 2**53)."""
        n = len(self._keys)
        return list(self._keys), self._table[:n].copy(), [self.offset, self._forgotten]

    @classmethod
    def from_arrays(
        cls, capacity: int, keys: list[str], table: np.ndarray, scalars: Sequence[int]
    ) -> Summary:
        """The summary ``to_arrays`` described (ValueError when the parts disagree); the
        counts are taken as integers (truncated), as they were written."""
        measures = (table.shape[1] - 2) // 2
        if table.ndim != 2 or table.shape != (len(keys), 2 + 2 * measures):
            raise ValueError("summary table does not match its queries")
        if len(set(keys)) != len(keys) or len(keys) > 2 * capacity:
            raise ValueError("summary queries repeat or exceed the capacity")
        out = cls(capacity, measures)
        out._fit(len(keys))
        n = len(keys)
        out._keys = list(keys)
        out._rows = {key: i for i, key in enumerate(keys)}
        counts = np.r_[0:2, 2 + measures : 2 + 2 * measures]
        out._table[:n] = table
        out._table[:n, counts] = table[:, counts].astype(np.int64)
        out.offset, out._forgotten = int(scalars[0]), int(scalars[1])
        return out
