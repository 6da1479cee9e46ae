"""When the merge may release a lone record: only on a high watermark confirmed after it arrived.

The consumer here is a stand-in with kafka-python 3.0.x's fetcher hooks (the two methods
``FetchWatch`` wraps, same signatures), driven by hand: the test plays the client's I/O thread
(build a request, answer it) and the poll loop (``take``, ``feed``) in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from kafka import TopicPartition
from settable_clock import SettableClock

from evald.daemon.kafka_compat import FetchWatch
from evald.daemon.main.inputs import Inputs, Restored

IMP, FB = TopicPartition("imp", 0), TopicPartition("fb", 0)
NOT_LEADER = 6


@dataclass
class Record:
    offset: int
    timestamp: int
    value: bytes = b"{}"


class Fetcher:
    """kafka-python's Fetcher, as far as FetchWatch touches it."""

    def __init__(self) -> None:
        self.partitions = [IMP, FB]
        self.highwater: dict[TopicPartition, int] = {}

    def _create_fetch_requests(self) -> dict[int, tuple[Any, dict[TopicPartition, int]]]:
        return {1: ("request", dict.fromkeys(self.partitions, 0))}

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
                    self.highwater[TopicPartition(topic.topic, data.partition_index)] = (
                        data.high_watermark
                    )


class Consumer:
    """The consumer calls Inputs makes."""

    def __init__(self) -> None:
        self._fetcher = Fetcher()

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._fetcher.highwater.get(tp)

    def position(self, tp: TopicPartition) -> int:
        return 0

    def pause(self, *tps: TopicPartition) -> None:
        pass

    def resume(self, *tps: TopicPartition) -> None:
        pass


def response(
    highs: dict[TopicPartition, int], errors: dict[TopicPartition, int] | None = None
) -> Any:
    """A fetch response: one partition entry per ``highs`` (and per ``errors``, with its code)."""
    errors = errors or {}
    topics: dict[str, list[Any]] = {}
    for tp in {*highs, *errors}:
        topics.setdefault(tp.topic, []).append(
            SimpleNamespace(
                partition_index=tp.partition,
                error_code=errors.get(tp, 0),
                high_watermark=highs.get(tp, -1),
            )
        )
    return SimpleNamespace(
        error_code=0,
        throttle_time_ms=0,
        responses=[SimpleNamespace(topic=t, partitions=ps) for t, ps in topics.items()],
    )


def fetch(consumer: Consumer, answer: Any) -> None:
    """One fetch round trip: the request is built now, the answer handled now."""
    fetcher = consumer._fetcher
    for node_id, (_, offsets) in fetcher._create_fetch_requests().items():
        fetcher._handle_fetch_response(node_id, offsets, 0.0, answer)


def owned(clock: SettableClock) -> tuple[Inputs, Consumer]:
    inputs = Inputs("imp", "fb", clock, merge_hold_s=2.0)
    consumer = Consumer()
    inputs.connect(consumer)  # type: ignore[arg-type]

    inputs.assign({0})
    for p in inputs.to_restore():
        start = {"impression": 0, "feedback": 0}
        inputs.resume(p, Restored(start, start))
    inputs.take({})
    return inputs, consumer


def fed(inputs: Inputs) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []

    def feed_batch(
        values: list[bytes], *, kinds: list[str], offsets: list[int], **_: Any
    ) -> list[Any]:
        out.extend(zip(kinds, offsets, strict=True))
        return []

    inputs.feed(feed_batch)
    return out


def test_a_stale_high_watermark_holds_a_lone_record_and_a_fresh_one_releases_it() -> None:
    """The failover case: the feedback partition was last answered (empty, at its end) before
    the impression arrived, then its fetches fail while its leader moves. The impression must
    not go after ``hold_s`` on that old answer: a click written before it may be on the new
    leader."""
    clock = SettableClock(100.0)
    inputs, consumer = owned(clock)
    fetch(consumer, response({IMP: 1, FB: 0}))  # built at 100: both at their end
    clock.now = 101.0
    inputs.take({IMP: [Record(0, 5_000)]})
    clock.now = 102.0
    fetch(consumer, response({}, errors={FB: NOT_LEADER}))  # the leader is moving
    clock.now = 104.0  # waited hold_s
    assert fed(inputs) == []
    clock.now = 104.5
    fetch(consumer, response({FB: 0}))  # a request built after the impression arrived
    assert fed(inputs) == [("impression", 0)]


def test_a_fresh_answer_that_shows_more_to_fetch_keeps_holding() -> None:
    clock = SettableClock(100.0)
    inputs, consumer = owned(clock)
    inputs.take({IMP: [Record(0, 5_000)]})
    clock.now = 103.0
    fetch(consumer, response({FB: 1}))  # the click is on the log, not fetched yet
    assert fed(inputs) == []
    inputs.take({FB: [Record(0, 4_000)]})
    assert fed(inputs) == [("feedback", 0), ("impression", 0)]


def test_the_watch_stamps_answers_and_skips_errors_and_refused_answers() -> None:
    clock = SettableClock(10.0)
    consumer = Consumer()
    watch = FetchWatch(consumer, clock)
    assert watch.watching and watch.answered(FB) is None
    fetch(consumer, response({IMP: 7, FB: 3}))
    assert watch.answered(FB) == (10.0, 3)
    clock.now = 11.0
    fetch(consumer, response({IMP: 8}))  # an incremental answer leaves out what did not change
    assert watch.answered(FB) == (11.0, 3) and watch.answered(IMP) == (11.0, 8)
    clock.now = 12.0
    fetch(consumer, response({IMP: 9}, errors={FB: NOT_LEADER}))
    assert watch.answered(FB) == (11.0, 3) and watch.answered(IMP) == (12.0, 9)
    clock.now = 13.0
    refused = response({IMP: 10, FB: 4})
    refused.error_code = 70  # the fetch session is gone
    fetch(consumer, refused)
    assert watch.answered(FB) == (11.0, 3)


def test_without_kafka_pythons_hooks_the_last_watermark_is_trusted_as_before() -> None:
    consumer = SimpleNamespace(highwater=lambda tp: 5)
    watch = FetchWatch(consumer, SettableClock())
    assert not watch.watching
    assert watch.answered(FB) == (float("inf"), 5)
