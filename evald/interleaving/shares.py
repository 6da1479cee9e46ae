"""One partition's share of an interleaving window, and when it is final: the comparisons'
share rule (evald/statistics/shares.py) applied to the pair sums.

A partition's *credit share* of window ``[start, start + interleaving.window)`` is the pair sums
(windows.PartitionCredit) of its credited lists with ``ts`` in the window; late lists are never
credited (component.py), so a share reads only the partition's own sequence of events. It is
**final** once the partition's watermark passes the window's end by the attribution window
(``complete_before(watermark, window) >= end``), exactly when a comparison share is. So the
daemon publishes it the way it publishes those (docs/design.md, "Statistics over all
partitions"): the commit that makes it final writes it to the statistics topic with the
partition's credit mark, the open shares travel in the partition's checkpoint (the
``interleaving`` key of its ``statistics`` field), and every instance folds the topic
(live.py). Replay and the demo run the same shares and fold in the engine.

The records are a kind of their own (``credit``, ``credit_final``) beside the comparisons'
``share`` and ``final``: the interleaving window is not the comparisons' window, so the two
need their own marks; the records of the comparisons are unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from evald.interleaving.sums import PairSums
from evald.interleaving.windows import Cell, PartitionCredit, Windows
from evald.join.window import complete_before
from evald.statistics.shares import pieces

__all__ = [
    "KINDS",
    "CreditFrozen",
    "CreditShare",
    "CreditShares",
    "decode_credit",
]

#: version of the credit records and of the checkpoint's ``statistics.interleaving``
VERSION = 1
#: the statistics topic record kinds this module writes
KINDS = frozenset({"credit", "credit_final"})
#: "every window is final" (a drain: all data is in)
FINAL = 1 << 62
#: numbers per share record: about 250 KiB of JSON, as the comparisons' records
NUMBERS_PER_RECORD = 12_000
#: the counts of a PairSums, in record order
COUNTS = ("lists", "lead_a", "wins_a", "wins_b", "ties", "users")


def _label_bytes(cell: tuple[Cell, PairSums]) -> int:
    """The JSON bytes of a cell's segment and team names in its share record (a share of many
    cells with long names is cut by them too: shares.LABEL_BYTES_PER_RECORD)."""
    (segment, a, b), _ = cell
    return len(json.dumps([list(segment), a, b], separators=(",", ":")))


def _encode_cells(cells: tuple[tuple[Cell, PairSums], ...]) -> list[Any]:
    return [
        [
            list(segment),
            a,
            b,
            [getattr(sums, k) for k in COUNTS],
            None if sums.weighted is None else sums.weighted.tolist(),
            None if sums.weights is None else sums.weights.tolist(),
        ]
        for (segment, a, b), sums in cells
    ]


def _decode_cells(data: Any) -> tuple[tuple[Cell, PairSums], ...]:
    out = []
    for segment, a, b, counts, weighted, weights in data:
        if len(counts) != len(COUNTS) or (weighted is None) != (weights is None):
            raise ValueError("a credit cell holds 6 counts and both replicate sums or neither")
        reps = [None if w is None else np.asarray(w, dtype=np.float64) for w in (weighted, weights)]
        if reps[0] is not None and reps[1] is not None and reps[0].shape != reps[1].shape:
            raise ValueError("a credit cell's replicate sums differ in size")
        lists, lead_a, wins_a, wins_b, ties, users = (int(c) for c in counts)
        sums = PairSums(lists, lead_a, wins_a, wins_b, ties, users, reps[0], reps[1])
        out.append((((*(str(v) for v in segment),), str(a), str(b)), sums))
    return tuple(out)


@dataclass(frozen=True)
class CreditShare:
    """Partition ``partition``'s final pair sums of window ``[start, start + width)``, per
    (segment label values, team a, team b); a share of many cells is cut into ``chunk`` 0, 1,
    ... that add up."""

    start: int
    width: int
    partition: int
    cells: tuple[tuple[Cell, PairSums], ...]
    chunk: int = 0

    @property
    def key(self) -> bytes:
        """One per (window, partition, chunk), written once."""
        return f"credit.{self.start}.{self.partition}.{self.chunk}".encode()

    def encode(self) -> bytes:
        doc = {
            "v": VERSION,
            "kind": "credit",
            "start": self.start,
            "width": self.width,
            "partition": self.partition,
            "chunk": self.chunk,
            "cells": _encode_cells(self.cells),
        }
        return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True)
class CreditFrozen:
    """What one freeze produced: every interleaving window ending at or before
    ``final_until`` is final in ``partition``; ``shares``: those that became final now and
    hold lists."""

    partition: int
    final_until: int
    shares: tuple[CreditShare, ...] = ()

    @property
    def key(self) -> bytes:
        """The mark's key (compaction keeps the newest per partition)."""
        return f"credit_final.{self.partition}".encode()

    def encode_mark(self) -> bytes:
        doc = {
            "v": VERSION,
            "kind": "credit_final",
            "partition": self.partition,
            "final": self.final_until,
        }
        return json.dumps(doc, separators=(",", ":")).encode()


def decode_credit(doc: dict[str, Any]) -> CreditShare | CreditFrozen:
    """A parsed statistics topic record of a ``KINDS`` kind; ValueError when malformed."""
    try:
        if doc.get("v") != VERSION:
            raise ValueError(f"unsupported credit record version {doc.get('v')!r}")
        if doc["kind"] == "credit_final":
            return CreditFrozen(int(doc["partition"]), int(doc["final"]))
        if doc["kind"] != "credit":
            raise ValueError(f"not a credit record: kind {doc['kind']!r}")
        return CreditShare(
            int(doc["start"]),
            int(doc["width"]),
            int(doc["partition"]),
            _decode_cells(doc["cells"]),
            int(doc.get("chunk", 0)),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed credit record: {exc!r}") from None


class CreditShares:
    """Open credit shares per partition and window, handed out once final (``freeze``)."""

    def __init__(self, width: int, window: int, replicates: int) -> None:
        """``width``: the interleaving window; ``window``: the attribution window;
        ``replicates``: B of the bootstrap weights the pair sums keep (0: none)."""
        self.width = width
        self.window = window
        self.replicates = replicates
        #: partition -> its open windows' pair sums
        self._open: dict[int, PartitionCredit] = {}
        #: partition -> every window ending at or before it is final (and handed out)
        self._final: dict[int, int] = {}

    def observe(
        self,
        partition: int,
        starts: list[int],
        cells: list[Cell],
        leads: list[bool],
        ds: list[int],
        compared: list[bool],
        users: list[bool],
        weights: np.ndarray | None,
    ) -> None:
        """Add pair outcomes (``PartitionCredit.observe``); those of a window handed out
        already are left out (never reopened: a list closing there is late anyway)."""
        final = self._final.get(partition)
        keep = [i for i, s in enumerate(starts) if final is None or s + self.width > final]
        if not keep:
            return
        sums = self._open.get(partition)
        if sums is None:
            sums = self._open[partition] = PartitionCredit(self.width, self.replicates)
        sums.observe(
            [starts[i] for i in keep],
            [cells[i] for i in keep],
            [leads[i] for i in keep],
            [ds[i] for i in keep],
            [compared[i] for i in keep],
            [users[i] for i in keep],
            None if weights is None else weights[keep],
        )

    def final_until(self, watermark: int | None) -> int | None:
        """The end of the last window final at ``watermark`` (moves once per window)."""
        if watermark is None:
            return None
        return complete_before(watermark, self.window) // self.width * self.width

    def due(self, partition: int, watermark: int | None) -> bool:
        """Whether ``freeze`` at ``watermark`` would move the partition's mark."""
        until = self.final_until(watermark)
        return until is not None and until > self._final.get(partition, -FINAL)

    def freeze(
        self, partition: int, watermark: int | None, *, final: bool = False
    ) -> CreditFrozen | None:
        """Hand out the shares final at ``watermark`` (``final``: all) and forget them; None
        when the partition's mark did not move."""
        until = FINAL if final else self.final_until(watermark)
        if until is None or until <= self._final.get(partition, -FINAL):
            return None
        self._final[partition] = until
        sums = self._open.get(partition)
        taken = {} if sums is None else sums.take(until)
        shares = []
        for start, cells in taken.items():
            ordered = tuple(sorted(cells.items(), key=lambda item: item[0]))
            step = max(1, NUMBERS_PER_RECORD // (len(COUNTS) + 2 * self.replicates))
            for chunk, piece in enumerate(pieces(ordered, step, _label_bytes)):
                shares.append(CreditShare(start, self.width, partition, piece, chunk))
        return CreditFrozen(partition, until, tuple(shares))

    def state(self, partition: int) -> dict[str, Any]:
        """The partition's open shares and mark, JSON-safe (its checkpoint's
        ``statistics.interleaving``)."""
        sums = self._open.get(partition)
        windows = {} if sums is None else sums.windows
        return {
            "v": VERSION,
            "width": self.width,
            "replicates": self.replicates,
            "final": self._final.get(partition),
            "open": [
                [start, _encode_cells(tuple(sorted(windows[start].items())))]
                for start in sorted(windows)
            ],
        }

    def load(self, partition: int, doc: Any, watermark: int | None) -> None:
        """Take what ``state`` stored; without it (a checkpoint written before the credit was
        shared, or with another window or B) the windows final at the checkpoint's
        ``watermark`` count as handed out and the open ones start empty, as for the
        comparisons' shares (docs/design.md)."""
        self.drop(partition)
        if (
            isinstance(doc, dict)
            and doc.get("v") == VERSION
            and doc.get("width") == self.width
            and doc.get("replicates") == self.replicates
        ):
            if doc.get("final") is not None:
                self._final[partition] = int(doc["final"])
            sums = PartitionCredit(self.width, self.replicates)
            opened: Windows = {int(s): dict(_decode_cells(cells)) for s, cells in doc["open"]}
            sums.merge(opened)
            self._open[partition] = sums
            return
        until = self.final_until(watermark)
        if until is not None:
            self._final[partition] = until

    def drop(self, partition: int) -> None:
        """Forget the partition (revoked, or about to be restored)."""
        self._open.pop(partition, None)
        self._final.pop(partition, None)
