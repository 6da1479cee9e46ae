"""LiveCredit: the preference test folded from every partition's final credit shares.

The comparisons' gate (``ShareGate``, evald/statistics/gate.py) over credit shares:
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
from evald.statistics.gate import ShareGate

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
        #: the shares until their window is complete in every partition
        self._gate: ShareGate[CreditShare] = ShareGate(width)

    @property
    def ignored(self) -> int:
        """Shares ignored: a second copy, one of a folded window, or of another window width
        or number of replicates (written before a settings change: they do not add up)."""
        with self._lock:
            return self._gate.ignored

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
            self._gate.mark(record.partition, record.final_until)

    def _add_share(self, share: CreditShare) -> None:
        fits = all(_replicates(sums) == self.replicates for _, sums in share.cells)
        self._gate.add(share, accepted=fits)

    def unmarked(self, partitions: Iterable[int]) -> list[int]:
        """The partitions with no credit mark yet: each holds every window's fold back."""
        with self._lock:
            return self._gate.unmarked(partitions)

    def fold(self, partitions: Iterable[int]) -> int:
        """Fold, in window order, every window final in all ``partitions``; returns how many
        windows held lists."""
        with self._lock:
            folded = 0
            for start, shares in self._gate.complete(partitions):
                if start < self.settings.start:  # before the test's start: not folded
                    continue
                merged = PartitionCredit(self.width, self.replicates)
                for share in shares:
                    merged.merge({start: dict(share.cells)})
                cells = merged.windows.get(start, {})
                if cells:
                    end = start + self.width
                    self._state = fold_window(self._state, end, cells, self.settings)
                    folded += 1
            return folded

    def records(self, label_keys: Sequence[str]) -> list[dict[str, Any]]:
        """Every (segment, pair) record (``report.record``)."""
        return records(self.state, label_keys, self.settings)


def _replicates(sums: PairSums) -> int:
    return 0 if sums.weighted is None else len(sums.weighted)
