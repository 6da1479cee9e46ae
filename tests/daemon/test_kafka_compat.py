"""The kafka-python work-arounds (pause/resume, the results appender, no topic auto-creation,
flushes and closes that end), against the real broker where it matters."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, ProducerFencedError
from kafka.producer.transaction_manager import TransactionalRequestResult
from kafka_harness import Broker, KafkaTools
from settable_clock import SettableClock

from evald.daemon.kafka_compat import (
    FetchWatch,
    RecordAppender,
    close_quietly,
    commit_within,
    flush_within,
    net_client,
    send_offsets_within,
    unpark_resumed,
    without_auto_create,
)

pytestmark = pytest.mark.kafka


def test_a_resumed_partition_is_fetched_to_its_end(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    imp, fb = f"cimp-{unique}", f"cfb-{unique}"
    kafka_tools.create({imp: 1, fb: 1})
    kafka_tools.produce_sim(imp, fb, events=3000, seed=3, rate=2000, clean=True)
    ends = {imp: kafka_tools.end_offsets(imp)[0], fb: kafka_tools.end_offsets(fb)[0]}
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=f"compat-{unique}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=50,
        # tansu's first join of a group waits about half the session timeout
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    try:
        consumer.subscribe([imp, fb])
        tp = TopicPartition(imp, 0)
        seen = {imp: 0, fb: 0}
        paused_at: int | None = None
        polls_paused = 0
        resumed = False
        deadline = time.monotonic() + 30
        while seen != ends:
            assert time.monotonic() < deadline, f"stuck at {seen} of {ends}"
            unpark_resumed(consumer)
            for part, records in consumer.poll(timeout_ms=200).items():
                seen[part.topic] += len(records)
            if paused_at is None and seen[imp] >= 100:
                consumer.pause(tp)
                paused_at = seen[imp]
            elif paused_at is not None and not resumed:
                polls_paused += 1
                if polls_paused == 5:  # the other partition's records were drained meanwhile
                    assert seen[imp] == paused_at
                    consumer.resume(tp)
                    resumed = True
        assert resumed and seen == ends
    finally:
        consumer.close(autocommit=False)


def test_record_appender_writes_what_send_would_in_order_and_inside_the_transaction(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """Records after a partition's first go straight to the accumulator: on the broker they
    must be the same records, in order, at the offsets their futures report, and a second
    transaction (first record through send again) must continue the partition."""
    topic = f"capp-{unique}"
    kafka_tools.create({topic: 2})
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        transactional_id=f"capp-{unique}",
        batch_size=4096,  # several batches per transaction: new-batch wake-ups are exercised
        linger_ms=50,
    )
    sent: list[tuple[int, bytes, bytes]] = []
    offsets: list[tuple[int, int]] = []
    try:
        producer.init_transactions()
        appender = RecordAppender(producer)
        assert appender.fast, "kafka-python internals moved: the fast path is never taken"
        for txn in range(2):
            producer.begin_transaction()
            futures = []
            for i in range(300):
                p = i % 2
                key, value = f"k{txn}-{i}".encode(), f'{{"n":{i},"txn":{txn}}}'.encode()
                first = i < 2  # the first record of each partition in this transaction
                futures.append(
                    (
                        p,
                        appender.send(
                            TopicPartition(topic, p), key, value, first_in_transaction=first
                        ),
                    )
                )
                sent.append((p, key, value))
            producer.flush(timeout=30)
            offsets += [(p, f.get(timeout=30).offset) for p, f in futures]
            producer.commit_transaction()
    finally:
        producer.close(timeout=5)
    records = kafka_tools.read(topic)
    by_partition: dict[int, list] = {0: [], 1: []}
    for record in records:
        by_partition[record.partition].append(record)
    for p in (0, 1):
        got = [(r.key, r.value) for r in by_partition[p]]
        assert got == [(k, v) for q, k, v in sent if q == p]
        read_offsets = [r.offset for r in by_partition[p]]
        assert [o for q, o in offsets if q == p] == read_offsets


def test_record_appender_sends_an_oversized_record_through_send_and_its_checks(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    kafka_tools.create({f"cbig-{unique}": 1})  # the test broker creates no topic on its own
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=2048)
    try:
        appender = RecordAppender(producer)
        tp = TopicPartition(f"cbig-{unique}", 0)
        with pytest.raises(MessageSizeTooLargeError):
            appender.send(tp, b"k", b"x" * 4096, first_in_transaction=False)
    finally:
        producer.close(timeout=5)


def test_record_appender_keeps_to_send_when_the_accumulator_signature_differs() -> None:
    """Other kafka-python internals (a changed ``append``) must never be called blind."""
    calls: list[tuple] = []

    class Accumulator:
        def append(self, tp, key, value, timestamp_ms, headers):  # reordered parameters
            raise AssertionError("must not be called")

    class Sender:
        def wakeup(self) -> None:
            raise AssertionError("must not be called")

    class Producer:
        def __init__(self) -> None:
            self.config = {"max_request_size": 1 << 20}
            self._accumulator, self._sender = Accumulator(), Sender()

        def send(self, topic, *, key, value, partition):
            calls.append((topic, key, value, partition))
            return "future"

    appender = RecordAppender(Producer())
    assert not appender.fast
    tp = TopicPartition("results", 3)
    assert appender.send(tp, b"k", b"v", first_in_transaction=False) == "future"
    assert calls == [("results", b"k", b"v", 3)]


class _Manager:
    """kafka-python's transaction manager as far as the bounded waits use it: each request
    returns a real ``TransactionalRequestResult`` that ``answer`` completes (or nothing does)."""

    def __init__(self, answer: Callable[[TransactionalRequestResult], None]) -> None:
        self.answer = answer
        self.requests: list[tuple[str, Any]] = []

    def _request(self, name: str, args: Any) -> TransactionalRequestResult:
        self.requests.append((name, args))
        result = TransactionalRequestResult()
        self.answer(result)
        return result

    def begin_commit(self) -> TransactionalRequestResult:
        return self._request("commit", None)

    def send_offsets_to_transaction(self, offsets: Any, group: Any) -> TransactionalRequestResult:
        return self._request("offsets", (offsets, group))


class _Producer:
    def __init__(self, answer: Callable[[TransactionalRequestResult], None]) -> None:
        self._transaction_manager = _Manager(answer)
        self._sender = SimpleNamespace(wakeup=lambda: None)


def test_a_commit_nobody_answers_gives_up_at_the_deadline() -> None:
    """The sender never gets the EndTxn answer (a broker it cannot reach): the wait ends."""
    producer = _Producer(lambda result: None)
    with pytest.raises(KafkaTimeoutError, match=r"commit not answered within 0\.05s"):
        commit_within(producer, 0.05)
    with pytest.raises(KafkaTimeoutError, match="offsets not answered"):
        send_offsets_within(producer, {"tp": 1}, "group", 0.05)
    assert [name for name, _ in producer._transaction_manager.requests] == ["commit", "offsets"]


def test_an_answered_commit_returns_and_an_error_is_raised() -> None:
    commit_within(_Producer(lambda result: result.done()), 5)
    send_offsets_within(_Producer(lambda result: result.done()), {"tp": 1}, "group", 5)
    fenced = _Producer(lambda result: result.done(ProducerFencedError()))
    with pytest.raises(ProducerFencedError):
        commit_within(fenced, 5)


def test_an_answer_that_comes_late_but_within_the_deadline_is_taken() -> None:
    def later(result: TransactionalRequestResult) -> None:
        threading.Timer(0.1, result.done).start()

    commit_within(_Producer(later), 10)


def test_fetch_watch_stamps_real_fetches_with_the_watermark_and_the_request_time(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """Against kafka-python's real fetcher and a real broker: once the consumer has read a
    partition to its end, the watch holds that end as the watermark, stamped with a request
    built after the read began; a request built later stamps it later."""
    topic = f"cwatch-{unique}"
    kafka_tools.create({topic: 1})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for n in range(50):
        producer.send(topic, value=b"%d" % n, partition=0)
    producer.flush()
    producer.close()
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100
    )
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        watch = FetchWatch(consumer, time.monotonic)
        assert watch.watching
        started = time.monotonic()
        fetched, deadline = 0, time.monotonic() + 30
        while (watch.answered(tp) or (0, -1))[1] != 50 or fetched < 50:
            assert time.monotonic() < deadline, (fetched, watch.answered(tp))
            fetched += sum(len(r) for r in consumer.poll(timeout_ms=200).values())
        stamp, high = watch.answered(tp)  # type: ignore[misc]
        assert high == 50 and stamp >= started
        later = time.monotonic()
        deadline = later + 30
        while watch.answered(tp)[0] <= later:  # type: ignore[index]
            assert time.monotonic() < deadline, "no later fetch answered"
            consumer.poll(timeout_ms=200)
        assert watch.answered(tp)[1] == 50  # type: ignore[index]
    finally:
        consumer.close(autocommit=False)


def test_a_client_asked_not_to_create_topics_does_not(acl_broker: Broker, unique: str) -> None:
    """On a broker that creates topics a client asks metadata for (Kafka's default):
    kafka-python 3.0.12's consumer, given ``allow_auto_create_topics=False``, still has the
    topic created (its metadata client never gets the flag, kafka/net/manager.py); the
    consumer and the producer built with ``net_client`` and ``without_auto_create()`` do not."""
    from kafka import KafkaAdminClient

    def fetched_with(options: dict[str, Any]) -> str:
        """A consumer assigned to a topic nobody created, polled; the topic's name."""
        topic = f"nocreate-{unique}-{len(options)}"
        consumer = KafkaConsumer(bootstrap_servers=acl_broker.bootstrap, **options)
        try:
            consumer.assign([TopicPartition(topic, 0)])
            consumer.poll(timeout_ms=1_000)
        finally:
            consumer.close()
        return topic

    guarded = fetched_with({**without_auto_create(), "kafka_client": net_client})
    producer = KafkaProducer(
        bootstrap_servers=acl_broker.bootstrap,
        max_block_ms=1_000,
        kafka_client=net_client,
        **without_auto_create(),
    )
    try:
        with pytest.raises(KafkaTimeoutError):  # the topic's metadata never comes
            producer.send(f"nocreate-{unique}-producer", b"x")
    finally:
        producer.close(timeout=1)
    plain = fetched_with({"allow_auto_create_topics": False})
    admin = KafkaAdminClient(bootstrap_servers=acl_broker.bootstrap)
    try:
        existing = set(admin.list_topics())
    finally:
        admin.close()
    assert guarded not in existing and f"nocreate-{unique}-producer" not in existing
    assert plain in existing, (
        "kafka-python honours allow_auto_create_topics now: remove without_auto_create"
    )


class _Flushing:
    """A producer whose flush times out ``stuck`` times (its wait moving ``clock``) before it
    completes."""

    def __init__(self, stuck: int, clock: SettableClock) -> None:
        self.stuck = stuck
        self.clock = clock
        self.timeouts: list[float] = []

    def flush(self, timeout: float) -> None:
        self.timeouts.append(timeout)
        if len(self.timeouts) <= self.stuck:
            self.clock.now += timeout
            raise KafkaTimeoutError("Timeout waiting for future")


def test_flush_within_calls_back_while_it_waits_and_keeps_one_deadline() -> None:
    clock = SettableClock(0.0)
    waited: list[float] = []
    flush_within(_Flushing(2, clock), 30.0, lambda: waited.append(clock()), clock=clock)
    assert waited == [1.0, 2.0]
    producer = _Flushing(100, clock)
    waited.clear()
    with pytest.raises(KafkaTimeoutError):
        flush_within(producer, 3.5, lambda: waited.append(clock()), clock=clock)
    # one deadline in all (kafka-python's timeout holds for each batch in turn)
    assert producer.timeouts == [1.0, 1.0, 1.0, 0.5] and len(waited) == 3

    class Gone(Exception):
        pass

    def topic_gone() -> None:
        raise Gone

    with pytest.raises(Gone):  # the callback gives up at once
        flush_within(_Flushing(100, clock), 30.0, topic_gone, clock=clock)


def test_a_send_the_broker_refused_before_it_left_raises_at_once() -> None:
    """kafka-python hands back a refused metadata wait (no Describe on the topic) as a failed
    future; the appender raises it instead of queueing the partition's records behind it."""
    from kafka.errors import TopicAuthorizationFailedError
    from kafka.future import Future

    refused = Future().failure(TopicAuthorizationFailedError({"res"}))
    producer = SimpleNamespace(send=lambda *a, **k: refused, config={"max_request_size": 1 << 20})
    appender = RecordAppender(producer)
    with pytest.raises(TopicAuthorizationFailedError):
        appender.send(TopicPartition("res", 0), b"k", b"v", first_in_transaction=True)


def test_closing_a_producer_with_records_nobody_takes_stops_it() -> None:
    """kafka-python's close flushes first and raises before it stops the sender; the records
    are aborted and the close repeated, so the producer is closed (no second close at exit)."""

    class Stuck(KafkaProducer):  # type: ignore[misc]
        def __init__(self) -> None:  # no connection: only close() is exercised
            self.closes: list[float] = []
            self.forced = False
            self._sender = SimpleNamespace(force_close=self._force)

        def _force(self) -> None:
            self.forced = True

        def close(self, timeout: float | None = None, null_logger: bool = False) -> None:
            self.closes.append(timeout or 0)
            if not self.forced:
                raise KafkaTimeoutError("Timeout waiting for future")

        def __del__(self) -> None:
            pass

    producer = Stuck()
    close_quietly(producer)
    assert producer.forced and producer.closes == [1, 1]
