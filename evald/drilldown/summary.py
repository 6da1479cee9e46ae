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

import numpy as np

__all__ = ["Entry", "Summary"]


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
    purge; arrays grow by doubling up to that, so memory is fixed by ``capacity``."""

    __slots__ = (
        "_counts",
        "_finite",
        "_forgotten",
        "_keys",
        "_rows",
        "_seen",
        "_sums",
        "capacity",
        "offset",
    )

    def __init__(self, capacity: int, measures: int) -> None:
        self.capacity = capacity
        self._rows: dict[str, int] = {}
        self._keys: list[str] = []
        size = min(8, 2 * capacity + 1)
        self._counts = np.zeros(size, np.int64)
        self._seen = np.zeros(size, np.int64)
        self._sums = np.zeros((size, measures))
        self._finite = np.zeros((size, measures), np.int64)
        #: the sum of every purge's subtraction: the counters' largest possible shortfall
        self.offset = 0
        #: the lists seen of the queries purges forgot (so ``total`` stays exact)
        self._forgotten = 0

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def measures(self) -> int:
        return int(self._sums.shape[1])

    @property
    def total(self) -> int:
        """Lists added in all (N): held counters plus everything purges took, exact."""
        return int(self._seen[: len(self._keys)].sum()) + self._forgotten

    # ---------------------------------------------------------------- writing

    def add(self, queries: Sequence[str], values: np.ndarray, finite: np.ndarray) -> None:
        """Add one list per query (``values``: (n, measures), 0 where not ``finite``), as if one
        at a time: a query that makes more than ``2 * capacity`` held purges right after it."""
        rows, keys = self._rows, self._keys
        limit = 2 * self.capacity
        idx = np.empty(len(queries), np.intp)
        lo = 0
        for pos, query in enumerate(queries):
            row = rows.get(query)
            if row is None:
                row = rows[query] = len(keys)
                keys.append(query)
                if row >= limit:
                    idx[pos] = row
                    self._apply(idx[lo : pos + 1], values[lo : pos + 1], finite[lo : pos + 1])
                    self.purge()
                    lo = pos + 1
                    continue
            idx[pos] = row
        if lo < len(queries):
            self._apply(idx[lo:], values[lo:], finite[lo:])

    def _apply(self, idx: np.ndarray, values: np.ndarray, finite: np.ndarray) -> None:
        self._fit(len(self._keys))
        size = len(self._counts)
        hits = np.bincount(idx, minlength=size)
        self._counts += hits
        self._seen += hits
        np.add.at(self._sums, idx, values)  # one value at a time, in order: exact across batchings
        np.add.at(self._finite, idx, finite.astype(np.int64))

    def _fit(self, rows: int) -> None:
        size = len(self._counts)
        if rows <= size:
            return
        new = min(max(rows, 2 * size), 2 * self.capacity + 1)
        grow = new - size
        self._counts = np.concatenate([self._counts, np.zeros(grow, np.int64)])
        self._seen = np.concatenate([self._seen, np.zeros(grow, np.int64)])
        self._sums = np.concatenate([self._sums, np.zeros((grow, self.measures))])
        self._finite = np.concatenate([self._finite, np.zeros((grow, self.measures), np.int64)])

    def purge(self) -> None:
        """Subtract the (capacity+1)-th largest counter from every counter and forget the
        queries at zero or below (at most ``capacity`` are left), keeping the others' order."""
        n, k = len(self._keys), self.capacity
        if n <= k:
            return
        counts = self._counts[:n]
        cut = int(np.partition(counts, n - k - 1)[n - k - 1])
        self.offset += cut
        keep = np.flatnonzero(counts > cut)
        gone = np.flatnonzero(counts <= cut)
        self._forgotten += int(self._seen[gone].sum())
        m = len(keep)
        self._counts[:m] = counts[keep] - cut
        self._seen[:m] = self._seen[keep]
        self._sums[:m] = self._sums[keep]
        self._finite[:m] = self._finite[keep]
        for arr in (self._counts, self._seen, self._sums, self._finite):
            arr[m:] = 0
        # in place: ``add`` holds both while it purges
        self._keys[:] = [self._keys[i] for i in keep.tolist()]
        self._rows.clear()
        self._rows.update((key, i) for i, key in enumerate(self._keys))

    def merge(self, other: Summary) -> None:
        """Add ``other`` (same measures) query by query, in its order, without a purge: the
        held queries are the union, the offsets add (the bounds hold for both streams)."""
        if other.measures != self.measures:
            raise ValueError("summaries of different measures do not merge")
        self.offset += other.offset
        self._forgotten += other._forgotten
        n = len(other._keys)
        self._merge_rows(
            other._keys, other._counts[:n], other._seen[:n], other._sums[:n], other._finite[:n]
        )

    def _merge_rows(
        self,
        keys: list[str],
        counts: np.ndarray,
        seen: np.ndarray,
        sums: np.ndarray,
        finite: np.ndarray,
    ) -> None:
        rows = self._rows
        idx = np.empty(len(keys), np.intp)
        for i, key in enumerate(keys):
            row = rows.get(key)
            if row is None:
                row = rows[key] = len(self._keys)
                self._keys.append(key)
            idx[i] = row
        self._fit_unbounded(len(self._keys))
        self._counts[idx] += counts
        self._seen[idx] += seen
        self._sums[idx] += sums
        self._finite[idx] += finite

    def _fit_unbounded(self, rows: int) -> None:
        """A merged summary holds the union of its parts (for reading only)."""
        grow = rows - len(self._counts)
        if grow > 0:
            self._counts = np.concatenate([self._counts, np.zeros(grow, np.int64)])
            self._seen = np.concatenate([self._seen, np.zeros(grow, np.int64)])
            self._sums = np.concatenate([self._sums, np.zeros((grow, self.measures))])
            self._finite = np.concatenate([self._finite, np.zeros((grow, self.measures), np.int64)])

    # ---------------------------------------------------------------- reading

    def entry(self, query: str) -> Entry | None:
        row = self._rows.get(query)
        return None if row is None else self._entry(row)

    def _entry(self, row: int) -> Entry:
        return Entry(
            self._keys[row],
            int(self._seen[row]),
            int(self._counts[row]) + self.offset,
            self._sums[row].copy(),
            self._finite[row].copy(),
        )

    def entries(self) -> list[Entry]:
        """Every held query, most lists seen first (ties: by query text)."""
        n = len(self._keys)
        order = sorted(range(n), key=lambda r: (-int(self._seen[r]), self._keys[r]))
        return [self._entry(r) for r in order]

    # ---------------------------------------------------------------- snapshots

    def to_arrays(self) -> tuple[list[str], np.ndarray, list[int]]:
        """(queries in row order, float64 (rows, 2 + 2 * measures) of counter, seen, sums and
        finite counts, [offset, forgotten]): exact (the integers are far below 2**53)."""
        n = len(self._keys)
        table = np.concatenate(
            [
                self._counts[:n, None].astype(np.float64),
                self._seen[:n, None].astype(np.float64),
                self._sums[:n],
                self._finite[:n].astype(np.float64),
            ],
            axis=1,
        )
        return list(self._keys), table, [self.offset, self._forgotten]

    @classmethod
    def from_arrays(
        cls, capacity: int, keys: list[str], table: np.ndarray, scalars: Sequence[int]
    ) -> Summary:
        """The summary ``to_arrays`` described (ValueError when the parts disagree)."""
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
        out._counts[:n] = table[:, 0].astype(np.int64)
        out._seen[:n] = table[:, 1].astype(np.int64)
        out._sums[:n] = table[:, 2 : 2 + measures]
        out._finite[:n] = table[:, 2 + measures :].astype(np.int64)
        out.offset, out._forgotten = int(scalars[0]), int(scalars[1])
        return out
