"""One partition's interleaving credit: pair sums per event-time window, segment and pair.

What a partition holds between two looks of the preference test: for every window that is not
complete yet, and for every (segment, team a, team b) with lists in it, a :class:`PairSums`.
Plain sums, so a window's state is the same whatever the batching and the order, and windows of
several partitions add up.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from evald.interleaving.sums import PairSums
from evald.statistics.bootstrap import replicate_sums

#: (segment label values, team a, team b), a < b by name
Cell = tuple[tuple[str, ...], str, str]
#: window start (ms) -> cell -> sums
Windows = dict[int, dict[Cell, PairSums]]


class PartitionCredit:
    """Window sums of one partition's credited interleaved lists (``width``: the window in
    ms; ``replicates``: bootstrap replicates kept, 0 none)."""

    def __init__(self, width: int, replicates: int) -> None:
        self.width = width
        self.replicates = replicates
        self.windows: Windows = {}

    def start_of(self, ts: int) -> int:
        """The start of the window holding event time ``ts`` (windows aligned to the epoch)."""
        return ts - ts % self.width

    def observe(
        self,
        starts: Sequence[int],
        cells: Sequence[Cell],
        leads: Sequence[bool],
        ds: Sequence[int],
        compared: Sequence[bool],
        users: Sequence[bool],
        weights: NDArray[np.uint8] | None,
    ) -> None:
        """Add pair outcomes, one per entry: its window start, cell, whether a led, the outcome
        d, whether it was compared, whether its list had a user id, and (``weights``, one row
        per entry, None without replicates) its user's bootstrap weights."""
        groups: dict[tuple[int, Cell], list[int]] = {}
        for index, key in enumerate(zip(starts, cells, strict=True)):
            groups.setdefault(key, []).append(index)
        for (start, cell), rows in groups.items():
            window = self.windows.setdefault(start, {})
            sums = window.get(cell)
            if sums is None:
                sums = window[cell] = PairSums.empty(self.replicates)
            self._add(sums, rows, leads, ds, compared, users, weights)

    def _add(
        self,
        sums: PairSums,
        rows: list[int],
        leads: Sequence[bool],
        ds: Sequence[int],
        compared: Sequence[bool],
        users: Sequence[bool],
        weights: NDArray[np.uint8] | None,
    ) -> None:
        kept = [i for i in rows if compared[i]]
        sums.lists += len(rows)
        sums.lead_a += sum(1 for i in rows if leads[i])
        sums.wins_a += sum(1 for i in kept if ds[i] > 0)
        sums.wins_b += sum(1 for i in kept if ds[i] < 0)
        sums.ties += sum(1 for i in kept if ds[i] == 0)
        sums.users += sum(1 for i in kept if users[i])
        if weights is not None and kept and sums.weighted is not None:
            w = weights[kept].astype(np.float64)
            d = np.asarray([ds[i] for i in kept], dtype=np.float64)
            sums.weighted += replicate_sums(d, w)
            sums.weights += w.sum(axis=0)

    def take(self, before: int | None, *, final: bool = False) -> Windows:
        """Remove and return the windows that end at or before ``before`` (all: ``final``),
        in window order."""
        done = sorted(
            start
            for start in self.windows
            if final or (before is not None and start + self.width <= before)
        )
        return {start: self.windows.pop(start) for start in done}

    def merge(self, windows: Windows) -> None:
        """Add another partition's (or a snapshot's) windows into this one."""
        for start, cells in windows.items():
            mine = self.windows.setdefault(start, {})
            for cell, sums in cells.items():
                if cell in mine:
                    mine[cell].add(sums)
                else:
                    mine[cell] = sums.copy()
