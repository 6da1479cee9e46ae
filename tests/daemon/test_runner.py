"""The daemon's bookkeeping between the consumer and the merge, driven without a broker: a
fake consumer hands records to the real ``Daemon.process`` (inputs, merge, backpressure), which
feeds a real ``Engine``, so each case is compared with an engine fed the uninterrupted order."""

from __future__ import annotations

import json
import logging
import math
from collections import namedtuple
from typing import Any

from kafka import TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError, ProducerFencedError
from settable_clock import SettableClock

from evald.config import load_config
from evald.daemon.backoff import Backoff
from evald.daemon.main.inputs import InputPartition
from evald.daemon.main.merge import Merger
from evald.daemon.main.runner import Daemon
from evald.daemon.settings import load_settings
from evald.engine import Engine

Rec = namedtuple("Rec", "topic partition offset timestamp key value")

#: small epoch-ms times and a frozen clock: no event-time plausibility bound
#: each event confirms its time (``watermark_quorum`` 1): these cases feed a handful of events
#: and are about the order the daemon feeds them in, not about the watermark's blocks
ENGINE = {
    "window": "1m",
    "lateness": "10s",
    "min_event_time": 0,
    "max_event_lead": None,
    "watermark_quorum": 1,
}
TOPICS = {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"}


#: Inputs.caught_up values: caught up as of any time (a consumer without kafka-python's fetcher
#: trusts its last watermark, see FetchWatch), and not caught up
UP, BEHIND = math.inf, -math.inf


class FakeConsumer:
    """What the daemon asks of kafka-python between polls: watermarks, positions (set only
    where a test puts one past the records, as a commit marker does) and pause/resume."""

    def __init__(self) -> None:
        self.high: dict[TopicPartition, int] = {}
        self.positions: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.high.get(tp)

    def position(self, tp: TopicPartition) -> int | None:
        return self.positions.get(tp)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused.difference_update(tps)


def impression(rid: str, ts: int) -> bytes:
    return json.dumps({"request_id": rid, "ts": ts, "items": ["x", "y"], "labels": {}}).encode()


def click(rid: str, ts: int) -> bytes:
    return json.dumps({"request_id": rid, "ts": ts, "item": "x", "action": "click"}).encode()


def record(topic: str, offset: int, ts: int, value: bytes) -> Rec:
    return Rec(topic, 1, offset, ts, b"k", value)


class Harness:
    """A daemon owning partition 1, with a fake consumer and a real engine."""

    def __init__(self, *, max_pending: int = 1000) -> None:
        settings = load_settings(
            environ={},
            flags={"topics": TOPICS, "engine": {**ENGINE, "max_pending": max_pending}},
        )
        self.clock = SettableClock()
        self.results: list[Any] = []
        self.engine = Engine(
            load_config({**ENGINE, "max_pending": max_pending}),
            clock=lambda: 0.0,
            on_result=self.results.append,
        )
        self.daemon = Daemon(settings, lambda _cb: self.engine, clock=self.clock)
        assert self.daemon.open_engine() is self.engine
        self.consumer = FakeConsumer()
        self.daemon.inputs.connect(self.consumer)  # type: ignore[arg-type]

    def restored(self, start: dict[str, int], consumed: dict[str, int]) -> InputPartition:
        """Partition 1 as ``Restorer.restore`` leaves it after reading a checkpoint."""
        self.engine.restore(1, None, dict(consumed))
        part = InputPartition(1, Merger(2.0, self.clock))
        part.restored = True
        part.fed_next = dict(start)
        part.fetched_next = dict(start)
        part.replay_end = dict(consumed)
        self.daemon.inputs.parts[1] = part
        return part

    def tp(self, kind: str) -> TopicPartition:
        return self.daemon.inputs.tp(kind, 1)

    def cycle(self, batches: dict[TopicPartition, list[Rec]] | None = None) -> None:
        self.daemon.process(batches or {}, self.consumer)  # type: ignore[arg-type]

    def backpressure(self) -> None:
        """A cycle with nothing polled and nothing the merge releases: backpressure only."""
        self.daemon.process({}, self.consumer)  # type: ignore[arg-type]

    def scored(self) -> dict[str, dict[str, float]]:
        return {r.request_id: dict(r.measures) for r in self.results}


def uninterrupted(raws: list[bytes], kinds: list[str]) -> dict[str, dict[str, float]]:
    results: list[Any] = []
    engine = Engine(load_config(ENGINE), clock=lambda: 0.0, on_result=results.append)
    engine.feed_batch(raws, partition=1, kinds=kinds, offsets=list(range(len(raws))))
    engine.tick()
    return {r.request_id: dict(r.measures) for r in results}


def test_replayed_feedback_waits_for_replayed_impressions_under_backpressure() -> None:
    """Backpressure on while a restored partition replays: its replayed impression must still
    come before feedback that moves the watermark past it, or its result is lost."""
    h = Harness()
    h.restored(start={"impression": 0, "feedback": 0}, consumed={"impression": 1, "feedback": 1})
    h.daemon.backpressure.paused = True  # another partition's pending crossed pause_at
    h.consumer.high.update({h.tp("impression"): 1, h.tp("feedback"): 2})
    assert h.daemon.inputs.caught_up(h.daemon.inputs.parts[1])["impression"] == BEHIND
    # the feedback fetch comes first: f0 replayed (ts 30s), f1 new (ts 200s, closes a's window)
    h.cycle(
        {
            h.tp("feedback"): [
                record("fb", 0, 30_000, click("a", 30_000)),
                record("fb", 1, 200_000, click("b", 200_000)),
            ]
        }
    )
    h.clock.now += 2.0
    h.cycle()
    assert h.scored() == {}  # nothing fed past the replayed impression not yet fetched
    h.cycle({h.tp("impression"): [record("imp", 0, 0, impression("a", 0))]})
    h.clock.now += 2.0
    h.cycle()
    expected = uninterrupted(
        [impression("a", 0), click("a", 30_000), click("b", 200_000)],
        ["impression", "feedback", "feedback"],
    )
    assert expected and h.scored() == expected


def test_a_fetch_straddling_the_replay_end_is_split() -> None:
    """Records below the checkpoint's consumed offset go without the hold once the other
    topic's replay is fetched; the ones after it wait like any new record."""
    h = Harness()
    part = h.restored(
        start={"impression": 10, "feedback": 0}, consumed={"impression": 12, "feedback": 0}
    )
    h.consumer.high.update({h.tp("impression"): 14, h.tp("feedback"): 0})
    batch = [
        record("imp", 10, 1_000, impression("r10", 1_000)),
        record("imp", 11, 2_000, impression("r11", 2_000)),
        # offset 12 is missing (a transaction marker, compaction): the gap sits at the end
        record("imp", 13, 3_000, impression("n13", 3_000)),
    ]
    h.cycle({h.tp("impression"): batch})
    assert part.fed_next["impression"] == 12  # r10, r11 fed at once; n13 holds
    assert part.merger.buffered("impression") == 1
    assert part.fetched_next["impression"] == 14
    h.clock.now += 2.0
    h.cycle()
    assert part.fed_next["impression"] == 14


def test_a_kind_is_not_caught_up_before_its_replay_is_fetched() -> None:
    """A stale fetch high watermark can sit below the replay end; the checkpoint's offset
    cannot, so it decides, even while backpressure holds impressions."""
    h = Harness()
    part = h.restored(
        start={"impression": 0, "feedback": 0}, consumed={"impression": 5, "feedback": 3}
    )
    h.consumer.high.update({h.tp("impression"): 0, h.tp("feedback"): 0})
    h.daemon.backpressure.paused = True
    h.daemon.inputs.held = {h.tp("impression")}
    assert h.daemon.inputs.caught_up(part) == {"impression": BEHIND, "feedback": BEHIND}
    part.fetched_next = {"impression": 5, "feedback": 3}
    assert h.daemon.inputs.caught_up(part) == {"impression": UP, "feedback": UP}
    h.daemon.inputs.held = set()
    h.consumer.high[h.tp("impression")] = 6
    assert h.daemon.inputs.caught_up(part) == {"impression": BEHIND, "feedback": UP}


def test_a_commit_marker_after_the_last_record_does_not_keep_a_kind_behind() -> None:
    """A transactional producer's last record (offset 4) is followed by its commit marker
    (offset 5): the high watermark is 6, the consumer's position 6, the record offsets end at
    5. Caught up by the position; without it, a lone record waited max_hold_s."""
    h = Harness()
    part = h.restored(
        start={"impression": 0, "feedback": 0}, consumed={"impression": 0, "feedback": 0}
    )
    part.fetched_next = {"impression": 5, "feedback": 0}
    h.consumer.high.update({h.tp("impression"): 6, h.tp("feedback"): 0})
    assert h.daemon.inputs.caught_up(part)["impression"] == BEHIND  # no position known
    h.consumer.positions[h.tp("impression")] = 6
    assert h.daemon.inputs.caught_up(part)["impression"] == UP
    h.consumer.positions[h.tp("impression")] = 5  # the marker not fetched yet
    assert h.daemon.inputs.caught_up(part)["impression"] == BEHIND


def test_backpressure_leaves_a_partition_fetching_its_replay_unpaused() -> None:
    h = Harness(max_pending=2)
    part = h.restored(
        start={"impression": 0, "feedback": 0}, consumed={"impression": 3, "feedback": 0}
    )
    h.consumer.high.update({h.tp("impression"): 5, h.tp("feedback"): 0})
    imps = [record("imp", i, i * 1_000, impression(f"r{i}", i * 1_000)) for i in range(2)]
    h.cycle({h.tp("impression"): imps})
    assert h.engine.pending() == 2
    h.consumer.high[h.tp("feedback")] = 1  # feedback that could drain them: pausing helps
    h.backpressure()
    assert h.daemon.backpressure.paused
    assert h.consumer.paused == set()  # offset 2 is still to replay
    part.fetched_next["impression"] = 3
    h.daemon.backpressure.paused = False
    h.backpressure()
    assert h.consumer.paused == {h.tp("impression")}


def test_backpressure_without_feedback_to_drain_lets_the_cap_evict_and_does_not_flap() -> None:
    """At pause_at with no feedback buffered or fetchable, a pause could only stall: the
    impressions keep flowing and the engine's cap closes the earliest deadlines."""
    h = Harness(max_pending=10)
    part = h.restored(
        start={"impression": 0, "feedback": 0}, consumed={"impression": 0, "feedback": 0}
    )
    h.consumer.high.update({h.tp("impression"): 100, h.tp("feedback"): 0})
    imps = [record("imp", i, i * 1_000, impression(f"r{i}", i * 1_000)) for i in range(30)]
    h.cycle({h.tp("impression"): imps})
    h.clock.now += 3.0  # the merge hold: nothing newer from the (empty) feedback topic
    h.cycle()
    assert not h.daemon.backpressure.paused and h.daemon.stats.pauses == 0
    assert h.engine.pending() == 10  # the cap held: 20 closed early
    assert len(h.results) == 20
    # feedback arrives: pausing helps now
    h.consumer.high[h.tp("feedback")] = 5
    h.backpressure()
    assert h.daemon.backpressure.paused and h.consumer.paused == {h.tp("impression")}
    # it is all fetched and fed, yet pending stays high: released, and not paused again
    # within the cool-down even when more feedback shows up
    part.fetched_next["feedback"] = 5
    h.backpressure()
    assert not h.daemon.backpressure.paused and h.consumer.paused == set()
    h.consumer.high[h.tp("feedback")] = 6
    h.clock.now += 5.0
    h.backpressure()
    assert not h.daemon.backpressure.paused and h.daemon.stats.pauses == 1
    h.clock.now += 6.0
    h.backpressure()
    assert h.daemon.backpressure.paused and h.daemon.stats.pauses == 2


def test_backpressure_log_lines_are_rate_limited(caplog: Any) -> None:
    h = Harness(max_pending=10)
    h.restored(start={"impression": 0, "feedback": 0}, consumed={"impression": 0, "feedback": 0})
    h.consumer.high.update({h.tp("impression"): 100, h.tp("feedback"): 0})
    h.cycle({h.tp("impression"): [record("imp", i, i, impression(f"r{i}", i)) for i in range(10)]})
    h.clock.now += 3.0
    h.cycle()
    assert h.engine.pending() == 10
    h.consumer.high[h.tp("feedback")] = 5  # feedback to wait for: every round pauses
    caplog.set_level("INFO", logger="evald.daemon")
    for _ in range(50):  # a pause and a release per round, all within 10 s
        h.backpressure()
        assert h.daemon.backpressure.paused
        # released as drained (pending 0 by its account), which sets no cooldown
        h.daemon.backpressure.step(0, True, h.clock())
        assert not h.daemon.backpressure.paused
        h.clock.now += 0.05
    lines = [r.getMessage() for r in caplog.records if "backpressure" in r.getMessage()]
    assert len(lines) == 1
    h.clock.now += 10.0
    h.backpressure()
    lines = [r.getMessage() for r in caplog.records if "backpressure" in r.getMessage()]
    assert len(lines) == 2 and "(99 more changes since the last line)" in lines[1]


def test_records_polled_in_the_cycle_that_restores_their_partition_are_dropped() -> None:
    """They may come from the position before the restore's seek; the seek fetches them
    again, and taking them as an offset gap would skip the re-fetch."""
    h = Harness()
    calls: list[list[int]] = []

    def restore(partitions: list[int]) -> None:
        calls.append(partitions)
        h.restored(
            start={"impression": 0, "feedback": 0}, consumed={"impression": 0, "feedback": 0}
        )

    def take(batches: dict[TopicPartition, list[Rec]]) -> None:  # as Daemon.process does
        if h.daemon.inputs.to_restore():
            restore(h.daemon.inputs.to_restore())
        h.daemon.inputs.take(batches)

    h.daemon.inputs.assign({1})
    stale = [record("imp", 7, 7_000, impression("r7", 7_000))]
    take({h.tp("impression"): stale})
    part = h.daemon.inputs.parts[1]
    assert calls == [[1]] and part.merger.buffered() == 0
    assert part.fetched_next["impression"] == 0
    fresh = [record("imp", i, i * 1_000, impression(f"r{i}", i * 1_000)) for i in range(8)]
    take({h.tp("impression"): fresh})
    assert part.merger.buffered("impression") == 8


class ListingConsumer(FakeConsumer):
    """A broker whose ListOffsets answer lags behind the last batch, as tansu's does."""

    def __init__(self, listed: dict[TopicPartition, int]) -> None:
        super().__init__()
        self.listed = listed

    def end_offsets(self, tps: list[TopicPartition], timeout_ms: int) -> dict[TopicPartition, int]:
        return {tp: self.listed[tp] for tp in tps}


def test_a_partition_with_no_fetch_since_its_restore_has_no_lag_yet() -> None:
    """Restored at offsets 641/1731 with nothing fetched, a lagging ListOffsets (631) must not
    be reported as lag 0: a caller waiting for lag 0 would take the partition as caught up."""
    h = Harness()
    imp, fb = h.tp("impression"), h.tp("feedback")
    h.consumer = ListingConsumer({imp: 631, fb: 1700})
    h.daemon.inputs.connect(h.consumer)  # type: ignore[arg-type]
    part = h.restored(
        start={"impression": 641, "feedback": 1731}, consumed={"impression": 669, "feedback": 1809}
    )
    probe = h.daemon.health.probe
    assert probe(h.consumer, h.daemon.inputs)  # type: ignore[arg-type]
    assert h.daemon.stats.lag == {}
    h.consumer.high.update({imp: 671, fb: 1809})  # the first fetch responses
    assert probe(h.consumer, h.daemon.inputs)  # type: ignore[arg-type]
    assert h.daemon.stats.lag == {("imp", 1): 30, ("fb", 1): 78}
    part.fed_next = {"impression": 671, "feedback": 1809}
    assert probe(h.consumer, h.daemon.inputs)  # type: ignore[arg-type]
    assert h.daemon.stats.lag == {("imp", 1): 0, ("fb", 1): 0}


def test_the_session_s_engine_shows_the_counts_its_commits_held() -> None:
    """``/metrics`` shows what the process's commits held, not what the engine fed since: a
    kill -9 must not leave a count in a series that the restart counts again."""
    harness = Harness()
    harness.engine.feed(impression("a", 1_000), partition=1, kind="impression", offset=0)
    assert harness.engine.stats.events[("impression", "accepted")] == 1
    assert harness.engine.counters is harness.daemon.stats.committed.counted
    assert harness.engine.counters.events[("impression", "accepted")] == 0
    assert harness.engine.histograms().segments == ()  # nothing committed yet


class SilentBroker:
    """Only what the lag probe reads (health.EndOffsets), from a broker that does not answer."""

    def highwater(self, tp: TopicPartition) -> int | None:
        return None

    def end_offsets(self, tps: list[TopicPartition], timeout_ms: int) -> dict[TopicPartition, int]:
        raise KafkaTimeoutError("ListOffsets timed out")


def test_a_broker_that_does_not_answer_the_probe_makes_the_daemon_not_ready() -> None:
    """The probe needs no consumer, only the two reads of ``EndOffsets``: an unanswered
    ListOffsets is the broker away, so /readyz and evald_ready turn red and the lag stays."""
    h = Harness()
    h.restored(start={"impression": 5, "feedback": 7}, consumed={"impression": 5, "feedback": 7})
    h.daemon.stats.ready = h.daemon.health.broker_ok = True
    h.daemon.stats.set_lag({("imp", 1): 3})
    assert not h.daemon.health.probe(SilentBroker(), h.daemon.inputs)
    assert not h.daemon.health.broker_ok and not h.daemon.stats.ready
    assert h.daemon.stats.lag == {("imp", 1): 3}


def test_a_fence_is_counted_when_it_ends_a_session_at_a_stop_as_on_a_retry(caplog: Any) -> None:
    """A session fenced as the stop arrives (its successor took the transactional id during a
    rolling restart) abandoned its open transaction like any other fence: it was logged at
    INFO (not alarming at a stop) but left out of ``evald_transactions_fenced``. A timeout at
    a stop is not a fence and is not counted; a fence carried in a later send's error is."""
    h = Harness()
    ends = [
        (False, ProducerFencedError()),  # retried
        (False, KafkaTimeoutError("away")),  # retried, not a fence
        # a later send's error carrying the fence, as kafka-python raises it
        (False, KafkaError("Cannot perform send because ...", ProducerFencedError())),
        (True, ProducerFencedError()),  # the stop's
    ]

    def session() -> None:
        stop, exc = ends.pop(0)
        if stop:
            h.daemon.stop()
        raise exc

    h.daemon._session = session  # type: ignore[method-assign]
    h.daemon._backoff = Backoff(0.001, 0.001)
    with caplog.at_level(logging.INFO, logger="evald.daemon"):
        assert h.daemon.run() == 0
    assert ends == []
    assert h.daemon.stats.fenced_sessions == 3
    stopping = [r for r in caplog.records if r.getMessage().startswith("stopping:")]
    assert [r.levelno for r in stopping] == [logging.INFO], stopping
    assert "ProducerFencedError" in stopping[0].getMessage()


def test_a_twin_is_named_however_slow_its_fence_cycle_and_its_error_logged_once(
    caplog: Any,
) -> None:
    """Sessions fenced 70 s apart (rejoin, a restore, the backoff) with no commit between:
    counted over 120 s, never three at once, so the twin was never named; and once named, the
    ERROR came at every fence. Now /readyz names it from the third fence on, the log once."""
    h = Harness()
    h.daemon._backoff = Backoff(0.001, 0.001)
    fences, readyz = 6, []

    def session() -> None:
        h.clock.now += 70.0
        readyz.append(h.daemon.ready()[1])
        if len(readyz) > fences:
            h.daemon.stop()
            return
        raise ProducerFencedError()

    h.daemon._session = session  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="evald.daemon"):
        assert h.daemon.run() == 0
    named = "give every instance its own --instance-id"
    assert [named in why for why in readyz] == [False] * 3 + [True] * 4
    errors = [r for r in caplog.records if named in r.getMessage()]
    assert [r.levelno for r in errors] == [logging.ERROR]
