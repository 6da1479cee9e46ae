"""Per-partition checkpoints, written to the checkpoint topic inside each commit transaction.

Why a topic and not the offset-commit metadata: the broker the integration tests run against
(tansu) accepts but does not store commit metadata, and it does not filter records of aborted
transactions from ``read_committed`` fetches. So a checkpoint record alone cannot be trusted (an
aborted one is visible too). What *is* reliable there and on Apache Kafka: consumer-group offsets
committed by ``send_offsets_to_transaction`` move if and only if the transaction commits. Each
transaction therefore commits, next to the input offsets, the offset *of the checkpoint record
itself* (checkpoint topic, partition p) + 1: the committed checkpoint of p is the record just
before the group's committed offset on the checkpoint topic. See docs/design.md.

The checkpoint also lists the offset ranges of the results partition p written by committed
transactions, so window aggregates can be rebuilt from exactly the committed results even where
aborted records stay visible. Since version 2 it can point at a snapshot of p's window
aggregates (records of the checkpoint topic written by a committed transaction); the ranges
then hold only the results written after that snapshot, so a restore reads an amount bounded
by the state, not by the uptime (docs/design.md, "Restart cost"). Version 2 also lists the
impression offsets the pending cap closed early (``evicted``), which a replay must skip (and,
optional, ``evicted_feedback``: the event offsets a replay must skip with lists of several
records, docs/design.md; an older reader ignores it), the optional ``held_feedback``: the
feedback offsets held at the checkpoint whose outcome a restore still has to count (absent:
none, or an older writer; an older reader ignores it), and,
with comparisons configured, the partition's comparison shares not final yet (``statistics``,
an optional field: older readers ignore it; docs/design.md, "Statistics over all partitions"),
with interleaving teams declared its open credit shares under ``statistics.interleaving``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from evald.join.clock import EventTimes
from evald.partition_state import MAX_HELD_RUNS, PartitionState, Runs, from_runs, to_runs

__all__ = [
    "MAX_HELD_RUNS",
    "VERSION",
    "Checkpoint",
    "ResultRange",
    "SnapshotRef",
    "from_runs",
    "to_runs",
]

VERSION = 2
#: versions :meth:`Checkpoint.decode` reads (a version 1 checkpoint restores through its ranges)
READABLE = (1, 2)


@dataclass(frozen=True)
class ResultRange:
    """Offsets ``[start, end)`` of results partition p written by committed transactions.

    ``max_ts`` is the largest event time (ms) of a result in the range, used to forget ranges
    that no aggregate window can reach any more.
    """

    start: int
    end: int
    max_ts: int | None = None


@dataclass(frozen=True)
class SnapshotRef:
    """Where partition p's window-aggregate snapshot is: its records' offsets in checkpoint
    topic partition p (chunks, in order), the snapshot's size and CRC-32, and when it was
    written (wall ms, so an old one is renewed before the topic's retention can reach it)."""

    offsets: tuple[int, ...]
    size: int
    crc32: int
    written_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "offsets": list(self.offsets),
            "size": self.size,
            "crc32": self.crc32,
            "written_ms": self.written_ms,
        }

    @classmethod
    def from_json(cls, doc: Any) -> SnapshotRef | None:
        if doc is None:
            return None
        offsets = tuple(int(o) for o in doc["offsets"])
        if not offsets or list(offsets) != sorted(set(offsets)):
            raise ValueError("snapshot offsets must be increasing and not empty")
        return cls(offsets, int(doc["size"]), int(doc["crc32"]), int(doc["written_ms"]))


@dataclass(frozen=True)
class Checkpoint:
    """What restart needs to resume partition p exactly where the last commit left it: the
    engine's state of p (``state``, evald/partition_state.py) and what only the daemon knows.

    ``consumed``: the next offset the engine had not yet seen (kind -> offset); records between
    ``state.committed`` and ``consumed`` are replayed to rebuild pending joins, not counted
    again. ``epoch_start``: first results offset of the current ownership epoch, or None before
    the epoch wrote any result (see :func:`extend_ranges`). ``snapshot``: the records of p's
    window aggregates; ``results`` then hold only the results written after it.
    """

    partition: int
    state: PartitionState
    consumed: dict[str, int]
    results: tuple[ResultRange, ...] = ()
    epoch_start: int | None = None
    instance: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    snapshot: SnapshotRef | None = None

    @classmethod
    def of(
        cls,
        partition: int,
        watermark: int | None,
        committed: dict[str, int],
        consumed: dict[str, int],
        *,
        event_times: EventTimes | None = None,
        evicted: Runs = (),
        evicted_feedback: Runs = (),
        held_feedback: Runs = (),
        statistics: dict[str, Any] | None = None,
        **daemon: Any,
    ) -> Checkpoint:
        """A checkpoint from the fields of both halves (tests and benchmarks write them so)."""
        state = PartitionState(
            watermark, committed, event_times, evicted, evicted_feedback, held_feedback, statistics
        )
        return cls(partition, state, consumed, **daemon)

    # the engine's half, read through the checkpoint
    @property
    def watermark(self) -> int | None:
        return self.state.watermark

    @property
    def committed(self) -> dict[str, int]:
        return self.state.committed

    @property
    def event_times(self) -> EventTimes | None:
        return self.state.event_times

    @property
    def evicted(self) -> Runs:
        return self.state.evicted

    @property
    def evicted_feedback(self) -> Runs:
        return self.state.evicted_feedback

    @property
    def held_feedback(self) -> Runs:
        return self.state.held_feedback

    @property
    def statistics(self) -> dict[str, Any] | None:
        return self.state.statistics

    def encode(self) -> bytes:
        """Compact JSON bytes (the value of the checkpoint record)."""
        doc: dict[str, Any] = {
            "v": VERSION,
            "partition": self.partition,
            "consumed": self.consumed,
            "results": [[r.start, r.end, r.max_ts] for r in self.results],
            "epoch_start": self.epoch_start,
            "instance": self.instance,
            **self.state.to_json(),
        }
        if self.extra:
            doc["extra"] = self.extra
        if self.snapshot is not None:
            doc["snapshot"] = self.snapshot.to_json()
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Checkpoint:
        """Parse :meth:`encode` output; raises ValueError on anything else."""
        try:
            doc = json.loads(raw)
            if doc.get("v") not in READABLE:
                raise ValueError(f"unsupported checkpoint version {doc.get('v')!r}")
            return cls(
                partition=int(doc["partition"]),
                state=PartitionState.from_json(doc),
                consumed={str(k): int(v) for k, v in doc["consumed"].items()},
                results=tuple(
                    ResultRange(int(s), int(e), None if t is None else int(t))
                    for s, e, t in doc["results"]
                ),
                epoch_start=None if doc.get("epoch_start") is None else int(doc["epoch_start"]),
                instance=str(doc.get("instance", "")),
                extra=dict(doc.get("extra") or {}),
                snapshot=SnapshotRef.from_json(doc.get("snapshot")),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed checkpoint: {exc!r}") from None
