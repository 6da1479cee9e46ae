"""One partition's share of a comparison window, and when it is final.

A comparison window ``[start, start + width)`` is folded from the sums of the lists scored in
it, per segment and measure: n, Σy, Σy² and, with ``bootstrap_replicates`` B > 0, the lists
that had a user id and the hashed bootstrap's B pairs (Σ w·y, Σ w) whose weights are keyed by
the list's user (clustered.row_width): the sums the variance clustered by user is read from.
Each input partition contributes a *share*: the sums of
its results whose impression arrived in time (finalize reason other than ``late``) and whose
``ts`` falls in the window. The share is **final** once the partition's watermark passes the
window's end by the attribution window (``complete_before(watermark, window) >= end``): every
impression of the window that can still arrive would then be late. Both parts of the rule read
only the partition's own sequence of events, so the shares do not depend on batching, tick
timing, restarts or which instance owns the partition (docs/design.md, "Statistics over all
partitions").

``PartitionShares`` accumulates the open shares per partition and hands the final ones out
(``freeze``); its per-partition state is small (the windows not final yet) and JSON-safe, so the
daemon stores it in each partition's checkpoint. ``Share`` and ``Frozen`` encode to the records
of the statistics topic.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from evald.join.window import complete_before
from evald.segments import SegmentIndex
from evald.statistics.bootstrap import replicate_sums
from evald.statistics.clustered import LIST_COLUMNS, row_width

__all__ = [
    "FINAL",
    "VERSION",
    "Frozen",
    "Labels",
    "PartitionShares",
    "Share",
    "add_sums",
    "decode_record",
    "pieces",
]

#: "every window is final" (a drain: all data is in)
FINAL = 1 << 62
#: version of the share and mark records and of the checkpoint's ``statistics`` field
VERSION = 2
#: versions still read: 1 wrote (M, 3) sums (list level), which fold as the request-level
#: fallback (their replicate sums are unknown)
READABLE = frozenset({1, VERSION})
#: the finalize reason whose results are left out of every share
LATE = "late"
#: sums per share record (segments x measures x 3): about 250 KiB of JSON with the labels
CELLS_PER_RECORD = 12_000
#: bytes of labels (their JSON) per share record, on top of its sums: a share of many segments
#: with long labels stays under Kafka's default max.message.bytes (before, 2000 segments of two
#: measures with 512-character labels made one record of 1.3 MB). One segment's labels are never
#: cut.
LABEL_BYTES_PER_RECORD = 256 * 1024

#: an item of a share (a segment, a credit cell)
T = TypeVar("T")
#: a segment's labels as (key, value) pairs, in the engine's ``label_keys`` order
Labels = tuple[tuple[str, str], ...]


def pieces(items: Sequence[T], step: int, weight: Callable[[T], int]) -> list[tuple[T, ...]]:
    """``items`` cut, in order, into runs of at most ``step`` whose ``weight`` adds up to at most
    ``LABEL_BYTES_PER_RECORD`` (an item heavier than that goes alone): the records of a share."""
    out: list[tuple[T, ...]] = []
    run: list[T] = []
    held = 0
    for item in items:
        size = weight(item)
        if run and (len(run) == step or held + size > LABEL_BYTES_PER_RECORD):
            out.append(tuple(run))
            run, held = [], 0
        run.append(item)
        held += size
    if run:
        out.append(tuple(run))
    return out


def _label_bytes(segment: tuple[Labels, np.ndarray]) -> int:
    """The JSON bytes of a segment's labels in its share record."""
    return len(json.dumps([list(pair) for pair in segment[0]], separators=(",", ":")))


@dataclass(frozen=True)
class Share:
    """Partition ``partition``'s final sums of window ``[start, start + width)``: per segment
    (labels), an (M, columns) array over the finite values of each measure: n, Σy, Σy², then,
    with replicates, the lists with a user id and the B pairs (clustered.row_width). A share
    of many segments is cut into several (``chunk`` 0, 1, ...) so that every record stays far
    below Kafka's default ``max.message.bytes``; the chunks add up."""

    start: int
    width: int
    partition: int
    segments: tuple[tuple[Labels, np.ndarray], ...]
    chunk: int = 0

    @property
    def key(self) -> bytes:
        """The statistics topic's record key: one per (window, partition, chunk), written
        once."""
        return f"share.{self.start}.{self.partition}.{self.chunk}".encode()

    def encode(self) -> bytes:
        doc = {
            "v": VERSION,
            "kind": "share",
            "start": self.start,
            "width": self.width,
            "partition": self.partition,
            "chunk": self.chunk,
            "segments": [
                [[list(pair) for pair in labels], sums.tolist()] for labels, sums in self.segments
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Frozen:
    """What one freeze of a partition produced: every window ending at or before
    ``final_until`` is final in ``partition``, and ``shares`` are those of them that became
    final now and hold data (a window with no share is empty there)."""

    partition: int
    final_until: int
    shares: tuple[Share, ...] = ()

    @property
    def key(self) -> bytes:
        """The mark's record key (compaction keeps the newest mark per partition)."""
        return f"final.{self.partition}".encode()

    def encode_mark(self) -> bytes:
        doc = {
            "v": VERSION,
            "kind": "final",
            "partition": self.partition,
            "final": self.final_until,
        }
        return json.dumps(doc, separators=(",", ":")).encode()


def decode_record(raw: bytes) -> Share | Frozen:
    """A statistics topic record (``Share.encode`` or ``Frozen.encode_mark``); ValueError on
    anything else."""
    try:
        doc = json.loads(raw)
        if doc.get("v") not in READABLE:
            raise ValueError(f"unsupported statistics record version {doc.get('v')!r}")
        if doc["kind"] == "final":
            return Frozen(int(doc["partition"]), int(doc["final"]))
        if doc["kind"] != "share":
            raise ValueError(f"unknown statistics record kind {doc['kind']!r}")
        segments = tuple((_labels(labels), _sums(sums)) for labels, sums in doc["segments"])
        return Share(
            int(doc["start"]),
            int(doc["width"]),
            int(doc["partition"]),
            segments,
            int(doc.get("chunk", 0)),
        )
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed statistics record: {exc!r}") from None


def _labels(data: Any) -> Labels:
    return tuple((str(k), str(v)) for k, v in data)


def _sums(data: Any) -> np.ndarray:
    arr = np.asarray(data, dtype=np.float64)
    width = arr.shape[1] if arr.ndim == 2 else 0
    if width != LIST_COLUMNS and (width < LIST_COLUMNS + 3 or (width - LIST_COLUMNS) % 2 != 1):
        raise ValueError(f"sums must be (measures, 3) or (measures, 4 + 2B), not {arr.shape}")
    return arr


def add_sums(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two sums of one segment; of different widths (one written without replicates, or with
    another B) only the list-level columns add up: the replicates of the sum are unknown."""
    if a.shape == b.shape:
        return a + b
    return a[:, :LIST_COLUMNS] + b[:, :LIST_COLUMNS]


class PartitionShares:
    """Open shares per partition and window, freed once final (``freeze``)."""

    def __init__(
        self,
        width: int,
        window: int,
        measures: int,
        segments: SegmentIndex,
        replicates: int = 0,
    ) -> None:
        """``width``: the comparison window; ``window``: the attribution window (when an
        impression closes); ``measures``: M; ``segments``: the engine's segment index;
        ``replicates``: B of the bootstrap weights ``observe`` is given (0: list level)."""
        self.width = width
        self.window = window
        self.measures = measures
        self.segments = segments
        self.replicates = replicates
        #: columns per (segment, measure): clustered.row_width
        self.columns = row_width(replicates)
        #: partition -> window start -> (segments, M, columns) sums by the engine's segment ids
        self._open: dict[int, dict[int, np.ndarray]] = {}
        #: partition -> open shares loaded from a checkpoint (by labels: ids are per engine)
        self._loaded: dict[int, dict[int, dict[Labels, np.ndarray]]] = {}
        #: partition -> every window ending at or before it is final (and handed out)
        self._final: dict[int, int] = {}

    def observe(
        self,
        partition: int,
        segment_ids: np.ndarray,
        ts: np.ndarray,
        values: np.ndarray,
        reasons: Sequence[str],
        weights: np.ndarray | None = None,
        users: np.ndarray | None = None,
    ) -> None:
        """Add one batch of scored results (``values``: (n, M)); late ones are left out.

        ``weights``: the (n, B) bootstrap weights of each result's cluster and ``users``: which
        results had a user id, when the shares keep replicates (``replicates`` > 0).
        """
        if LATE in reasons:
            keep = np.fromiter((r != LATE for r in reasons), dtype=bool, count=len(reasons))
        else:  # the usual batch: a membership test is several times cheaper
            keep = np.ones(len(reasons), dtype=bool)
        starts = np.asarray(ts, dtype=np.int64) // self.width * self.width
        final = self._final.get(partition)
        if final is not None:  # a window handed out already is not reopened
            keep &= starts + self.width > final
        if not keep.any():
            return
        seg = np.asarray(segment_ids)[keep]
        starts = starts[keep]
        vals = np.asarray(values, dtype=np.float64)[keep]
        finite = np.isfinite(vals)
        clean = np.where(finite, vals, 0.0)
        parts = [finite.astype(np.float64), clean, clean * clean]
        if self.replicates:
            if weights is None or users is None:
                raise ValueError("shares with replicates need each result's weights and user")
            parts.append(finite & np.asarray(users, dtype=bool)[keep, None])
        rows = np.stack(parts, axis=-1)
        windows = self._open.setdefault(partition, {})
        for start in np.unique(starts).tolist():
            sel = starts == start
            arr = windows.get(start)
            if arr is None or arr.shape[0] < len(self.segments):
                grown = np.zeros((len(self.segments), self.measures, self.columns))
                if arr is not None:
                    grown[: arr.shape[0]] = arr
                arr = windows[start] = grown
            self._add_moments(arr, seg[sel], rows[sel])
        if self.replicates:
            assert weights is not None
            self._add_replicates(windows, seg, starts, clean, finite, weights[keep])

    def _add_moments(self, arr: np.ndarray, seg: np.ndarray, rows: np.ndarray) -> None:
        """One bincount over (segment, measure, moment) cells: several times cheaper than
        np.add.at on the (segments, M, k) array."""
        size, k = arr.shape[0], rows.shape[-1]
        cells = self.measures * k
        flat = (seg[:, None] * cells + np.arange(cells)).ravel()
        sums = np.bincount(flat, rows.reshape(-1), size * cells).reshape(size, self.measures, k)
        arr[:, :, :k] += sums

    def _add_replicates(
        self,
        windows: dict[int, np.ndarray],
        seg: np.ndarray,
        starts: np.ndarray,
        clean: np.ndarray,
        finite: np.ndarray,
        weights: np.ndarray,
    ) -> None:
        """Replicate sums per (window, segment): one ``replicate_sums`` per run of
        results sharing both (as the aggregates' bootstrap sums); Σw counts, per measure, the
        lists with a finite value."""
        order = np.lexsort((starts, seg))
        seg_s, starts_s = seg[order], starts[order]
        w = weights[order].astype(np.float64)
        y = np.concatenate([clean[order], finite[order].astype(np.float64)], axis=1)
        cut = (seg_s[1:] != seg_s[:-1]) | (starts_s[1:] != starts_s[:-1])
        cuts = [0, *(np.flatnonzero(cut) + 1).tolist(), len(seg_s)]
        m, lo_col = self.measures, LIST_COLUMNS + 1
        for lo, hi in itertools.pairwise(cuts):
            sums = replicate_sums(y[lo:hi], w[lo:hi])  # (2M, B): Σ w·y per measure, then Σ w
            arr = windows[int(starts_s[lo])]
            cell = arr[int(seg_s[lo])]
            cell[:, lo_col : lo_col + self.replicates] += sums[:m]
            cell[:, lo_col + self.replicates :] += sums[m:]

    def final_until(self, partition: int, watermark: int | None) -> int | None:
        """The end of the last window final in ``partition`` at ``watermark``: the mark moves
        once per window, so the statistics topic gets one mark per window and partition, not
        one per commit."""
        if watermark is None:
            return None
        return complete_before(watermark, self.window) // self.width * self.width

    def due(self, partition: int, watermark: int | None) -> bool:
        """Whether ``freeze`` at ``watermark`` would move the partition's final mark."""
        until = self.final_until(partition, watermark)
        return until is not None and until > self._final.get(partition, -FINAL)

    def freeze(
        self, partition: int, watermark: int | None, *, final: bool = False
    ) -> Frozen | None:
        """Hand out the shares that are final at ``watermark`` (``final``: all of them) and
        forget them; None when the partition's final mark did not move."""
        until = FINAL if final else self.final_until(partition, watermark)
        if until is None or until <= self._final.get(partition, -FINAL):
            return None
        self._final[partition] = until
        shares = []
        for start in sorted(self._starts(partition)):
            if start + self.width > until:
                break
            segments = self._take(partition, start)
            if segments:
                step = max(1, CELLS_PER_RECORD // (self.columns * self.measures))
                for chunk, piece in enumerate(pieces(segments, step, _label_bytes)):
                    shares.append(Share(start, self.width, partition, piece, chunk))
        return Frozen(partition, until, tuple(shares))

    def _starts(self, partition: int) -> set[int]:
        return set(self._open.get(partition, {})) | set(self._loaded.get(partition, {}))

    def _take(self, partition: int, start: int) -> tuple[tuple[Labels, np.ndarray], ...]:
        """The window's sums by labels, removed from the open shares."""
        merged = self._merged(partition, start)
        self._loaded.get(partition, {}).pop(start, None)
        self._open.get(partition, {}).pop(start, None)
        return merged

    def _merged(self, partition: int, start: int) -> tuple[tuple[Labels, np.ndarray], ...]:
        """The window's open sums by labels (loaded and observed), sorted by labels."""
        merged = dict(self._loaded.get(partition, {}).get(start, {}))
        arr = self._open.get(partition, {}).get(start)
        if arr is not None:
            for i in np.flatnonzero(arr[:, :, 0].any(axis=1)).tolist():
                labels = tuple(self.segments.labels_of(i).items())
                before = merged.get(labels)
                merged[labels] = arr[i].copy() if before is None else add_sums(before, arr[i])
        return tuple(sorted(merged.items(), key=lambda item: item[0]))

    def state(self, partition: int) -> dict[str, Any]:
        """The partition's open shares and final mark, JSON-safe (for its checkpoint)."""
        windows = [
            [
                start,
                [[[list(p) for p in lab], s.tolist()] for lab, s in self._merged(partition, start)],
            ]
            for start in sorted(self._starts(partition))
        ]
        return {
            "v": VERSION,
            "width": self.width,
            "replicates": self.replicates,
            "final": self._final.get(partition),
            "open": windows,
        }

    def load(self, partition: int, doc: Any, watermark: int | None) -> None:
        """Take the state a checkpoint stored (``state``); without one (a checkpoint written
        before statistics were, or with another window width) the windows final at the
        checkpoint's ``watermark`` count as handed out and the open ones start empty. Sums
        stored without replicates (version 1) or with another B keep their list-level columns
        only: those windows fold at list level."""
        self.drop(partition)
        if isinstance(doc, dict) and doc.get("v") in READABLE and doc.get("width") == self.width:
            if doc.get("final") is not None:
                self._final[partition] = int(doc["final"])
            self._loaded[partition] = {
                int(start): {_labels(lab): self._fit(_sums(s)) for lab, s in segments}
                for start, segments in doc["open"]
            }
            return
        until = self.final_until(partition, watermark)
        if until is not None:
            self._final[partition] = until

    def _fit(self, sums: np.ndarray) -> np.ndarray:
        """Stored sums as this configuration keeps them: of another width, list level only."""
        return sums if sums.shape[1] == self.columns else sums[:, :LIST_COLUMNS].copy()

    def drop(self, partition: int) -> None:
        """Forget the partition (revoked, or about to be restored)."""
        self._open.pop(partition, None)
        self._loaded.pop(partition, None)
        self._final.pop(partition, None)
