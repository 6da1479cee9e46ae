"""Reading state back from Kafka when a partition is assigned: its checkpoint and its results.

Both reads use a group-less consumer with ``read_uncommitted`` on purpose: what is committed is
decided by the group offsets and the checkpoint's result ranges (see checkpoint.py), and a
``read_committed`` read would stall behind the open transaction of a crashed instance until
the broker times it out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from evald.daemon.checkpoint import Checkpoint, ResultRange

__all__ = ["RestoreError", "read_checkpoint", "read_ranges"]


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
