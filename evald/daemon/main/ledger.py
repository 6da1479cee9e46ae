"""The result ledger of one owned partition p: which offsets of results partition p committed
transactions wrote, the snapshot of p's window aggregates they follow, and the engine counters
its last commit held.

It lives as long as the assignment: it starts from the checkpoint a restore read (or empty),
and only a committed transaction moves it on (``Transaction.commit``, step 7). A restore reads
exactly these ranges back (restore.py), so the window aggregates are rebuilt from committed
results only, even on a broker that shows aborted records to ``read_committed`` readers
(docs/design.md).
"""

from __future__ import annotations

from evald.daemon.main.checkpoint import Checkpoint, ResultRange, SnapshotRef

__all__ = ["Ledger", "Ranges", "extend_ranges", "prune_ranges"]

Ranges = tuple[ResultRange, ...]


class Ledger:
    """Partition p's committed result ranges, epoch and snapshot."""

    def __init__(self, checkpoint: Checkpoint | None = None) -> None:
        """From the checkpoint a restore resumed p from (None: a fresh start). A restore
        begins a new ownership epoch: its first commit starts a new range."""
        self._ranges: Ranges = () if checkpoint is None else checkpoint.results
        self._snapshot = None if checkpoint is None else checkpoint.snapshot
        self._epoch_start: int | None = None
        self._counters = {} if checkpoint is None else checkpoint.state.counters
        #: the click-model snapshot (its checkpoint base64) whose records the last commit's
        #: checkpoint named, and them: named again while the model hands the same snapshot
        #: (None after a restore: the first commit writes them once more)
        self.click_records: tuple[str, SnapshotRef] | None = None

    @property
    def snapshot(self) -> SnapshotRef | None:
        """The committed snapshot of p's window aggregates; the ranges are the results after."""
        return self._snapshot

    def after(
        self, written: tuple[int, int, int | None] | None, horizon_ts: int | None
    ) -> tuple[Ranges, int | None]:
        """(ranges, epoch start) once the open transaction commits, ``written`` being the
        offsets of its first and last result in p and their newest event time (None: it
        wrote none), the ranges no window reaches past ``horizon_ts`` pruned."""
        ranges, epoch = self._ranges, self._epoch_start
        if written is not None:
            first, last, max_ts = written
            ranges, epoch = extend_ranges(ranges, epoch, first, last, max_ts)
        return prune_ranges(ranges, horizon_ts), epoch

    @property
    def counters(self) -> dict[str, int]:
        """The engine counters of p its last commit held (``PartitionState.counters``)."""
        return self._counters

    def committed(self, checkpoint: Checkpoint) -> dict[str, int]:
        """The transaction that wrote ``checkpoint`` committed: its ranges are p's now.
        Returns what its counters add to the last commit's (each count is so handed out by
        the one commit that holds it first: a kill -9 loses only what no commit holds yet,
        which the restart counts again)."""
        self._ranges, self._epoch_start = checkpoint.results, checkpoint.epoch_start
        self._snapshot = checkpoint.snapshot
        before, self._counters = self._counters, checkpoint.state.counters
        return {
            key: n - before.get(key, 0)
            for key, n in self._counters.items()
            if n != before.get(key, 0)
        }


def extend_ranges(
    ranges: Ranges,
    epoch_start: int | None,
    first: int,
    last: int,
    max_ts: int | None,
) -> tuple[Ranges, int]:
    """Record that a committed transaction wrote results at offsets ``first..last``.

    Within one ownership epoch (from restore until the next restore or abort), the only
    records this instance interleaves in partition p are its own transaction markers, so the
    epoch's results form one range ``[epoch_start, last + 1)``: the last range is extended. A
    new epoch (``epoch_start`` None) starts a new range, which excludes whatever an aborted or
    crashed transaction left between the epochs. Returns (ranges, epoch_start).
    """
    if first > last:
        raise ValueError("first must not exceed last")
    if epoch_start is None or not ranges or ranges[-1].start != epoch_start:
        return (*ranges, ResultRange(first, last + 1, max_ts)), first
    head = ranges[-1]
    merged_ts = head.max_ts if max_ts is None else max(max_ts, head.max_ts or max_ts)
    return (*ranges[:-1], ResultRange(head.start, last + 1, merged_ts)), epoch_start


def prune_ranges(ranges: Ranges, horizon_ts: int | None) -> Ranges:
    """Drop ranges whose newest result is older than ``horizon_ts`` (no window reaches them).

    The last range is always kept: it anchors the current epoch.
    """
    if horizon_ts is None or len(ranges) <= 1:
        return ranges
    kept = tuple(r for r in ranges[:-1] if r.max_ts is None or r.max_ts >= horizon_ts)
    return (*kept, ranges[-1])
