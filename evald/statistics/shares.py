"""One partition's share of a comparison window, and when it is final.

A comparison window ``[start, start + width)`` is folded from the sums (n, Σy, Σy² per segment
and measure) of the lists scored in it. Each input partition contributes a *share*: the sums of
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

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evald.join.window import complete_before
from evald.segments import SegmentIndex

__all__ = [
    "FINAL",
    "VERSION",
    "Frozen",
    "Labels",
    "PartitionShares",
    "Share",
    "decode_record",
]

#: "every window is final" (a drain: all data is in)
FINAL = 1 << 62
#: version of the share and mark records and of the checkpoint's ``statistics`` field
VERSION = 1
#: the finalize reason whose results are left out of every share
LATE = "late"
#: sums per share record (segments x measures x 3): about 250 KiB of JSON with the labels
CELLS_PER_RECORD = 12_000

#: a segment's labels as (key, value) pairs, in the engine's ``label_keys`` order
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Share:
    """Partition ``partition``'s final sums of window ``[start, start + width)``: per segment
    (labels), an (M, 3) array of n, Σy, Σy² over the finite values of each measure. A share
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
        if doc.get("v") != VERSION:
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
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"sums must be (measures, 3), not {arr.shape}")
    return arr


class PartitionShares:
    """Open shares per partition and window, freed once final (``freeze``)."""

    def __init__(self, width: int, window: int, measures: int, segments: SegmentIndex) -> None:
        """``width``: the comparison window; ``window``: the attribution window (when an
        impression closes); ``measures``: M; ``segments``: the engine's segment index."""
        self.width = width
        self.window = window
        self.measures = measures
        self.segments = segments
        #: partition -> window start -> (segments, M, 3) sums by the engine's segment ids
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
    ) -> None:
        """Add one batch of scored results (``values``: (n, M)); late ones are left out."""
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
        rows = np.stack([finite.astype(np.float64), clean, clean * clean], axis=-1)
        windows = self._open.setdefault(partition, {})
        size, cells = len(self.segments), self.measures * 3
        # one bincount over (segment, measure, moment) cells per window: several times
        # cheaper than np.add.at on the (segments, M, 3) array
        flat = (seg[:, None] * cells + np.arange(cells)).ravel()
        weights = rows.reshape(-1)
        per_row = np.repeat(starts, cells)
        for start in np.unique(starts).tolist():
            sel = per_row == start
            sums = np.bincount(flat[sel], weights[sel], size * cells).reshape(size, -1, 3)
            arr = windows.get(start)
            if arr is None:
                windows[start] = sums
                continue
            if arr.shape[0] < size:
                sums[: arr.shape[0]] += arr
                windows[start] = sums
            else:
                arr += sums

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
                step = max(1, CELLS_PER_RECORD // (3 * self.measures))
                for chunk, first in enumerate(range(0, len(segments), step)):
                    piece = segments[first : first + step]
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
                merged[labels] = arr[i].copy() if before is None else before + arr[i]
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
            "final": self._final.get(partition),
            "open": windows,
        }

    def load(self, partition: int, doc: Any, watermark: int | None) -> None:
        """Take the state a checkpoint stored (``state``); without one (a checkpoint written
        before statistics were, or with another window width) the windows final at the
        checkpoint's ``watermark`` count as handed out and the open ones start empty."""
        self.drop(partition)
        if isinstance(doc, dict) and doc.get("v") == VERSION and doc.get("width") == self.width:
            if doc.get("final") is not None:
                self._final[partition] = int(doc["final"])
            self._loaded[partition] = {
                int(start): {_labels(lab): _sums(s) for lab, s in segments}
                for start, segments in doc["open"]
            }
            return
        until = self.final_until(partition, watermark)
        if until is not None:
            self._final[partition] = until

    def drop(self, partition: int) -> None:
        """Forget the partition (revoked, or about to be restored)."""
        self._open.pop(partition, None)
        self._loaded.pop(partition, None)
        self._final.pop(partition, None)
