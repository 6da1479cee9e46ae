"""What a restore asks of kafka-python, without a broker: a group-less reader over partition
logs, and a group consumer that answers committed offsets and records seeks."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata
from settable_clock import SettableClock

Rec = namedtuple("Rec", "offset key value")

#: one partition's log: offset -> (key, value); offsets missing are transaction markers
Log = dict[int, tuple[bytes | None, bytes | None]]


class FakeReader:
    """Partition logs ``logs`` from ``starts`` (default 0) to ``ends`` (default: one past the
    last record), served ``per_poll`` offsets per partition per poll; every poll advances
    ``clock`` by ``poll_s``; ``stuck``: polls return nothing and no position moves. A
    partition's high watermark is known once a poll has served it (kafka-python learns it from
    a fetch answer), and forgotten on ``assign``. ``listed_ends`` is what ListOffsets answers
    (default: the true ends; tansu's lags behind its last batch)."""

    def __init__(
        self,
        logs: dict[TopicPartition, Log],
        clock: SettableClock,
        *,
        ends: dict[TopicPartition, int] | None = None,
        starts: dict[TopicPartition, int] | None = None,
        listed_ends: dict[TopicPartition, int] | None = None,
        per_poll: int = 2,
        poll_s: float = 1.0,
        stuck: bool = False,
    ) -> None:
        self.logs, self.clock = logs, clock
        self.ends = {tp: max(log, default=-1) + 1 for tp, log in logs.items()}
        self.ends.update(ends or {})
        self.starts = dict(starts or {})
        self.listed_ends = dict(listed_ends or {})
        self.per_poll, self.poll_s, self.stuck = per_poll, poll_s, stuck
        self.assigned: list[TopicPartition] = []
        self.pos: dict[TopicPartition, int] = {}
        self.high: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()
        self.polls = 0
        self.closed = False

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = list(tps)
        self.high = {}  # kafka-python keeps a partition's state only across assignments
        self.paused &= set(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos[tp] = offset

    def position(self, tp: TopicPartition) -> int:
        return self.pos[tp]

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.high.get(tp)

    def pause(self, tp: TopicPartition) -> None:
        self.paused.add(tp)

    def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.starts.get(tp, 0) for tp in tps}

    def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.listed_ends.get(tp, self.ends.get(tp, 0)) for tp in tps}

    def close(self, **_: Any) -> None:
        self.closed = True

    def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        self.clock.now += self.poll_s
        self.polls += 1
        if self.stuck:
            return {}
        out = {}
        for tp in self.assigned:
            if tp in self.paused:
                continue
            end = self.ends.get(tp, 0)
            self.high[tp] = end
            if self.pos[tp] < self.starts.get(tp, 0) or self.pos[tp] > end:
                self.pos[tp] = end  # out of range: reset to the latest offset
            batch = []
            log = self.logs.get(tp, {})
            for _ in range(self.per_poll):  # records or markers: per_poll offsets a poll
                if self.pos[tp] >= end:
                    break
                if self.pos[tp] in log:
                    key, value = log[self.pos[tp]]
                    batch.append(Rec(self.pos[tp], key, value))
                self.pos[tp] += 1
            if batch:
                out[tp] = batch
        return out


class FakeGroupConsumer:
    """The group's committed offsets (``offsets``: tp -> offset) and the seeks a restore
    makes."""

    def __init__(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        self.offsets = dict(offsets or {})
        self.seeks: dict[TopicPartition, int] = {}
        self.fetches = 0

    def committed(
        self, tp: TopicPartition, metadata: bool = False, timeout_ms: int | None = None
    ) -> Any:
        self.fetches += 1
        offset = self.offsets.get(tp)
        if offset is None:
            return None
        return OffsetAndMetadata(offset, "", -1) if metadata else offset

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp] = offset
