"""Reading state back, driven by a fake reader: the progress-based deadline (an injectable
clock), snapshots assembled from their chunk records and checked."""

from __future__ import annotations

import json
import zlib
from collections import namedtuple
from typing import Any

import pytest
from kafka import TopicPartition
from settable_clock import SettableClock

from evald.config import EngineConfig
from evald.daemon.checkpoint import Checkpoint, ResultRange, SnapshotRef
from evald.daemon.restore import (
    Progress,
    RestoreError,
    read_checkpoint,
    read_ranges,
    read_snapshot,
)
from evald.engine import Engine

Rec = namedtuple("Rec", "offset key value")


class FakeReader:
    """A partition log of ``records`` (offset -> value; missing offsets are markers), served
    ``per_poll`` offsets per poll; every poll advances ``clock`` by ``poll_s``; ``stuck``:
    polls return nothing and the position does not move."""

    def __init__(
        self,
        records: dict[int, bytes],
        end: int,
        clock: SettableClock,
        *,
        per_poll: int = 2,
        poll_s: float = 1.0,
        stuck: bool = False,
    ) -> None:
        self.records, self.end, self.clock = records, end, clock
        self.per_poll, self.poll_s, self.stuck = per_poll, poll_s, stuck
        self.tp: TopicPartition | None = None
        self.pos = 0
        self.polls = 0

    def assign(self, tps: list[TopicPartition]) -> None:
        self.tp = tps[0]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos = offset

    def position(self, tp: TopicPartition) -> int:
        return self.pos

    def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        self.clock.now += self.poll_s
        self.polls += 1
        if self.stuck:
            return {}
        batch = []
        for _ in range(self.per_poll):  # records or markers: per_poll offsets a poll
            if self.pos >= self.end:
                break
            if self.pos in self.records:
                batch.append(Rec(self.pos, b"k", self.records[self.pos]))
            self.pos += 1
        assert self.tp is not None
        return {self.tp: batch} if batch else {}


def test_a_long_read_that_keeps_moving_never_times_out() -> None:
    """10,000 results at one per second of fake time: far past any fixed deadline."""
    clock = SettableClock()
    results = {o: json.dumps({"n": o}).encode() for o in range(10_000)}
    reader = FakeReader(results, 10_000, clock, per_poll=1)
    progress = Progress(stall_s=30, clock=clock)
    docs = list(read_ranges(reader, "res", 0, (ResultRange(0, 10_000),), progress))  # type: ignore[arg-type]
    assert [d["n"] for d in docs] == list(range(10_000))
    assert clock.now - 1_000 >= 10_000
    assert progress.records == 10_000
    assert progress.bytes == sum(len(v) + 1 for v in results.values())


def test_a_read_without_progress_fails_after_the_stall_time() -> None:
    clock = SettableClock()
    reader = FakeReader({0: b"{}"}, 5, clock, stuck=True, poll_s=1.0)
    progress = Progress(stall_s=30, clock=clock)
    with pytest.raises(RestoreError, match="no progress for 30s"):
        list(read_ranges(reader, "res", 0, (ResultRange(0, 5),), progress))  # type: ignore[arg-type]
    assert 30 <= reader.polls <= 32  # failed right after the stall time, not before


def test_markers_past_the_last_record_count_as_progress_and_end_the_read() -> None:
    clock = SettableClock()
    # records at 0..3, then transaction markers up to 40: position moves, nothing returned
    reader = FakeReader({o: b"{}" for o in range(4)}, 40, clock, per_poll=1, poll_s=10.0)
    progress = Progress(stall_s=15, clock=clock)
    docs = list(read_ranges(reader, "res", 0, (ResultRange(0, 40),), progress))  # type: ignore[arg-type]
    assert len(docs) == 4 and progress.records == 4
    assert clock.now - 1_000 >= 360  # 36 markers, one a poll: long past the stall time


def test_a_snapshot_is_joined_from_its_chunks_skipping_foreign_records() -> None:
    clock = SettableClock()
    raw = bytes(range(200)) * 3
    chunks = [raw[:250], raw[250:500], raw[500:]]
    log = {10: chunks[0], 11: b"someone else's checkpoint", 12: chunks[1], 13: chunks[2]}
    ref = SnapshotRef((10, 12, 13), len(raw), zlib.crc32(raw), 0)
    reader = FakeReader(log, 14, clock)
    progress = Progress(stall_s=5, clock=clock)
    assert read_snapshot(reader, "ckpt", 2, ref, progress) == raw  # type: ignore[arg-type]
    assert progress.records == 4  # the foreign record was read too
    broken = SnapshotRef((10, 12, 13), len(raw), zlib.crc32(raw) ^ 1, 0)
    with pytest.raises(RestoreError, match="CRC"):
        read_snapshot(FakeReader(log, 14, clock), "ckpt", 2, broken, progress)  # type: ignore[arg-type]
    gone = SnapshotRef((10, 12, 15), len(raw), zlib.crc32(raw), 0)
    with pytest.raises(RestoreError, match="missing"):
        read_snapshot(FakeReader(log, 16, clock), "ckpt", 2, gone, progress)  # type: ignore[arg-type]


def test_the_checkpoint_is_the_record_before_the_committed_offset() -> None:
    clock = SettableClock()
    cp = Checkpoint(partition=2, watermark=1, committed={}, consumed={})
    other = Checkpoint(partition=3, watermark=1, committed={}, consumed={})
    log = {0: other.encode(), 1: cp.encode()}
    progress = Progress(stall_s=5, clock=clock)
    assert read_checkpoint(FakeReader(log, 2, clock), "ckpt", 2, 2, progress) == cp  # type: ignore[arg-type]
    with pytest.raises(RestoreError, match="for partition 3"):
        read_checkpoint(FakeReader(log, 2, clock), "ckpt", 2, 1, progress)  # type: ignore[arg-type]


def test_a_moving_read_beats_the_liveness_heartbeat() -> None:
    clock = SettableClock()
    beats: list[float] = []
    reader = FakeReader({o: b"{}" for o in range(50)}, 50, clock, per_poll=5)
    progress = Progress(stall_s=30, clock=clock, heartbeat=lambda: beats.append(clock.now))
    assert len(list(read_ranges(reader, "res", 0, (ResultRange(0, 50),), progress))) == 50  # type: ignore[arg-type]
    assert len(beats) >= 50 and beats[-1] - 1_000 >= 10


def test_a_record_in_the_result_ranges_that_is_not_json_does_not_stop_the_restore() -> None:
    """Another producer's garbage in the results topic: the read goes on, the engine refuses
    what is not a result, and the real results around it are absorbed."""
    clock = SettableClock()
    result = json.dumps({"request_id": "r1", "ts": 1_000, "labels": {}, "measures": {"RR": 1.0}})
    records = {0: result.encode(), 1: b"\xff not json", 2: b"[1, 2]", 3: result.encode()}
    reader = FakeReader(records, 4, clock)
    progress = Progress(stall_s=60, clock=clock)
    docs = list(read_ranges(reader, "res", 0, (ResultRange(0, 4),), progress))  # type: ignore[arg-type]
    assert docs[1] is None and docs[2] == [1, 2]
    engine = Engine(EngineConfig(measures=["RR"]))
    assert [engine.absorb_result(doc, 0) for doc in docs] == [True, False, False, True]
