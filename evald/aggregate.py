"""Aggregates: per segment x measure histograms and event-time window sums.

Two views of the same finalized values:

* **Histograms** over [0, 1] (configurable bounds) per segment and measure: Prometheus
  histograms, so they only ever grow; fed by every impression this process finalizes.
* **Window sums** (count, sum, sum of squares) per partition, event-time bucket (of the
  impression's ``ts``), segment and measure. They merge by addition, so the 5m / 1h roll-ups,
  several partitions and several instances all combine exactly. Buckets older than the
  retention are dropped; a partition handed to another instance is dropped whole.
* **Bootstrap sums** per partition, window (each configured width), segment and measure: the
  hashed Poisson bootstrap's B pairs (Σ w·y, Σ w), weights keyed by each list's cluster
  (docs/statistics.md §2). Plain sums too, so they merge like the window sums; they give the
  window's interval clustered by user.

Non-finite measure values are left out of both (counted per measure in ``count``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evald import snapshot as snapshot_codec
from evald.drilldown.labels import LabelPairs
from evald.drilldown.windows import QueryWindows
from evald.durations import format_duration
from evald.segments import SegmentIndex
from evald.statistics.bootstrap import (
    DEFAULT_REPLICATES,
    DEFAULT_SEED,
    BootstrapState,
    poisson_weights,
    replicate_sums,
)
from evald.statistics.intervals import Moments
from evald.stats import mean_ci95
from evald.zerofeedback.windows import ZeroWindows


@dataclass(frozen=True, slots=True)
class WindowRow:
    """One (window, segment, measure) aggregate over impressions with start <= ts < end."""

    window: str  # "5m", "1h"
    start_ms: int
    end_ms: int
    labels: dict[str, str]  # segment labels (configured keys; __none__ / __other__)
    measure: str
    count: int
    sum: float
    sum_squares: float
    mean: float  # NaN when count == 0
    ci95_halfwidth: float  # NaN when count < 2
    #: 95% half-width clustered by user (hashed Poisson bootstrap); NaN below its minimum n
    ci95_clustered_halfwidth: float = float("nan")

    def to_json(self) -> dict[str, object]:
        """The ``--windows`` line; NaN becomes null."""

        def num(x: float) -> float | None:
            return None if x != x else x

        return {
            "window": self.window,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "labels": self.labels,
            "measure": self.measure,
            "count": self.count,
            "sum": self.sum,
            "sum_squares": self.sum_squares,
            "mean": num(self.mean),
            "ci95_halfwidth": num(self.ci95_halfwidth),
            "ci95_clustered_halfwidth": num(self.ci95_clustered_halfwidth),
        }


class Aggregates:
    """Histogram and window state; read by the exposition, written by the engine only.

    Histogram arrays are indexed ``[segment_id, measure_index, ...]`` with segment ids from
    ``segments`` (``segments.labels_of(i)`` gives the label pairs) and measures in ``measures``
    order. ``hist_counts[s, m, b]`` counts values <= ``bounds[b]`` and > ``bounds[b-1]``
    (the last bucket is +Inf); make them cumulative for Prometheus with ``np.cumsum``.
    """

    def __init__(
        self,
        measures: Sequence[str],
        segments: SegmentIndex,
        bounds: Sequence[float],
        bucket_ms: int,
        windows_ms: Sequence[int],
        retention_ms: int,
        replicates: int = DEFAULT_REPLICATES,
        query_capacity: int = 0,
        zero_feedback: bool = False,
        label_capacity: int = 0,
        label_keys: int = 0,
    ) -> None:
        """``replicates``: bootstrap replicates per window (0: no clustered interval).
        ``query_capacity``: the queries held per summary of the drill-down (0: none kept).
        ``label_capacity``, ``label_keys``: the non-segment label pairs held per summary and
        the keys of a list taken (evald/drilldown/labels.py; 0: none kept).
        ``zero_feedback``: keep the zero-feedback values' window sums (``zero``)."""
        self.measures: list[str] = list(measures)
        self.segments = segments
        self.bounds = np.asarray(bounds, dtype=np.float64)
        self.bucket_ms = bucket_ms
        self.windows_ms: list[int] = list(windows_ms)
        self.retention_ms = retention_ms
        m, b = len(self.measures), len(self.bounds) + 1
        self.hist_counts = np.zeros((0, m, b), dtype=np.int64)
        self.hist_sum = np.zeros((0, m), dtype=np.float64)
        self.hist_count = np.zeros((0, m), dtype=np.int64)
        #: Σ y² of the histogram's values: with hist_sum and hist_count a monotonic counter
        #: triple, so PromQL computes a variance over any range and across instances
        self.hist_squares = np.zeros((0, m), dtype=np.float64)
        #: finalized impressions without positive feedback, per segment (a counter)
        self.abandoned = np.zeros(0, dtype=np.int64)
        #: finalized impressions scored into the overflow segment (a counter)
        self.overflow = 0
        #: partition -> bucket index (ts // bucket_ms) -> [segment, measure, (n, sum, squares)]
        self._windows: dict[int, dict[int, np.ndarray]] = {}
        self.replicates = replicates
        self.seed = DEFAULT_SEED
        #: partition -> (width ms, window start ms) -> [segment, measure, replicate, (Σwy, Σw)]
        self._boot: dict[int, dict[tuple[int, int], np.ndarray]] = {}
        #: the drill-down's query summaries per partition, window and segment (None: not kept)
        self.queries = (
            QueryWindows(query_capacity, len(self.measures), self.windows_ms)
            if query_capacity
            else None
        )
        #: the zero-feedback values' window sums (evald/zerofeedback/windows.py; None: off)
        self.zero = ZeroWindows(bucket_ms) if zero_feedback else None
        #: the non-segment label pairs' summaries, as the queries' (None: not kept)
        self.labels = (
            QueryWindows(label_capacity, len(self.measures), self.windows_ms, "label summaries")
            if label_capacity and label_keys
            else None
        )
        self._pairs = LabelPairs(segments.keys, label_keys)

    # ---------------------------------------------------------------- writing

    def _grow(self, n_segments: int) -> None:
        have = self.hist_counts.shape[0]
        if n_segments <= have:
            return
        extra = max(n_segments - have, have, 8)
        m, b = self.hist_counts.shape[1:]
        self.hist_counts = np.concatenate([self.hist_counts, np.zeros((extra, m, b), np.int64)])
        self.hist_sum = np.concatenate([self.hist_sum, np.zeros((extra, m))])
        self.hist_count = np.concatenate([self.hist_count, np.zeros((extra, m), np.int64)])
        self.hist_squares = np.concatenate([self.hist_squares, np.zeros((extra, m))])
        self.abandoned = np.concatenate([self.abandoned, np.zeros(extra, np.int64)])

    def observe(
        self,
        partition: int,
        segment_ids: np.ndarray,
        ts: np.ndarray,
        values: np.ndarray,
        *,
        abandoned: np.ndarray | None = None,
        histogram: bool = True,
        clusters: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        queries: Sequence[str] | None = None,
        labels: Sequence[Mapping[str, str]] | None = None,
    ) -> None:
        """Add finalized impressions: ``values`` is (n, len(measures)) in measure order.

        ``histogram=False`` feeds only the window sums (results replayed after a restart were
        already counted in a histogram by the process that produced them). ``clusters``: one
        uint64 cluster key per impression (``evald.statistics.list_cluster``) for the
        bootstrap sums; None leaves them out. ``weights``: their (n, B) ``poisson_weights``
        when the caller has them already (the engine hashes each batch once for these sums
        and the comparison shares). ``queries``: each list's normalised query ("" none), for
        the drill-down's summaries. ``labels``: each list's labels, for the summaries of its
        non-segment label pairs.
        """
        n = len(segment_ids)
        if n == 0:
            return
        seg = np.asarray(segment_ids, dtype=np.intp)
        values = np.asarray(values, dtype=np.float64)
        finite = np.isfinite(values)
        clean = np.where(finite, values, 0.0)
        self._grow(len(self.segments))
        if histogram:
            # integer counts by bincount on flat indices (several times cheaper than
            # np.add.at, and exact); float sums keep add.at's fixed order of addition
            counts = self.hist_counts
            n_seg, n_m, n_b = counts.shape
            b_idx = np.searchsorted(self.bounds, clean, side="left")
            flat = (seg[:, None] * n_m + np.arange(n_m)) * n_b + b_idx
            counts += np.bincount(flat[finite], minlength=counts.size).reshape(counts.shape)
            np.add.at(self.hist_sum, seg, clean)
            np.add.at(self.hist_squares, seg, clean * clean)
            self.hist_count += np.bincount(
                np.broadcast_to(seg[:, None] * n_m + np.arange(n_m), values.shape)[finite],
                minlength=n_seg * n_m,
            ).reshape(n_seg, n_m)
            if abandoned is not None:
                self.abandoned += np.bincount(seg[abandoned], minlength=n_seg)
            overflow = self.segments.overflow_id
            if overflow is not None:
                self.overflow += int(np.count_nonzero(seg == overflow))
        ts = np.asarray(ts, dtype=np.int64)
        self._add_windows(partition, seg, ts, clean, finite)
        if queries is not None and self.queries is not None:
            self.queries.observe(partition, seg, ts, queries, clean, finite)
        if labels is not None and self.labels is not None:
            rows, pairs = self._pairs.expand(labels)
            if pairs:
                self.labels.observe(
                    partition, seg[rows], ts[rows], pairs, clean[rows], finite[rows]
                )
        if clusters is not None and self.replicates:
            keys = np.asarray(clusters, dtype=np.uint64)
            self._add_bootstrap(partition, seg, ts, clean, finite, keys, weights)

    def _add_windows(
        self, partition: int, seg: np.ndarray, ts: np.ndarray, clean: np.ndarray, finite: np.ndarray
    ) -> None:
        buckets = self._windows.setdefault(partition, {})
        keys = ts // self.bucket_ms
        rows = len(self.segments)
        parts = np.stack([finite.astype(np.float64), clean, clean * clean], axis=-1)
        for key in np.unique(keys).tolist():
            sel = keys == key
            arr = buckets.get(key)
            if arr is None or arr.shape[0] < rows:
                grown = np.zeros((max(rows, 8), len(self.measures), 3))
                if arr is not None:
                    grown[: arr.shape[0]] = arr
                arr = buckets[key] = grown
            np.add.at(arr, seg[sel], parts[sel])

    def _add_bootstrap(
        self,
        partition: int,
        seg: np.ndarray,
        ts: np.ndarray,
        clean: np.ndarray,
        finite: np.ndarray,
        keys: np.ndarray,
        weights: np.ndarray | None = None,
    ) -> None:
        """Replicate sums per (window, segment): one ``replicate_sums`` of (n, 2M) by (n, B) per
        run of results sharing a segment and every width's window, far faster than an add.at
        over n x M x B cells. Σw counts, per measure, only the lists with a finite value, like
        the window count."""
        order = np.lexsort((ts, seg))  # by segment, then time: every window is one run
        seg_s, ts_s = seg[order], ts[order]
        if weights is None:
            w = poisson_weights(keys[order], self.replicates, self.seed).astype(np.float64)
        else:
            w = weights[order].astype(np.float64)
        y = np.concatenate([clean[order], finite[order].astype(np.float64)], axis=1)  # (n, 2M)
        cut = seg_s[1:] != seg_s[:-1]
        for width in self.windows_ms:
            cut |= ts_s[1:] // width != ts_s[:-1] // width
        cuts = [0, *(np.flatnonzero(cut) + 1).tolist(), len(seg_s)]
        n_m = len(self.measures)
        for lo, hi in itertools.pairwise(cuts):
            sums = replicate_sums(y[lo:hi], w[lo:hi])  # (2M, B): Σ w·y per measure, then Σ w
            segment, when = int(seg_s[lo]), int(ts_s[lo])
            for width in self.windows_ms:
                arr = self._boot_array(partition, width, when // width * width)
                arr[segment, :, :, 0] += sums[:n_m]
                arr[segment, :, :, 1] += sums[n_m:]

    def _boot_array(self, partition: int, width: int, start: int) -> np.ndarray:
        """The partition's replicate sums of one window, grown to every segment."""
        store = self._boot.setdefault(partition, {})
        rows = len(self.segments)
        arr = store.get((width, start))
        if arr is None or arr.shape[0] < rows:
            grown = np.zeros((max(rows, 8), len(self.measures), self.replicates, 2))
            if arr is not None:
                grown[: arr.shape[0]] = arr
            arr = store[(width, start)] = grown
        return arr

    def reach(self, before_ms: int) -> int:
        """The oldest time ``prune(p, before_ms)`` keeps: the start of the oldest window (of
        any width) that does not end by ``before_ms``. Whatever a restore re-reads to rebuild
        the sums must reach back that far."""
        return min(before_ms // width * width for width in self.windows_ms)

    def prune(self, partition: int, before_ms: int) -> None:
        """Drop the partition's windows that end at or before ``before_ms``: its bootstrap
        windows, and the buckets no window kept holds (those ending by ``reach``). A window
        is kept whole or not at all: cutting the oldest one's first buckets made its row
        count part of the window, and its bootstrap sums (kept whole) disagree with that
        part, differently in a restored process (seen in the chaos tier)."""
        reach = self.reach(before_ms)
        buckets = self._windows.get(partition)
        if buckets:
            for key in [k for k in buckets if (k + 1) * self.bucket_ms <= reach]:
                del buckets[key]
        boot = self._boot.get(partition)
        if boot:
            for width, start in [k for k in boot if k[0] + k[1] <= before_ms]:
                del boot[(width, start)]
        if self.queries is not None:
            self.queries.prune(partition, reach)
        if self.labels is not None:
            self.labels.prune(partition, reach)
        if self.zero is not None:
            self.zero.prune(partition, reach)

    def drop_partition(self, partition: int) -> None:
        """Forget a partition's window and bootstrap sums (another instance now owns it)."""
        for table in self._tables().values():
            table.pop(partition, None)
        if self.queries is not None:
            self.queries.drop(partition)
        if self.labels is not None:
            self.labels.drop(partition)
        if self.zero is not None:
            self.zero.drop(partition)

    # ---------------------------------------------------------------- snapshots

    def _tables(self) -> dict[str, dict[int, dict[Any, np.ndarray]]]:
        """Every per-partition state, by name: partition -> key -> array indexed
        ``[segment, ...]``; a key is an int (a bucket) or a tuple of ints (the bootstrap's
        ``(width, start)``). A new per-partition table is snapshotted by adding it here."""
        return {"windows": self._windows, "boot": self._boot}

    def snapshot(self, partition: int) -> bytes:
        """The partition's per-bucket state, exact (raw float64), with the segments' labels
        so another process maps the rows to its own segment ids (evald/snapshot.py).

        Only rows holding data are kept; buckets are whatever ``prune`` left (the retention).
        """
        tables = {name: table.get(partition, {}) for name, table in self._tables().items()}
        used: set[int] = set()
        for buckets in tables.values():
            for arr in buckets.values():
                used.update(np.flatnonzero(arr.reshape(arr.shape[0], -1).any(axis=1)).tolist())
        if self.queries is not None:
            used |= self.queries.segments(partition)
        if self.labels is not None:
            used |= self.labels.segments(partition)
        if self.zero is not None:
            used |= self.zero.segments(partition)
        rows = sorted(used)
        rows_at = np.asarray(rows, dtype=np.intp)
        arrays: dict[str, np.ndarray] = {}
        for name, buckets in tables.items():
            keys = sorted(buckets)
            arrays[f"{name}.buckets"] = np.asarray(keys, dtype=np.int64)
            shape = next(iter(buckets.values())).shape[1:] if buckets else (0,)
            values = np.zeros((len(keys), len(rows), *shape))
            for i, key in enumerate(keys):
                arr = buckets[key]
                held = rows_at < arr.shape[0]  # a bucket made before a segment existed is shorter
                values[i, held] = arr[rows_at[held]]
            arrays[f"{name}.values"] = values
        meta = {
            "kind": "aggregates",
            "bucket_ms": self.bucket_ms,
            "measures": self.measures,
            "segments": [list(self.segments.segments[row]) for row in rows],
            "tables": sorted(tables),
        }
        index = {r: i for i, r in enumerate(rows)}
        if self.queries is not None:  # beside the tables: an evald without them ignores it
            meta["queries"], part = self.queries.encode(partition, index)
            arrays.update(_nested("queries", part))
        if self.labels is not None:  # the same way
            meta["labels"], part = self.labels.encode(partition, index)
            arrays.update(_nested("labels", part))
        if self.zero is not None:  # beside the tables too
            meta["zero_feedback"], part = self.zero.encode(partition, index)
            arrays.update(_nested("zero", part))
        return snapshot_codec.encode(meta, arrays)

    def load(self, partition: int, raw: bytes) -> None:
        """Replace the partition's per-bucket state by a :meth:`snapshot`; raises ValueError
        (changing nothing) for bytes that are not a snapshot of this configuration."""
        meta, arrays = snapshot_codec.decode(raw)
        if meta.get("kind") != "aggregates" or sorted(meta.get("tables", [])) != sorted(
            self._tables()
        ):
            raise ValueError("snapshot does not hold these aggregates' tables")
        if meta.get("bucket_ms") != self.bucket_ms or meta.get("measures") != self.measures:
            raise ValueError("snapshot was written with another bucket or other measures")
        local = np.asarray(
            [self.segments.id_of([str(v) for v in seg]) for seg in meta["segments"]],
            dtype=np.intp,
        )
        loaded: dict[str, dict[Any, np.ndarray]] = {}
        for name in self._tables():
            keys, values = arrays.get(f"{name}.buckets"), arrays.get(f"{name}.values")
            if keys is None or values is None or values.shape[:2] != (len(keys), len(local)):
                raise ValueError(f"snapshot table {name!r} is missing or misshapen")
            rows = max(len(self.segments), 8)
            buckets = loaded[name] = {}
            for listed, per_bucket in zip(keys.tolist(), values, strict=True):
                key = tuple(listed) if isinstance(listed, list) else listed
                arr = buckets[key] = np.zeros((rows, *values.shape[2:]))
                np.add.at(arr, local, per_bucket)  # distinct rows: a copy, bit for bit
        summaries = None
        if self.queries is not None and "queries" in meta:
            summaries = self.queries.decode(
                partition, meta["queries"], _part("queries", arrays), local
            )
        pairs = None
        if self.labels is not None and "labels" in meta:
            pairs = self.labels.decode(partition, meta["labels"], _part("labels", arrays), local)
        zero: dict[int, np.ndarray] = {}
        if self.zero is not None and "zero_feedback" in meta:
            parts = _part("zero", arrays)
            zero = self.zero.decode(meta["zero_feedback"], parts, local, len(self.segments))
        for name, table in self._tables().items():
            table[partition] = loaded[name]
        if self.queries is not None:
            self.queries.replace(partition, summaries or {})
        if self.labels is not None:
            self.labels.replace(partition, pairs or {})
        if self.zero is not None:
            self.zero.replace(partition, zero)

    # ---------------------------------------------------------------- reading

    def partitions(self) -> list[int]:
        return sorted(self._windows)

    def bucket_range(self) -> tuple[int, int] | None:
        """(first, last) bucket index holding data over all partitions, or None."""
        keys = [k for buckets in self._windows.values() for k in buckets]
        return (min(keys), max(keys)) if keys else None

    def window_starts(self, width: int) -> list[int]:
        """The starts of the aligned windows of ``width`` holding data, over all partitions."""
        bucket = self.bucket_ms
        keys = {k for buckets in self._windows.values() for k in buckets}
        return sorted({k * bucket // width * width for k in keys})

    def window_sums(self, start_ms: int, end_ms: int) -> np.ndarray:
        """Merged (segments, measures, 3) sums of every bucket inside [start_ms, end_ms)."""
        out = np.zeros((len(self.segments), len(self.measures), 3))
        first, last = start_ms // self.bucket_ms, end_ms // self.bucket_ms
        for buckets in self._windows.values():
            for key, arr in buckets.items():
                if first <= key < last:
                    rows = min(arr.shape[0], out.shape[0])
                    out[:rows] += arr[:rows]
        return out

    def window_rows(
        self, complete_before: int | None, *, last_only: bool = True, final: bool = False
    ) -> list[WindowRow]:
        """Rows for complete windows: each window ``[start, end)`` with ``end <= complete_before``.

        ``last_only`` gives the last complete window per width (what the exposition shows);
        otherwise every complete window still in retention that holds data (``--windows``).
        ``final`` (after a drain) means all data is in: the window holding the newest bucket
        counts as complete too. Windows are aligned to multiples of their width since the
        epoch; segments with no impression in a window are left out.
        """
        span = self.bucket_range()
        if span is None or (complete_before is None and not final):
            return []
        rows: list[WindowRow] = []
        for width in self.windows_ms:
            if final:
                data_end = (span[1] + 1) * self.bucket_ms
                last_end = -(-data_end // width) * width
            else:
                assert complete_before is not None
                last_end = complete_before // width * width
            if last_only:
                ends = [last_end]
            else:
                first_end = (span[0] * self.bucket_ms) // width * width + width
                ends = list(range(first_end, last_end + 1, width))
            for end in ends:
                rows.extend(self._rows_for(width, end - width, end))
        return rows

    def bootstrap_sums(self, width: int, start: int) -> np.ndarray:
        """Merged (segments, measures, replicates, 2) replicate sums (Σwy, Σw) of one window."""
        out = np.zeros((len(self.segments), len(self.measures), self.replicates, 2))
        for windows in self._boot.values():
            arr = windows.get((width, start))
            if arr is not None:
                rows = min(arr.shape[0], out.shape[0])
                out[:rows] += arr[:rows]
        return out

    def _rows_for(self, width: int, start: int, end: int) -> Iterator[WindowRow]:
        sums = self.window_sums(start, end)
        boot = self.bootstrap_sums(width, start) if self.replicates else None
        name = format_duration(width)
        for seg_id, per_measure in enumerate(sums):
            if not per_measure[:, 0].any():
                continue
            labels = self.segments.labels_of(seg_id)
            for m_idx, measure in enumerate(self.measures):
                count, total, squares = per_measure[m_idx].tolist()
                mean, half = mean_ci95(count, total, squares)
                clustered = math.nan
                if boot is not None:
                    moments = Moments(int(count), total, squares)
                    state = BootstrapState(
                        self.replicates,
                        self.seed,
                        boot[seg_id, m_idx, :, 0].copy(),
                        boot[seg_id, m_idx, :, 1].copy(),
                        moments,
                    )
                    clustered = state.interval().half_width
                yield WindowRow(
                    name,
                    start,
                    end,
                    labels,
                    measure,
                    int(count),
                    total,
                    squares,
                    mean,
                    half,
                    clustered,
                )


def _nested(prefix: str, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A part's arrays as the snapshot stores them, each name under ``prefix.``."""
    return {f"{prefix}.{name}": arr for name, arr in arrays.items()}


def _part(prefix: str, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays a snapshot stored under ``prefix.`` (:func:`_nested`), by their own names."""
    head = prefix + "."
    return {k.removeprefix(head): v for k, v in arrays.items() if k.startswith(head)}
