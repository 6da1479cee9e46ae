"""ZeroWindows: the zero-feedback values' window sums, per partition, bucket and segment.

Like the measures' window sums (evald/aggregate.py): per event-time bucket of the list's
``ts`` and segment, for each quantity (``memory.QUANTITIES``) the lists with a defined value
and the sum of the values, added in the results' order (``np.add.at``), so the sums after a
restore (a snapshot, then the results after it absorbed) are bit for bit those of the
uninterrupted run. Snapshotted beside the aggregates' tables: an evald without it ignores it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evald.durations import format_duration
from evald.segments import SegmentIndex
from evald.zerofeedback.memory import EMPTY, QUANTITIES

__all__ = ["ZeroRow", "ZeroWindows", "grouped", "last_rows"]

EMPTY_COLUMN = EMPTY

_Q = len(QUANTITIES)


class ZeroWindows:
    """partition -> bucket index -> array [segment, quantity, (count, sum)]."""

    def __init__(self, bucket_ms: int) -> None:
        self.bucket_ms = bucket_ms
        self._parts: dict[int, dict[int, np.ndarray]] = {}

    def observe(self, partition: int, seg: np.ndarray, ts: np.ndarray, values: np.ndarray) -> None:
        """Add lists' values (n, 3), NaN left out of both count and sum.

        Each list's six cells are added to their flat positions in one 1-D ``np.add.at`` (numpy's
        fast path; a row index into the 3-D table took its slow one): still one addition per
        cell per list in the lists' order, so the sums are the same bits."""
        n = len(seg)
        if not n:
            return
        buckets = self._parts.setdefault(partition, {})
        finite = np.isfinite(values)
        parts = np.empty((n, _Q, 2))
        parts[:, :, 0] = finite
        parts[:, :, 1] = np.where(finite, values, 0.0)
        # the tables are C-contiguous (np.zeros here and in decode): reshape(-1) is a view
        cells = np.asarray(seg, np.intp)[:, None] * (_Q * 2) + np.arange(_Q * 2)
        keys = np.asarray(ts, np.int64) // self.bucket_ms
        rows = int(seg.max()) + 1
        first, last = int(keys.min()), int(keys.max())
        for key in [first] if first == last else np.unique(keys).tolist():
            arr = buckets.get(key)
            if arr is None or arr.shape[0] < rows:
                grown = np.zeros((max(rows, 8), _Q, 2))
                if arr is not None:
                    grown[: arr.shape[0]] = arr
                arr = buckets[key] = grown
            sel = slice(None) if first == last else keys == key
            np.add.at(arr.reshape(-1), cells[sel].ravel(), parts[sel].ravel())

    def prune(self, partition: int, reach_ms: int) -> None:
        """Drop the buckets ending by ``reach_ms`` (``Aggregates.reach``: windows kept whole)."""
        buckets = self._parts.get(partition)
        if buckets:
            for key in [k for k in buckets if (k + 1) * self.bucket_ms <= reach_ms]:
                del buckets[key]

    def drop(self, partition: int) -> None:
        self._parts.pop(partition, None)

    def segments(self, partition: int) -> set[int]:
        """Segment ids holding data in the partition (the snapshot's rows)."""
        used: set[int] = set()
        for arr in self._parts.get(partition, {}).values():
            used.update(np.flatnonzero(arr[:, :, 0].any(axis=1)).tolist())
        return used

    def sums(self, start_ms: int, end_ms: int, segments: int) -> np.ndarray:
        """Merged [segment, quantity, (count, sum)] of every bucket in [start_ms, end_ms)."""
        out = np.zeros((segments, _Q, 2))
        first, last = start_ms // self.bucket_ms, end_ms // self.bucket_ms
        for buckets in self._parts.values():
            for key, arr in buckets.items():
                if first <= key < last:
                    rows = min(arr.shape[0], segments)
                    out[:rows] += arr[:rows]
        return out

    def newest_bucket(self) -> int | None:
        keys = [k for buckets in self._parts.values() for k in buckets]
        return max(keys) if keys else None

    # ---------------------------------------------------------------- snapshots

    def encode(
        self, partition: int, row_of: dict[int, int]
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(metadata, arrays) of the partition's sums, segments as the snapshot's rows."""
        buckets = self._parts.get(partition, {})
        keys = sorted(buckets)
        values = np.zeros((len(keys), len(row_of), _Q, 2))
        for i, key in enumerate(keys):
            arr = buckets[key]
            for seg, row in row_of.items():
                if seg < arr.shape[0]:
                    values[i, row] = arr[seg]
        meta = {"quantities": list(QUANTITIES)}
        return meta, {"buckets": np.asarray(keys, np.int64), "values": values}

    def decode(
        self, meta: Any, arrays: dict[str, np.ndarray], local: np.ndarray, rows: int
    ) -> dict[int, np.ndarray]:
        """The partition's buckets of ``encode``'s parts (``local``: snapshot row -> segment
        id); ValueError when malformed. Nothing is replaced yet."""
        keys, values = arrays.get("buckets"), arrays.get("values")
        if (
            not isinstance(meta, dict)
            or meta.get("quantities") != list(QUANTITIES)
            or keys is None
            or values is None
            or values.shape != (len(keys), len(local), _Q, 2)
        ):
            raise ValueError("snapshot's zero-feedback sums are malformed")
        out: dict[int, np.ndarray] = {}
        for key, per_bucket in zip(keys.tolist(), values, strict=True):
            arr = out[int(key)] = np.zeros((max(rows, 8), _Q, 2))
            np.add.at(arr, local, per_bucket)
        return out

    def replace(self, partition: int, buckets: dict[int, np.ndarray]) -> None:
        self._parts[partition] = buckets

    def partitions(self) -> Iterator[int]:
        return iter(sorted(self._parts))


@dataclass(frozen=True, slots=True)
class ZeroRow:
    """One (window, segment, quantity): the lists with a defined value and their mean."""

    window: str
    start_ms: int
    end_ms: int
    labels: dict[str, str]
    quantity: str
    count: int
    mean: float  # NaN when count == 0

    def to_json(self) -> dict[str, object]:
        return {
            "window": self.window,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "labels": self.labels,
            "quantity": self.quantity,
            "count": self.count,
            "mean": None if self.count == 0 else self.mean,
        }


def last_rows(
    zero: ZeroWindows,
    segments: SegmentIndex,
    widths: Sequence[int],
    complete_before: int | None,
    *,
    final: bool = False,
) -> list[ZeroRow]:
    """The last complete window of each width, as ``Aggregates.window_rows`` picks it (after
    a drain, ``final``, the window holding the newest bucket); segments with no list in it
    are left out, a quantity no list of the segment defined has count 0 and mean NaN."""
    newest = zero.newest_bucket()
    if newest is None or (complete_before is None and not final):
        return []
    rows: list[ZeroRow] = []
    for width in widths:
        if final:
            data_end = (newest + 1) * zero.bucket_ms
            end = -(-data_end // width) * width
        else:
            assert complete_before is not None
            end = complete_before // width * width
        sums = zero.sums(end - width, end, len(segments))
        name = format_duration(width)
        for seg_id, per_quantity in enumerate(sums):
            if not per_quantity[EMPTY_COLUMN, 0]:
                continue  # every list counts in the empty share: none, no list in the window
            labels = segments.labels_of(seg_id)
            for quantity, (count, total) in zip(QUANTITIES, per_quantity.tolist(), strict=True):
                mean = total / count if count else math.nan
                rows.append(ZeroRow(name, end - width, end, labels, quantity, int(count), mean))
    return rows


def grouped(rows: Sequence[ZeroRow]) -> list[dict[str, object]]:
    """``rows`` as one object per window and segment, for a summary (``evald replay --format
    json``): ``"mean"`` and ``"lists"`` per quantity, the values of the series
    ``evald_zero_feedback_mean`` (null where the series is absent) and ``_lists``."""
    out: dict[tuple[str, int, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
    for row in rows:
        key = (row.window, row.start_ms, tuple(row.labels.items()))
        doc = out.get(key)
        if doc is None:
            doc = out[key] = {
                "window": row.window,
                "start_ms": row.start_ms,
                "end_ms": row.end_ms,
                "labels": row.labels,
                "mean": {},
                "lists": {},
            }
        doc["mean"][row.quantity] = row.mean if row.count else None
        doc["lists"][row.quantity] = row.count
    return list(out.values())
