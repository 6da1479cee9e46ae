"""QueryWindows: one query Summary per partition, base window and segment.

Kept beside the window sums in ``Aggregates`` and fed by the same calls (scored lists, and the
results a restore absorbs), snapshotted with them: so, like the window sums, the summaries
after a restore are exactly those of the uninterrupted run. Only the **base** windows are kept:
aligned windows of the greatest common divisor of the configured widths (5m for 5m and 1h); a
longer window is the merge of its base windows, made when it is read (summaries merge with
their bounds), which halves the per-list cost against a summary per width. A base window is
dropped once it ends before the retention horizon. Lists without a query are not summarised
(the window sums count every list).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from evald.drilldown.summary import Summary

__all__ = ["QueryWindows"]

#: (base width ms, window start ms) -> segment id -> Summary
Windows = dict[tuple[int, int], dict[int, Summary]]


class QueryWindows:
    """The partitions' query summaries; ``capacity`` fixes each summary's memory."""

    def __init__(
        self, capacity: int, measures: int, widths: Sequence[int], what: str = "query summaries"
    ) -> None:
        self.capacity = capacity
        #: what the summaries hold, for a refused snapshot's message
        self.what = what
        self.measures = measures
        self.widths = list(widths)
        #: the width of the windows kept: every configured width is a multiple of it
        self.base = math.gcd(*self.widths)
        self._parts: dict[int, Windows] = {}

    def observe(
        self,
        partition: int,
        seg: np.ndarray,
        ts: np.ndarray,
        queries: Sequence[str],
        clean: np.ndarray,
        finite: np.ndarray,
    ) -> None:
        """Add each list with a query to its segment's summary of its base window, in the given
        order (the order of the results: what makes a restore exact)."""
        has = np.fromiter(map(bool, queries), bool, len(queries))
        if not has.any():
            return
        at = np.flatnonzero(has)
        windows = self._parts.setdefault(partition, {})
        width = self.base
        start = ts[at] // width * width
        order = np.lexsort((start, seg[at]))  # stable: each group keeps the results' order
        # the lists in group order, once: each group is then a slice
        at = at[order]
        s, w = seg[at], start[order]
        items = list(map(queries.__getitem__, at.tolist()))
        rows = Summary.rows(clean[at], finite[at])
        cut = np.flatnonzero((s[1:] != s[:-1]) | (w[1:] != w[:-1])) + 1
        bounds = [0, *cut.tolist(), len(at)]
        for lo, hi in pairwise(bounds):
            by_segment = windows.setdefault((width, int(w[lo])), {})
            segment = int(s[lo])
            summary = by_segment.get(segment)
            if summary is None:
                summary = by_segment[segment] = Summary(self.capacity, self.measures)
            summary.add_rows(items[lo:hi], rows[lo:hi])

    def prune(self, partition: int, before_ms: int) -> None:
        """Drop the partition's windows that end at or before ``before_ms``."""
        windows = self._parts.get(partition)
        if windows:
            for key in [k for k in windows if k[0] + k[1] <= before_ms]:
                del windows[key]

    def drop(self, partition: int) -> None:
        self._parts.pop(partition, None)

    def partitions(self) -> list[int]:
        return sorted(self._parts)

    def segments(self, partition: int) -> set[int]:
        """The segment ids the partition's summaries name (for the snapshot's rows)."""
        return {s for by in self._parts.get(partition, {}).values() for s in by}

    def merged(self, width: int, start: int) -> dict[int, Summary]:
        """The summaries of the window ``[start, start + width)``, per segment: every
        partition's base windows in it merged, in partition then time order (deterministic)."""
        out: dict[int, Summary] = {}
        base = self.base
        for partition in sorted(self._parts):
            windows = self._parts[partition]
            for at in range(start, start + width, base):
                for segment, summary in sorted(windows.get((base, at), {}).items()):
                    into = out.get(segment)
                    if into is None:
                        into = out[segment] = Summary(self.capacity, self.measures)
                    into.merge(summary)
        return out

    def windows(self) -> list[tuple[int, int]]:
        """Every (configured width, start) holding some base window of some partition."""
        held = {start for windows in self._parts.values() for _, start in windows}
        return sorted({(w, s // w * w) for w in self.widths for s in held})

    # ---------------------------------------------------------------- snapshots

    def encode(
        self, partition: int, row_of: dict[int, int]
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(JSON metadata, arrays) of the partition's summaries; segments as snapshot rows."""
        index: list[list[int]] = []
        queries: list[str] = []
        tables: list[np.ndarray] = []
        for key, by_segment in sorted(self._parts.get(partition, {}).items()):
            for segment, summary in sorted(by_segment.items()):
                keys, table, scalars = summary.to_arrays()
                index.append([key[0], key[1], row_of[segment], len(keys), *scalars])
                queries.extend(keys)
                tables.append(table)
        width = 2 + 2 * self.measures
        table = np.concatenate(tables) if tables else np.zeros((0, width))
        meta = {"capacity": self.capacity, "base": self.base, "queries": queries}
        return meta, {"index": np.asarray(index, np.float64).reshape(-1, 6), "table": table}

    def decode(
        self,
        partition: int,
        meta: dict[str, Any],
        arrays: dict[str, np.ndarray],
        local: np.ndarray,
    ) -> Windows:
        """The partition's summaries from ``encode``'s parts (``local``: snapshot row -> this
        process's segment id); ValueError when they disagree or are malformed (a restore
        refuses the snapshot). Nothing is replaced yet."""
        if not isinstance(meta, dict):
            raise ValueError(f"snapshot's {self.what} are malformed")
        try:
            return self._decode(meta, arrays, local)
        except (TypeError, KeyError, IndexError, OverflowError) as exc:
            raise ValueError(f"snapshot's {self.what} are malformed ({exc})") from None

    def _decode(
        self, meta: dict[str, Any], arrays: dict[str, np.ndarray], local: np.ndarray
    ) -> Windows:
        index, table = arrays.get("index"), arrays.get("table")
        queries = meta.get("queries")
        if index is None or table is None or not isinstance(queries, list):
            raise ValueError(f"snapshot's {self.what} are missing")
        if meta.get("capacity") != self.capacity or meta.get("base") != self.base:
            raise ValueError(
                f"snapshot's {self.what} were kept with another capacity or windows (capacity "
                f"{meta.get('capacity')} and base window {meta.get('base')} ms there, "
                f"{self.capacity} and {self.base} ms here)"
            )
        if table.shape[1:] != (2 + 2 * self.measures,) or index.shape[1:] != (6,):
            raise ValueError(f"snapshot's {self.what} are misshapen")
        windows: Windows = {}
        at = 0
        for width, start, row, n, offset, forgotten in (
            (int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in index
        ):
            keys = [str(q) for q in queries[at : at + n]]
            summary = Summary.from_arrays(
                self.capacity, keys, table[at : at + n], [offset, forgotten]
            )
            by_segment = windows.setdefault((width, start), {})
            segment = int(local[row])
            if segment in by_segment:  # two rows of the writer are one segment here
                by_segment[segment].merge(summary)
            else:
                by_segment[segment] = summary
            at += n
        if at != len(queries) or at != len(table):
            raise ValueError(f"snapshot's {self.what} do not add up")
        return windows

    def replace(self, partition: int, windows: Windows) -> None:
        self._parts[partition] = windows
