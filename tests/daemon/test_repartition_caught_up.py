"""The repartition stage's release with a stale high watermark (issue #12).

The consumer of the first tests is a stand-in with kafka-python 3.0.x's fetcher hooks (the two
methods ``FetchWatch`` wraps, same signatures) and its ``highwater``/``position``, driven by
hand: the test plays the client's I/O thread (build a fetch request, answer it) and the stage's
cycle (buffer what a poll returned, release) in a fixed order, on a settable clock. The last
one does the same with kafka-python's real consumer and a real broker whose connections are cut.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka_harness import Broker, KafkaTools, TcpProxy, wait_until
from settable_clock import SettableClock

from evald.daemon.repartition.interleave import Interleaver
from evald.daemon.repartition.stage import HOLD_S, SourceWatch

IMP0, IMP1, FB0 = TopicPartition("imp", 0), TopicPartition("imp", 1), TopicPartition("fb", 0)
SOURCES = [FB0, IMP0, IMP1]
NOT_LEADER = 6


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    timestamp: int


class Fetcher:
    """kafka-python's Fetcher, as far as FetchWatch touches it: the last watermark each
    partition's answer reported is kept, however old (``consumer.highwater``)."""

    def __init__(self) -> None:
        self.highwater: dict[TopicPartition, int] = {}

    def _create_fetch_requests(self) -> dict[int, tuple[Any, dict[TopicPartition, int]]]:
        return {1: ("request", dict.fromkeys(SOURCES, 0))}

    def _handle_fetch_response(
        self,
        node_id: int,
        fetch_offsets: dict[TopicPartition, int],
        send_time: float,
        response: Any,
    ) -> None:
        for topic in response.responses:
            for data in topic.partitions:
                if data.error_code == 0:
                    tp = TopicPartition(topic.topic, data.partition_index)
                    self.highwater[tp] = data.high_watermark


class Consumer:
    """The calls the stage's release makes; ``positions`` move as records are "polled"."""

    def __init__(self) -> None:
        self._fetcher = Fetcher()
        self.positions = dict.fromkeys(SOURCES, 0)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._fetcher.highwater.get(tp)

    def position(self, tp: TopicPartition, timeout_ms: int | None = None) -> int:
        return self.positions[tp]


def fetch(
    consumer: Consumer, highs: dict[TopicPartition, int], errors: dict[TopicPartition, int]
) -> None:
    """One fetch round trip of every source partition: the request is built and answered now."""
    topics: dict[str, list[Any]] = {}
    for tp in SOURCES:
        topics.setdefault(tp.topic, []).append(
            SimpleNamespace(
                partition_index=tp.partition,
                error_code=errors.get(tp, 0),
                high_watermark=highs.get(tp, -1),
            )
        )
    answer = SimpleNamespace(
        error_code=0,
        throttle_time_ms=0,
        responses=[SimpleNamespace(topic=t, partitions=ps) for t, ps in topics.items()],
    )
    fetcher = consumer._fetcher
    for node_id, (_, offsets) in fetcher._create_fetch_requests().items():
        fetcher._handle_fetch_response(node_id, offsets, 0.0, answer)


class Stage:
    """The stage's buffer and its caught-up rule, as ``Repartitioner`` wires them."""

    def __init__(self, clock: SettableClock) -> None:
        self.consumer = Consumer()
        self.sources = SourceWatch(self.consumer, clock)
        self.buffer: Interleaver[TopicPartition] = Interleaver(
            HOLD_S, clock, rank=lambda tp: (tp.topic != "imp", tp.topic, tp.partition)
        )

    def poll(self, tp: TopicPartition, *timestamps: int) -> None:
        start = self.consumer.positions[tp]
        records = [Record(tp.topic, tp.partition, start + n, ts) for n, ts in enumerate(timestamps)]
        self.consumer.positions[tp] += len(records)
        self.buffer.extend(tp, records)

    def release(self) -> list[str]:
        return [
            f"{r.topic}{r.partition}@{r.timestamp}"
            for r in self.buffer.release(SOURCES, self.sources.caught_up)
        ]


def failover(clock: SettableClock) -> Stage:
    """Every source at its end at 100; a click (5000) arrives at 101 from fb-0; from 102 imp-1's
    fetches fail (its leader moves) while its impression (4000, written before the click) is
    on the new leader."""
    clock.now = 100.0
    stage = Stage(clock)
    fetch(stage.consumer, {IMP0: 0, IMP1: 0, FB0: 0}, {})
    clock.now = 101.0
    stage.poll(FB0, 5_000)
    clock.now = 102.0
    fetch(stage.consumer, {IMP0: 0, FB0: 1}, {IMP1: NOT_LEADER})
    return stage


def test_a_stale_watermark_holds_the_click_until_its_impression_is_fetched() -> None:
    clock = SettableClock()
    stage = failover(clock)
    clock.now = 101.0 + HOLD_S + 1.0
    # what the old rule read: imp-1's last watermark is reached, so it looked caught up
    assert stage.consumer.position(IMP1) >= stage.consumer.highwater(IMP1)  # type: ignore[operator]
    assert stage.release() == []
    clock.now = 104.5
    fetch(stage.consumer, {IMP0: 0, IMP1: 1, FB0: 1}, {})  # the new leader answers: one more
    assert stage.release() == []
    stage.poll(IMP1, 4_000)
    # imp-0 never sent a record: both heads wait for a fetch built after they arrived
    clock.now = 104.5 + HOLD_S
    fetch(stage.consumer, {IMP0: 0, IMP1: 1, FB0: 1}, {})
    assert stage.release() == ["imp1@4000", "fb0@5000"]


def test_a_fresh_answer_at_the_end_releases_the_held_click() -> None:
    clock = SettableClock()
    stage = failover(clock)
    clock.now = 104.0
    assert stage.release() == []
    fetch(stage.consumer, {IMP0: 0, IMP1: 0, FB0: 1}, {})  # built at 104: imp-1 holds nothing
    assert stage.release() == ["fb0@5000"]


def test_a_source_failing_for_good_holds_up_to_max_hold_s() -> None:
    clock = SettableClock()
    stage = failover(clock)
    max_hold_s = stage.buffer.max_hold_s
    clock.now = 101.0 + max_hold_s - 0.1
    fetch(stage.consumer, {IMP0: 0, FB0: 1}, {IMP1: NOT_LEADER})
    assert stage.release() == []
    clock.now = 101.0 + max_hold_s  # liveness: the stated bound of every wait
    assert stage.release() == ["fb0@5000"]


def test_a_source_behind_its_fresh_watermark_is_not_caught_up() -> None:
    clock = SettableClock(50.0)
    stage = Stage(clock)
    assert stage.sources.caught_up(IMP0) == float("-inf")  # no answer yet
    fetch(stage.consumer, {IMP0: 3, IMP1: 0, FB0: 0}, {})
    assert stage.sources.caught_up(IMP0) == float("-inf")
    assert stage.sources.caught_up(IMP1) == 50.0
    stage.poll(IMP0, 1, 2, 3)
    assert stage.sources.caught_up(IMP0) == 50.0


@pytest.mark.kafka
def test_a_real_fetch_failure_holds_the_click_until_a_later_fetch_answers(
    proxied_broker: tuple[Broker, TcpProxy], unique: str
) -> None:
    """kafka-python's real fetcher, a real broker behind a proxy: the proxy is cut after the
    consumer got a click and before the stage buffers it, so every fetch answered from then on
    was requested earlier. The impressions partition's last watermark is reached (the old rule
    read that as caught up and let the click go after ``hold_s``), but the click stays held
    until the proxy is back and a fetch built after its arrival answers."""
    broker, proxy = proxied_broker
    imp, fb = TopicPartition(f"rimp-{unique}", 0), TopicPartition(f"rfb-{unique}", 0)
    KafkaTools(broker.bootstrap).create({imp.topic: 1, fb.topic: 1})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=f"r-{unique}")
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        isolation_level="read_committed",  # as the stage reads: commit markers pass
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        reconnect_backoff_max_ms=500,
    )
    try:
        producer.init_transactions()

        def write(tp: TopicPartition, timestamp: int) -> None:
            producer.begin_transaction()
            producer.send(tp.topic, value=b"{}", partition=0, timestamp_ms=timestamp)
            producer.commit_transaction()

        write(imp, 1_000)
        consumer.assign([imp, fb])
        consumer.seek_to_beginning(imp, fb)
        sources = SourceWatch(consumer, time.monotonic)
        buffer: Interleaver[TopicPartition] = Interleaver(
            HOLD_S, time.monotonic, rank=lambda tp: tp == fb, max_hold_s=120.0
        )

        def cycle() -> list[Any]:
            for tp, records in consumer.poll(timeout_ms=100).items():
                buffer.extend(tp, records)
            return buffer.release([imp, fb], sources.caught_up)

        started = time.monotonic()
        first: list[Any] = []

        def settled() -> bool:
            """The first impression went, and both sources were caught up after the start."""
            first.extend(cycle())
            return bool(first) and min(sources.caught_up(imp), sources.caught_up(fb)) > started

        wait_until(settled, 60, "the first impression, both sources read to their end")
        assert [r.timestamp for r in first] == [1_000]
        write(fb, 5_000)
        click = wait_until(lambda: consumer.poll(timeout_ms=100).get(fb), 30, "the click")
        proxy.cut()
        buffer.extend(fb, click)
        arrived = time.monotonic()
        # the old rule's view: the impressions partition reached its last watermark
        assert consumer.position(imp) >= consumer.highwater(imp)  # type: ignore[operator]
        while time.monotonic() < arrived + 2 * HOLD_S:
            assert cycle() == [], "released on a watermark from before the click arrived"
        assert sources.caught_up(imp) < arrived
        proxy.restore()
        released = wait_until(cycle, 60, "the click after the proxy is back")
        assert [(r.topic, r.timestamp) for r in released] == [(fb.topic, 5_000)]
        assert sources.caught_up(imp) > arrived
    finally:
        consumer.close(autocommit=False)
        producer.close(timeout=5)
