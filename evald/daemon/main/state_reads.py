"""Reading evald's own records back from Kafka, for every partition a restore takes on at once.

A restore reads, per partition, its checkpoint record, the snapshot and open-shares records the
checkpoint names and the committed result ranges. Read one partition after another, that is a
few round trips per partition, and 64 partitions took half a minute. Here one group-less
reader is assigned every partition a step needs, each seeked to the first offset wanted, so one
fetch request serves them all and a step costs about the same for 1 or 64 partitions
(docs/performance.md §11).

Every read uses ``read_uncommitted`` on purpose: what is committed is decided by the group
offsets and the checkpoint's references (see checkpoint.py), and a ``read_committed`` read would
stall behind the open transaction of a crashed instance until the broker times it out.

There is no overall deadline: a large but valid state may take long to read. A read fails (a
transient error: the session retries) only when nothing moved for ``stall_s``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kafka import KafkaConsumer, TopicPartition

__all__ = ["Progress", "RestoreError", "Span", "read_spans"]

#: offsets ``[start, end)`` of one partition
Span = tuple[int, int]
#: records a poll may hand back (all partitions together)
POLL_RECORDS = 5_000
POLL_MS = 200


class RestoreError(RuntimeError):
    """State could not be read back (no progress, the coordinator away; a transient error)."""


class Progress:
    """What a restore read (records, bytes), and its stall deadline: ``check`` fails only when
    nothing moved for ``stall_s`` seconds of ``clock``. ``heartbeat`` is called on every move:
    a long restore that keeps moving is alive (the liveness check must not kill it)."""

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
        """Something arrived (records, or a position advanced past markers)."""
        self.records += records
        self.bytes += nbytes
        self._moved_at = self._clock()
        self._beat()

    def now(self) -> float:
        """The clock the stall deadline is counted on."""
        return self._clock()

    def check(self, what: str) -> None:
        """Raise RestoreError when the read has been stuck for ``stall_s``."""
        if self._clock() - self._moved_at > self.stall_s:
            raise RestoreError(f"reading {what}: no progress for {self.stall_s:g}s")


def read_spans(
    reader: KafkaConsumer,
    spans: Mapping[TopicPartition, Sequence[Span]],
    progress: Progress,
    on_record: Callable[[TopicPartition, Any], bool | None],
) -> dict[TopicPartition, int]:
    """Hand every record in ``spans`` to ``on_record(tp, record)``, in offset order within a
    partition, all partitions read together. ``on_record`` returning True ends that span early.

    Returns the partitions whose log ends before a span's end: partition -> the high
    watermark the broker reported (from fetches answered after this call's seeks, so never a
    stale one), once it stayed short of the span for half the stall time: a broker just
    restarted after a crash, or a new leader, can report a high watermark below what it had
    committed for a moment. A span can also end with fewer records than offsets: transaction
    markers take offsets and are never returned, and compaction leaves gaps.
    """
    todo = {tp: deque(sorted(s for s in wanted if s[0] < s[1])) for tp, wanted in spans.items()}
    todo = {tp: queue for tp, queue in todo.items() if queue}
    short: dict[TopicPartition, int] = {}
    if not todo:
        return short
    reader.assign([])  # forget the partitions' old states: their high watermarks are stale
    reader.assign(list(todo))
    next_at: dict[TopicPartition, int] = {}
    for tp, queue in todo.items():
        next_at[tp] = queue[0][0]
        reader.seek(tp, queue[0][0])
    seen_at = dict(next_at)
    #: when each partition was first seen with nothing more to fetch short of its span
    ending: dict[TopicPartition, float] = {}
    progress.moved()  # the deadline counts from the start of this read
    while todo:
        progress.check(_describe(todo))
        batches = reader.poll(timeout_ms=POLL_MS, max_records=POLL_RECORDS)
        for tp, records in batches.items():
            if tp in todo:
                ending.pop(tp, None)
                _take(reader, todo, next_at, tp, records, progress, on_record)
        for tp in list(todo):
            if not batches.get(tp):
                _check_position(reader, todo, next_at, seen_at, ending, short, tp, progress)
    return short


def _take(
    reader: KafkaConsumer,
    todo: dict[TopicPartition, deque[Span]],
    next_at: dict[TopicPartition, int],
    tp: TopicPartition,
    records: list[Any],
    progress: Progress,
    on_record: Callable[[TopicPartition, Any], bool | None],
) -> None:
    """One poll's records of ``tp``: those inside the current span go to ``on_record``."""
    i = 0
    while i < len(records) and tp in todo:
        record = records[i]
        end = todo[tp][0][1]
        if record.offset >= end:
            _next_span(reader, todo, next_at, tp)  # then the same record against the next
            continue
        i += 1
        if record.offset < next_at[tp]:
            continue  # before the span (fetched before the seek), or handed out already
        next_at[tp] = record.offset + 1
        progress.moved(1, len(record.value or b"") + len(record.key or b""))
        if on_record(tp, record) or next_at[tp] >= end:
            _next_span(reader, todo, next_at, tp)


def _check_position(
    reader: KafkaConsumer,
    todo: dict[TopicPartition, deque[Span]],
    next_at: dict[TopicPartition, int],
    seen_at: dict[TopicPartition, int],
    ending: dict[TopicPartition, float],
    short: dict[TopicPartition, int],
    tp: TopicPartition,
    progress: Progress,
) -> None:
    """A poll returned nothing for ``tp``: transaction markers may have moved its position to
    the span's end, or the log may end before it (taken so once that held for half the stall
    time)."""
    end = todo[tp][0][1]
    position = reader.position(tp)
    if position is None:
        return
    if position >= end:
        ending.pop(tp, None)
        _next_span(reader, todo, next_at, tp)
        return
    high = reader.highwater(tp)
    if high is not None and position >= high:
        since = ending.setdefault(tp, progress.now())
        if progress.now() - since >= progress.stall_s / 2:
            short[tp] = high  # nothing more to fetch: the log ends before the span does
            while tp in todo:
                _next_span(reader, todo, next_at, tp)
        return
    ending.pop(tp, None)
    if position > seen_at[tp]:
        seen_at[tp] = position
        progress.moved()


def _next_span(
    reader: KafkaConsumer,
    todo: dict[TopicPartition, deque[Span]],
    next_at: dict[TopicPartition, int],
    tp: TopicPartition,
) -> None:
    """The current span of ``tp`` is done: seek to its next one, or stop fetching it."""
    queue = todo[tp]
    queue.popleft()
    if queue:
        start = queue[0][0]
        next_at[tp] = max(next_at[tp], start)
        reader.seek(tp, next_at[tp])
    else:
        del todo[tp]
        reader.pause(tp)


def _describe(todo: Mapping[TopicPartition, deque[Span]]) -> str:
    """The spans still being read, for a stall's message."""
    shown = [f"{tp.topic}[{tp.partition}] {q[0][0]}..{q[0][1]}" for tp, q in list(todo.items())]
    more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
    return ", ".join(shown[:3]) + more
