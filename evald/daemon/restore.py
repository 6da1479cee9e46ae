"""Reading state back from Kafka when a partition is assigned: its checkpoint, the snapshot of
its window aggregates and the results written after that snapshot.

Every read uses a group-less consumer with ``read_uncommitted`` on purpose: what is committed
is decided by the group offsets and the checkpoint's references (see checkpoint.py), and a
``read_committed`` read would stall behind the open transaction of a crashed instance until
the broker times it out.

There is no overall deadline: a large but valid state may take long to read. A read fails
(a transient error: the session retries) only when it makes no progress for ``stall_s``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError

from evald.daemon.checkpoint import Checkpoint, ResultRange, SnapshotRef, from_runs
from evald.daemon.crash import crash_point
from evald.daemon.inputs import Inputs, Part
from evald.daemon.logs import event_time
from evald.daemon.merge import KINDS
from evald.daemon.settings import TopicSettings
from evald.daemon.snapshots import whole
from evald.daemon.topics import TopicGuard
from evald.engine import Engine

__all__ = [
    "RESTORE_STALL_S",
    "Progress",
    "RestoreError",
    "read_checkpoint",
    "read_ranges",
    "read_snapshot",
    "restore_partition",
]

log = logging.getLogger("evald.daemon")

#: a restore read that makes no progress for this long fails (transient); no overall deadline
RESTORE_STALL_S = 60.0


class RestoreError(RuntimeError):
    """State could not be read back (no progress, missing record; a transient error)."""


class Progress:
    """What one restore read (records, bytes), and its stall deadline: ``check`` fails only
    when nothing moved for ``stall_s`` seconds of ``clock``. ``heartbeat`` is called on every
    move: a long restore that keeps moving is alive (the liveness check must not kill it)."""

    def __init__(
        self,
        stall_s: float,
        clock: Callable[[], float] = time.monotonic,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> None:
        self.stall_s = stall_s
        self.records = 0
        self.bytes = 0
        self._clock = clock
        self._beat = heartbeat
        self._moved_at = clock()

    def moved(self, records: int = 0, nbytes: int = 0) -> None:
        """Something arrived (records, or the position advanced past markers)."""
        self.records += records
        self.bytes += nbytes
        self._moved_at = self._clock()
        self._beat()

    def check(self, what: str) -> None:
        """Raise RestoreError when the read has been stuck for ``stall_s``."""
        if self._clock() - self._moved_at > self.stall_s:
            raise RestoreError(f"reading {what}: no progress for {self.stall_s:g}s")


def _records(
    reader: KafkaConsumer, tp: TopicPartition, start: int, end: int, progress: Progress
) -> Iterator[Any]:
    """Yield the records of ``tp`` with offsets in ``[start, end)``, in order."""
    if start >= end:
        return
    reader.assign([tp])
    reader.seek(tp, start)
    next_offset = start
    position = start
    progress.moved()  # the deadline counts from the start of this read
    while next_offset < end:
        progress.check(f"{tp.topic}[{tp.partition}] {next_offset}..{end}")
        batch = reader.poll(timeout_ms=200, max_records=5_000).get(tp, [])
        for record in batch:
            if record.offset < next_offset:
                continue
            if record.offset >= end:
                return
            next_offset = record.offset + 1
            progress.moved(1, len(record.value or b"") + len(record.key or b""))
            yield record
        if not batch:
            # transaction markers occupy offsets but are never returned: stop at the end
            now = reader.position(tp)
            if now is not None and now >= end:
                return
            if now is not None and now > position:
                position = now
                progress.moved()


def read_checkpoint(
    reader: KafkaConsumer, topic: str, partition: int, committed: int, progress: Progress
) -> Checkpoint:
    """The checkpoint record at ``committed - 1`` of the checkpoint topic partition."""
    tp = TopicPartition(topic, partition)
    for record in _records(reader, tp, committed - 1, committed, progress):
        checkpoint = Checkpoint.decode(record.value)
        if checkpoint.partition != partition:
            raise RestoreError(
                f"checkpoint at {topic}[{partition}]@{record.offset} is for "
                f"partition {checkpoint.partition}"
            )
        return checkpoint
    raise RestoreError(f"no checkpoint record at {topic}[{partition}]@{committed - 1}")


def read_snapshot(
    reader: KafkaConsumer, topic: str, partition: int, ref: SnapshotRef, progress: Progress
) -> bytes:
    """The snapshot the checkpoint names: its chunk records of the checkpoint topic partition,
    joined and checked against the size and CRC-32 the checkpoint recorded."""
    tp = TopicPartition(topic, partition)
    wanted = set(ref.offsets)
    parts = {
        record.offset: record.value
        for record in _records(reader, tp, ref.offsets[0], ref.offsets[-1] + 1, progress)
        if record.offset in wanted
    }
    missing = sorted(wanted - set(parts))
    if missing:
        raise RestoreError(f"snapshot records missing at {topic}[{partition}]@{missing}")
    try:
        return whole([parts[offset] for offset in ref.offsets], ref)
    except ValueError as exc:
        raise RestoreError(str(exc)) from None


def read_ranges(
    reader: KafkaConsumer,
    topic: str,
    partition: int,
    ranges: tuple[ResultRange, ...],
    progress: Progress,
) -> Iterator[Any]:
    """The committed results of one partition, decoded, range by range in offset order; a
    record that is not JSON comes as None (the caller counts it, the restore goes on)."""
    tp = TopicPartition(topic, partition)
    for result_range in ranges:
        for record in _records(reader, tp, result_range.start, result_range.end, progress):
            try:
                yield json.loads(record.value)
            except (ValueError, TypeError):  # not JSON, not UTF-8, or a tombstone
                yield None


def committed_offset(consumer: KafkaConsumer, tp: TopicPartition, wait_s: float) -> int | None:
    """The group's committed offset on ``tp``, or RestoreError after ``wait_s``.

    Why bounded: kafka-python retries OffsetFetch without end while the group coordinator is
    away or answers that a transaction still holds offsets of the group (``require_stable``: a
    dead instance's transaction, aborted only at its timeout). The restore runs holding the
    engine, so the loop would hang with it; failing lets the next session try again."""
    timeout_ms = int(wait_s * 1000)
    try:
        offset = consumer.committed(tp, timeout_ms=timeout_ms)
    except KafkaTimeoutError as exc:
        raise RestoreError(
            f"the group's committed offset of {tp.topic}/{tp.partition} not answered within "
            f"{timeout_ms / 1000:g}s (group coordinator away, or an open transaction of another "
            "instance still holds the group's offsets)"
        ) from exc
    return None if offset is None else int(offset)


def restore_partition(
    part: Part,
    *,
    consumer: KafkaConsumer,
    reader: KafkaConsumer,
    engine: Engine,
    topics: TopicSettings,
    guard: TopicGuard,
    inputs: Inputs,
    clock: Callable[[], float],
    heartbeat: Callable[[], None] = lambda: None,
    stall_s: float = RESTORE_STALL_S,
    offset_wait_s: float = RESTORE_STALL_S,
) -> None:
    """Resume ``part`` from its committed checkpoint (or from the start of both inputs).

    1. Read the group's committed offset *c* on the checkpoint topic (crash point
       ``restore``), waiting at most ``offset_wait_s``; without one, start both inputs from
       their beginning.
    2. Read the checkpoint at *c - 1*; refuse (exit 2) one written against other input topics.
    3. Restore the engine's watermark, consumed offsets and the impressions the cap evicted,
       and its comparison shares not final yet; load the checkpoint's snapshot of the window
       aggregates (if any) and absorb the committed results of its ranges, written after that
       snapshot.
    4. Seek both inputs to the committed offsets; records up to the consumed ones are replayed
       to rebuild pending joins.
    """
    p = part.partition
    started = clock()
    ckpt_tp = TopicPartition(topics.checkpoint_topic, p)
    committed = committed_offset(consumer, ckpt_tp, offset_wait_s)
    crash_point("restore")
    if committed:
        progress = Progress(stall_s, clock, heartbeat)
        checkpoint = read_checkpoint(reader, topics.checkpoint_topic, p, committed, progress)
        guard.check_checkpoint(checkpoint.extra.get("topic_ids"), p)
        engine.restore(
            p,
            checkpoint.watermark,
            dict(checkpoint.consumed),
            checkpoint.event_times,
            from_runs(checkpoint.evicted),
            from_runs(checkpoint.evicted_feedback),
        )
        if engine.shares is not None:  # the comparison shares not final at the checkpoint
            statistics = _open_shares(reader, topics, checkpoint, progress)
            engine.shares.load(p, statistics, checkpoint.watermark)
        absorbed = _rebuild_windows(reader, engine, topics, checkpoint, progress)
        start = dict(checkpoint.committed)
        part.replay_end = dict(checkpoint.consumed)
        part.ranges, part.snapshot = checkpoint.results, checkpoint.snapshot
        log.info(
            "partition %d restored: watermark %s, replay from %s to %s, snapshot of %s "
            "bytes, %d results absorbed, %d records (%d bytes) read in %.2fs",
            p,
            event_time(checkpoint.watermark),
            start,
            checkpoint.consumed,
            "no" if checkpoint.snapshot is None else checkpoint.snapshot.size,
            absorbed,
            progress.records,
            progress.bytes,
            clock() - started,
        )
    else:
        start = {}
        for kind in KINDS:
            tp = inputs.tp(kind, p)
            start[kind] = consumer.beginning_offsets([tp])[tp]
        part.replay_end = dict(start)
    part.epoch_start = None
    for kind in KINDS:
        consumer.seek(inputs.tp(kind, p), start[kind])
    part.fed_next = dict(start)
    part.fetched_next = dict(start)
    part.merger.clear()
    part.restored = True


def _open_shares(
    reader: KafkaConsumer, topics: TopicSettings, checkpoint: Checkpoint, progress: Progress
) -> Any:
    """The checkpoint's open comparison shares: inline, or in the records it names."""
    statistics = checkpoint.statistics
    if isinstance(statistics, dict) and "records" in statistics:
        p = checkpoint.partition
        try:
            ref = SnapshotRef.from_json(statistics["records"])
            if ref is None:
                raise ValueError("no records named")
        except (KeyError, TypeError, ValueError) as exc:
            raise RestoreError(f"checkpoint of partition {p}: bad statistics: {exc}") from None
        raw = read_snapshot(reader, topics.checkpoint_topic, p, ref, progress)
        log.info(
            "partition %d: open comparison shares read from %d records (%d bytes)",
            p,
            len(ref.offsets),
            ref.size,
        )
        return json.loads(raw)
    return statistics


def _rebuild_windows(
    reader: KafkaConsumer,
    engine: Engine,
    topics: TopicSettings,
    checkpoint: Checkpoint,
    progress: Progress,
) -> int:
    """The partition's window aggregates as committed: the checkpoint's snapshot (if any),
    then the results written after it; returns how many results were absorbed."""
    p = checkpoint.partition
    if checkpoint.snapshot is not None:
        raw = read_snapshot(reader, topics.checkpoint_topic, p, checkpoint.snapshot, progress)
        try:
            engine.load_snapshot(p, raw)
        except ValueError as exc:
            raise RestoreError(f"snapshot of partition {p}: {exc}") from None
    absorbed = unreadable = 0
    for doc in read_ranges(reader, topics.results, p, checkpoint.results, progress):
        if engine.absorb_result(doc, p):
            absorbed += 1
        else:
            unreadable += 1
    if unreadable:
        # only evald writes these ranges: a record that is not a result means another writer
        log.warning(
            "partition %d: %d records in the committed result ranges of %s are not results; "
            "left out of the window aggregates (does another producer write to that topic?)",
            p,
            unreadable,
            topics.results,
        )
    return absorbed
