"""Reading state back, driven by a fake reader: many partitions in one read, the
progress-based deadline (an injectable clock), transaction markers, logs that end early."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_reader import FakeReader
from kafka import TopicPartition
from settable_clock import SettableClock

from evald.daemon.main.state_reads import Progress, RestoreError, read_spans

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def collect(reader: FakeReader, spans: dict[TopicPartition, list[tuple[int, int]]], **kw: Any):
    progress = Progress(stall_s=kw.pop("stall_s", 30), clock=reader.clock, **kw)
    got: list[tuple[int, int]] = []
    short = read_spans(
        reader,  # type: ignore[arg-type]
        spans,
        progress,
        lambda tp, record: got.append((tp.partition, record.offset)),
    )
    return got, short, progress


def test_many_partitions_are_read_together_not_one_after_another() -> None:
    """64 partitions of 10 records, 2 offsets each per poll: 5 polls in all, where reading one
    partition after another took 64 x 5."""
    clock = SettableClock()
    tps = [TopicPartition("t", p) for p in range(64)]
    logs = {tp: {o: (b"k", b"{}") for o in range(10)} for tp in tps}
    reader = FakeReader(logs, clock)
    got, short, progress = collect(reader, {tp: [(0, 10)] for tp in tps})
    assert sorted(got) == [(p, o) for p in range(64) for o in range(10)]
    for p in range(64):  # in offset order within a partition
        assert [o for q, o in got if q == p] == list(range(10))
    assert reader.polls == 5 and short == {} and progress.records == 640


def test_spans_of_one_partition_are_read_in_order_and_gaps_skipped() -> None:
    clock = SettableClock()
    reader = FakeReader({A: {o: (b"k", b"x") for o in range(30)}}, clock, per_poll=4)
    got, _, _ = collect(reader, {A: [(20, 23), (2, 5), (10, 11)]})
    assert [o for _, o in got] == [2, 3, 4, 10, 20, 21, 22]


def test_a_long_read_that_keeps_moving_never_times_out() -> None:
    """10,000 records at one per second of fake time: far past any fixed deadline."""
    clock = SettableClock()
    values = {o: json.dumps({"n": o}).encode() for o in range(10_000)}
    reader = FakeReader({A: {o: (b"k", v) for o, v in values.items()}}, clock, per_poll=1)
    got, _, progress = collect(reader, {A: [(0, 10_000)]})
    assert len(got) == 10_000
    assert clock.now - 1_000 >= 10_000
    assert progress.bytes == sum(len(v) + 1 for v in values.values())


def test_a_read_without_progress_fails_after_the_stall_time() -> None:
    clock = SettableClock()
    reader = FakeReader({A: {0: (b"k", b"{}")}}, clock, ends={A: 5}, stuck=True)
    with pytest.raises(RestoreError, match=r"t\[0\] 0..5: no progress for 30s"):
        collect(reader, {A: [(0, 5)]})
    assert 30 <= reader.polls <= 32  # failed right after the stall time, not before


def test_markers_past_the_last_record_count_as_progress_and_end_the_read() -> None:
    clock = SettableClock()
    # records at 0..3, then transaction markers up to 40: position moves, nothing returned
    log = {o: (b"k", b"{}") for o in range(4)}
    reader = FakeReader({A: log}, clock, ends={A: 40}, per_poll=1, poll_s=10)
    got, short, progress = collect(reader, {A: [(0, 40)]}, stall_s=15)
    assert len(got) == 4 and progress.records == 4 and short == {}
    assert clock.now - 1_000 >= 360  # 36 markers, one a poll: long past the stall time


def test_a_log_that_ends_before_the_span_is_reported_with_its_end() -> None:
    """A checkpoint at offset 50 of a partition that now ends at 12 (truncated, recreated):
    after half the stall time with nothing more to fetch (not the whole: the read is not
    stuck, the log ends), the read says where the log ends; the other partition is read
    whole."""
    clock = SettableClock()
    logs = {A: {o: (b"k", b"x") for o in range(12)}, B: {o: (b"k", b"y") for o in range(3)}}
    reader = FakeReader(logs, clock)
    got, short, _ = collect(reader, {A: [(5, 60)], B: [(0, 3)]}, stall_s=30)
    assert short == {A: 12}
    assert [o for p, o in got if p == 0] == list(range(5, 12))
    assert [o for p, o in got if p == 1] == [0, 1, 2]
    assert 15 <= reader.polls <= 22  # 4 polls to reach 12, then 15 s of the fake clock


def test_a_high_watermark_behind_for_a_moment_is_waited_out() -> None:
    """A broker restarted after a crash reports a high watermark below what it had committed
    for a moment: the record comes once it catches up, nothing is reported short."""
    clock = SettableClock()
    reader = FakeReader({A: {o: (b"k", b"x") for o in range(10)}}, clock, ends={A: 4})
    progress = Progress(stall_s=30, clock=clock)
    got: list[int] = []

    def take(tp: TopicPartition, record: Any) -> None:
        got.append(record.offset)

    polls = reader.poll

    def catching_up(timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        if reader.polls == 8:
            reader.ends[A] = 10  # the high watermark catches up with the log
        return polls(timeout_ms, max_records)

    reader.poll = catching_up  # type: ignore[method-assign]
    short = read_spans(reader, {A: [(0, 10)]}, progress, take)  # type: ignore[arg-type]
    assert short == {} and got == list(range(10))


def test_on_record_can_end_a_span_early() -> None:
    clock = SettableClock()
    reader = FakeReader({A: {o: (b"k", b"x") for o in range(100)}}, clock, per_poll=10)
    progress = Progress(stall_s=30, clock=clock)
    got: list[int] = []

    def first_odd(tp: TopicPartition, record: Any) -> bool:
        got.append(record.offset)
        return record.offset % 2 == 1

    read_spans(reader, {A: [(0, 100)]}, progress, first_odd)  # type: ignore[arg-type]
    assert got == [0, 1] and reader.polls == 1


def test_a_moving_read_beats_the_liveness_heartbeat() -> None:
    clock = SettableClock()
    beats: list[float] = []
    reader = FakeReader({A: {o: (b"k", b"{}") for o in range(50)}}, clock, per_poll=5)
    got, _, _ = collect(reader, {A: [(0, 50)]}, heartbeat=lambda: beats.append(clock.now))
    assert len(got) == 50
    assert len(beats) >= 50 and beats[-1] - 1_000 >= 10
