"""LiveCredit: the preference test folded from every partition's final credit shares.

The gate of the comparisons' ``LiveStatistics`` (evald/statistics/live.py) over credit shares:
an interleaving window is folded once every partition's credit mark has passed it, in window
order, from the sum of its shares in (partition, chunk) order (``fold.fold_window``). A share
counts once per (window, partition, chunk): a copy, or a share of a window already folded, is
ignored and counted. The engine feeds its own shares (replay, the demo), the daemon the shares
every instance wrote to the statistics topic (evald/daemon/main/comparisons.py); both run this code,
so they fold the same state.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from evald.interleaving.fold import PreferenceState, Settings, fold_window
from evald.interleaving.report import records
from evald.interleaving.shares import CreditFrozen, CreditShare
from evald.interleaving.sums import PairSums
from evald.interleaving.windows import PartitionCredit

__all__ = ["LiveCredit"]


class LiveCredit:
    """The folded preference test; thread-safe (the statistics reader adds and folds while
    scrapes read ``records``)."""

    def __init__(self, settings: Settings, width: int, replicates: int) -> None:
        self.settings = settings
        self.width = width
        self.replicates = replicates
        self._lock = threading.Lock()
        self._state = PreferenceState()
        #: window start -> (partition, chunk) -> share, until the window is folded
        self._shares: dict[int, dict[tuple[int, int], CreditShare]] = {}
        #: partition -> every window ending at or before it is final there
        self._final: dict[int, int] = {}
        self._folded_until: int | None = None
        #: shares ignored: a second copy, one of a folded window, or of another window width
        #: or number of replicates (written before a settings change: they do not add up)
        self.ignored = 0

    @property
    def state(self) -> PreferenceState:
        with self._lock:
            return self._state

    def add(self, record: CreditFrozen | CreditShare) -> None:
        """A final share, or a partition's mark (a ``CreditFrozen`` carries both)."""
        with self._lock:
            if isinstance(record, CreditShare):
                self._add_share(record)
                return
            for share in record.shares:
                self._add_share(share)
            p = record.partition
            self._final[p] = max(self._final.get(p, record.final_until), record.final_until)

    def _add_share(self, share: CreditShare) -> None:
        folded = self._folded_until
        window = self._shares.get(share.start, {})
        if (
            share.width != self.width
            or any(_replicates(sums) != self.replicates for _, sums in share.cells)
            or (folded is not None and share.start + share.width <= folded)
            or (share.partition, share.chunk) in window
        ):
            self.ignored += 1
            return
        self._shares.setdefault(share.start, window)[(share.partition, share.chunk)] = share

    def unmarked(self, partitions: Iterable[int]) -> list[int]:
        """The partitions with no credit mark yet: each holds every window's fold back."""
        with self._lock:
            return [p for p in partitions if p not in self._final]

    def fold(self, partitions: Iterable[int]) -> int:
        """Fold, in window order, every window final in all ``partitions``; returns how many
        windows held lists."""
        with self._lock:
            marks = [self._final.get(p) for p in partitions]
            if not marks or any(m is None for m in marks):
                return 0
            limit = min(m for m in marks if m is not None)
            folded = 0
            for start in sorted(self._shares):
                if start + self.width > limit:
                    break
                shares = self._shares.pop(start)
                merged = PartitionCredit(self.width, self.replicates)
                for key in sorted(shares):
                    merged.merge({start: dict(shares[key].cells)})
                cells = merged.windows.get(start, {})
                if cells:
                    end = start + self.width
                    self._state = fold_window(self._state, end, cells, self.settings)
                    folded += 1
            if self._folded_until is None or limit > self._folded_until:
                self._folded_until = limit
            return folded

    def records(self, label_keys: Sequence[str]) -> list[dict[str, Any]]:
        """Every (segment, pair) record (``report.record``)."""
        return records(self.state, label_keys, self.settings)


def _replicates(sums: PairSums) -> int:
    return 0 if sums.weighted is None else len(sums.weighted)
