"""Reading state back from Kafka when a partition is assigned: its checkpoint and its results.

Both reads use a group-less consumer with ``read_uncommitted`` on purpose: what is committed is
decided by the group offsets and the checkpoint's result ranges (see checkpoint.py), and a
``read_committed`` read would stall behind the open transaction of a crashed instance until
the broker times it out.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from evald.daemon.checkpoint import Checkpoint, ResultRange
from evald.daemon.crash import crash_point
from evald.daemon.inputs import Inputs, Part
from evald.daemon.logs import event_time
from evald.daemon.merge import KINDS
from evald.daemon.settings import TopicSettings
from evald.daemon.topics import TopicGuard
from evald.engine import Engine

__all__ = [
    "RESTORE_TIMEOUT_S",
    "RestoreError",
    "read_checkpoint",
    "read_ranges",
    "restore_partition",
]

log = logging.getLogger("evald.daemon")

#: how long restoring one partition may take before the session is restarted
RESTORE_TIMEOUT_S = 120.0


class RestoreError(RuntimeError):
    """State could not be read back within the deadline (treated as a transient error)."""


def _records(
    reader: KafkaConsumer,
    tp: TopicPartition,
    start: int,
    end: int,
    deadline: float,
    clock: Callable[[], float],
) -> Iterator[Any]:
    """Yield the records of ``tp`` with offsets in ``[start, end)``, in order."""
    if start >= end:
        return
    reader.assign([tp])
    reader.seek(tp, start)
    next_offset = start
    while next_offset < end:
        if clock() > deadline:
            raise RestoreError(f"reading {tp.topic}[{tp.partition}] {next_offset}..{end} timed out")
        batch = reader.poll(timeout_ms=200, max_records=5_000).get(tp, [])
        for record in batch:
            if record.offset < next_offset:
                continue
            if record.offset >= end:
                return
            next_offset = record.offset + 1
            yield record
        if not batch:
            # transaction markers occupy offsets but are never returned: stop at the end
            position = reader.position(tp)
            if position is not None and position >= end:
                return


def read_checkpoint(
    reader: KafkaConsumer,
    topic: str,
    partition: int,
    committed: int,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> Checkpoint:
    """The checkpoint record at ``committed - 1`` of the checkpoint topic partition."""
    tp = TopicPartition(topic, partition)
    deadline = clock() + timeout_s
    for record in _records(reader, tp, committed - 1, committed, deadline, clock):
        checkpoint = Checkpoint.decode(record.value)
        if checkpoint.partition != partition:
            raise RestoreError(
                f"checkpoint at {topic}[{partition}]@{record.offset} is for "
                f"partition {checkpoint.partition}"
            )
        return checkpoint
    raise RestoreError(f"no checkpoint record at {topic}[{partition}]@{committed - 1}")


def read_ranges(
    reader: KafkaConsumer,
    topic: str,
    partition: int,
    ranges: tuple[ResultRange, ...],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[dict[str, Any]]:
    """The committed results of one partition, decoded, range by range in offset order."""
    tp = TopicPartition(topic, partition)
    deadline = clock() + timeout_s
    for result_range in ranges:
        for record in _records(reader, tp, result_range.start, result_range.end, deadline, clock):
            yield json.loads(record.value)


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
    timeout_s: float = RESTORE_TIMEOUT_S,
) -> None:
    """Resume ``part`` from its committed checkpoint (or from the start of both inputs).

    1. Read the group's committed offset *c* on the checkpoint topic (crash point
       ``restore``); without one, start both inputs from their beginning.
    2. Read the checkpoint at *c - 1*; refuse (exit 2) one written against other input topics.
    3. Restore the engine's watermark and consumed offsets, and absorb the committed results
       of its ranges (the window aggregates).
    4. Seek both inputs to the committed offsets; records up to the consumed ones are replayed
       to rebuild pending joins.
    """
    p = part.partition
    started = clock()
    ckpt_tp = TopicPartition(topics.checkpoint_topic, p)
    committed = consumer.committed(ckpt_tp)
    crash_point("restore")
    if committed:
        checkpoint = read_checkpoint(
            reader, topics.checkpoint_topic, p, committed, timeout_s, clock
        )
        guard.check_checkpoint(checkpoint.extra.get("topic_ids"), p)
        engine.restore(p, checkpoint.watermark, dict(checkpoint.consumed), checkpoint.event_times)
        absorbed = 0
        for doc in read_ranges(reader, topics.results, p, checkpoint.results, timeout_s, clock):
            engine.absorb_result(doc, p)
            absorbed += 1
        start = dict(checkpoint.committed)
        part.replay_end = dict(checkpoint.consumed)
        part.ranges = checkpoint.results
        log.info(
            "partition %d restored: watermark %s, replay from %s to %s, %d results "
            "absorbed in %.2fs",
            p,
            event_time(checkpoint.watermark),
            start,
            checkpoint.consumed,
            absorbed,
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
