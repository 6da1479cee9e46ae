"""The repartition stage of `evald run` (``input.repartition: true``; docs/design.md, "Topics
keyed any way").

It consumes the impressions and feedback topics, keyed any way and of any partition counts, in
its own consumer group ``<group_id>.repartition``, and writes every record unchanged (value,
headers, timestamp) to ``<group_id>.<topic>.evald-repartition``, keyed by its request id and
partitioned by Kafka's default partitioner over the internal topics' shared partition count.
The main stage (evald/daemon/main/runner.py, unchanged) reads the internal topics instead of the
inputs.

Exactly once: one transactional producer per instance (``evald/<group>/<instance>/repartition``)
and this cycle, repeated while running:

1. Poll the source topics (``read_committed``: an aborted input transaction is never copied) and
   buffer the records per source partition (:class:`~.interleave.Interleaver`).
2. Release what may go, in record-timestamp order across the source partitions. A head waits
   for a source partition with nothing buffered that is not past its timestamp until a fetch
   request built after the head arrived found that source at its end (:class:`SourceWatch`),
   ``max_hold_s`` at most: a stale high watermark (a source's leader moving) would let it go
   ahead of records written before it, and the internal topics would get another order than
   an uninterrupted run's (interleave.py says what that breaks in the main stage).
3. Begin a transaction. For each released record read only its request id (the mapping's
   pointer for the topic's kind) and send the original bytes to the internal topic's
   partition ``murmur2(id) % n``; a record without a readable request id is sent to the DLQ
   instead, with its reason, like the engine's rejections.
4. Flush, and check every send: a failed one ends the session (its transaction is aborted).
5. ``send_offsets_to_transaction``: per source partition that released records, the offset of
   its first record still buffered (or its position when nothing is), with the consumer's
   group metadata, so a member fenced by a rebalance cannot commit.
6. Commit the transaction: the copies, the dead letters and the source offsets become visible
   together, or (abort, crash, fence) none of them.

A crash before step 6 leaves an open transaction that ``init_transactions`` of the restarted
instance (same transactional id) aborts, or the broker times out; the sources are read again
from the offsets of the last commit, which are exactly those of the last copies committed.
Buffered, unreleased records are not committed and are simply read again. Any failure ends the
session the same way; it is retried with backoff like the main stage's. Fatal misconfiguration
(an input topic missing, internal topics of the wrong partition count, an error no retry can
fix) stops `evald run` with exit status 2.

Threading: the stage runs on a thread of the `evald run` process with its own clients (see
docs/design.md for why not a second process). kafka-python calls the rebalance listener on its
I/O thread; the listener only notes the event, and the stage's thread applies it after the
poll: what was buffered for a revoked or newly assigned partition is dropped, and a newly
assigned one is read again from its committed offset. A transaction that still names a revoked
partition is refused by the broker (stale generation) and aborted whole.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from evald.daemon.backoff import Backoff
from evald.daemon.crash import crash_point
from evald.daemon.dead_letters import DEFAULT_MAX_MESSAGE_BYTES, build_letter, max_message_bytes
from evald.daemon.fatal import unrecoverable
from evald.daemon.kafka_compat import (
    FetchWatch,
    RecordAppender,
    StopEvent,
    close_quietly,
    commit_within,
    send_offsets_within,
    unpark_resumed,
    without_auto_create,
)
from evald.daemon.names import internal_topic, repartition_group, repartition_member
from evald.daemon.reach import Misdirected, check_resolves, diagnose
from evald.daemon.repartition.interleave import Interleaver
from evald.daemon.repartition.rekey import RequestIdReader, Unkeyable, partition_for
from evald.daemon.settings import Settings
from evald.daemon.topics import batch_under, create_dlq

__all__ = [
    "RepartitionCollector",
    "RepartitionStats",
    "Repartitioner",
    "SourceWatch",
    "main_stage_settings",
]

log = logging.getLogger("evald.daemon.repartition")

#: records buffered for one source partition before its fetch is paused
BUFFER_CAP = 20_000
#: how long a released head waits for a caught-up, empty source partition (see interleave.py)
HOLD_S = 2.0
#: the producer's batching, as the main stage's (one cycle's copies per partition in a batch)
PRODUCER_BATCH_BYTES = 512 * 1024
PRODUCER_LINGER_MS = 20
KAFKA_PYTHON_MAX_REQUEST_SIZE = 1_048_576
#: how often records the main stage has committed past are deleted from the internal topics
#: (Kafka Streams' ``repartition.purge.interval.ms`` default)
PURGE_INTERVAL_S = 30.0
#: internal topics keep the record timestamps evald writes, and time never deletes a record
#: the main stage has not read: evald deletes records once the main group committed past them
INTERNAL_TOPIC_CONFIGS = {"message.timestamp.type": "CreateTime", "retention.ms": "-1"}


def main_stage_settings(settings: Settings) -> Settings:
    """The settings the main stage runs with: the internal topics as its inputs."""
    group = settings.daemon.group_id
    topics = settings.topics.model_copy(
        update={
            "impressions": internal_topic(group, settings.topics.impressions),
            "feedback": internal_topic(group, settings.topics.feedback),
        }
    )
    return settings.model_copy(update={"topics": topics})


class SourceWatch:
    """When each source partition was last known to be fetched to its end: the interleave's
    ``caught_up`` (interleave.py).

    Not "position ≥ ``consumer.highwater``": that is the watermark of whichever fetch answered
    last, however old, and while a partition's leader moves it is stale. :class:`FetchWatch`
    keeps, per partition, when the latest fetch request answered without error was built and
    the watermark it reported; the partition is caught up as of that time if the consumer's
    position reaches that watermark (the position, not the last record's offset, passes the
    commit marker a transactional producer leaves at the end).
    """

    def __init__(self, consumer: Any, clock: Callable[[], float]) -> None:
        """Watch ``consumer``'s fetches (before its first poll), stamped with ``clock``."""
        self._consumer = consumer
        self._watch = FetchWatch(consumer, clock)

    def caught_up(self, tp: TopicPartition) -> float:
        """The time as of which ``tp`` is known to be fetched to its end (``-inf``: not now)."""
        answered = self._watch.answered(tp)
        if answered is None:
            return -math.inf  # no fetch answered yet: nothing is known
        sent_at, high = answered
        position = self._consumer.position(tp, timeout_ms=1_000)
        return sent_at if position is not None and position >= high else -math.inf


class _Fatal(Exception):
    """Misconfiguration no retry can fix: `evald run` exits 2 with this message."""


@dataclass
class RepartitionStats:
    """Counters of the stage (committed transactions only), read by scrapes under ``lock``."""

    #: source topic -> records copied to its internal topic
    repartitioned: Counter[str] = field(default_factory=Counter)
    #: (source topic, reason) -> records sent to the DLQ because their request id is unreadable
    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class RepartitionCollector:
    """Exposes :class:`RepartitionStats` (docs/metrics-reference.md)."""

    def __init__(self, stats: RepartitionStats) -> None:
        self.stats = stats

    def collect(self) -> Iterable[Metric]:
        with self.stats.lock:
            copied = sorted(self.stats.repartitioned.items())
            rejected = sorted(self.stats.rejected.items())
        family = CounterMetricFamily(
            "evald_repartitioned_records",
            "Input records copied to their internal topic, keyed by request id (committed)",
            labels=["topic"],
        )
        for topic, value in copied:
            family.add_metric([topic], value)
        yield family
        family = CounterMetricFamily(
            "evald_repartition_rejected_records",
            "Input records sent to the dead-letter topic by the repartition stage because "
            "their request id cannot be read (committed)",
            labels=["topic", "reason"],
        )
        for (topic, reason), value in rejected:
            family.add_metric([topic, reason], value)
        yield family


class _Listener(ConsumerRebalanceListener):
    def __init__(self, notes: _RebalanceNotes) -> None:
        self.notes = notes

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.notes.note("revoked", revoked)

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.notes.note("assigned", assigned)

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.notes.note("revoked", lost)


class _RebalanceNotes:
    """Rebalance events noted on kafka-python's I/O thread, taken by the stage's thread after
    its poll (taking a lock that thread holds across consumer calls could deadlock the I/O)."""

    def __init__(self) -> None:
        self._events: list[tuple[str, set[TopicPartition]]] = []
        self._lock = threading.Lock()

    def note(self, event: str, partitions: set[TopicPartition]) -> None:
        with self._lock:
            self._events.append((event, set(partitions)))

    def take(self) -> list[tuple[str, set[TopicPartition]]]:
        with self._lock:
            events, self._events = self._events, []
        return events


@dataclass(frozen=True)
class _Layout:
    """What the stage learnt about its topics at the session's start."""

    partitions: int = 1
    dlq_limit: int = DEFAULT_MAX_MESSAGE_BYTES
    #: the producer's batch_size, under the internal and DLQ topics' max.message.bytes
    batch_bytes: int = PRODUCER_BATCH_BYTES


class Repartitioner:
    """The stage. ``start()`` runs it on a thread; ``topics_ready`` is set once the internal
    topics exist; ``status`` is 2 after a fatal error (then ``on_fatal`` was called).

    Long because: one loop's clients, buffers and retry state (stop, backoff, the bootstrap
    verdicts in a row); what each does lives in the modules it imports.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        stats: RepartitionStats | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_fatal: Callable[[], None] | None = None,
        hold_s: float = HOLD_S,
    ) -> None:
        self.settings = settings
        self.stats = stats or RepartitionStats()
        self.clock = clock
        self.on_fatal = on_fatal or (lambda: None)
        self.topics_ready = threading.Event()
        self.status: int | None = None
        #: the stage's stop, which also ends a bootstrap under way; it closes each session's
        #: clients at its end (one whose constructor raised keeps its I/O thread otherwise)
        self._stop = StopEvent()
        #: failed bootstraps on which every address answered as another service (reach.py)
        self._misdirected = Misdirected()
        self._notes = _RebalanceNotes()
        self._thread: threading.Thread | None = None
        self._ids = RequestIdReader(settings.input.mapping)
        topics = settings.topics
        self._kinds = {topics.impressions: "impression", topics.feedback: "feedback"}
        self._backoff = Backoff(
            settings.daemon.retry_backoff_initial_ms / 1000,
            settings.daemon.retry_backoff_max_ms / 1000,
        )
        self._consumer: KafkaConsumer | None = None
        self._sources: SourceWatch | None = None
        self._producer: KafkaProducer | None = None
        self._admin: KafkaAdminClient | None = None
        impressions = topics.impressions
        self._buffer: Interleaver[TopicPartition] = Interleaver(
            hold_s, clock, rank=lambda tp: (tp.topic != impressions, tp.topic, tp.partition)
        )
        self._paused: set[TopicPartition] = set()
        self._layout = _Layout()
        self._last_purge = 0.0

    # -- public ---------------------------------------------------------------------------

    def start(self) -> None:
        """Run :meth:`run` on a thread of its own."""
        self._thread = threading.Thread(target=self.run, name="evald-repartition", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish the cycle under way, leave the group; wait up to ``timeout`` for the thread."""
        self._stop.set()
        if self._thread is not None and timeout is not None:
            self._thread.join(timeout)

    def wait_ready(self, beat: Callable[[], None]) -> bool:
        """Block until the internal topics exist (True), or the stage failed or was stopped
        (False). ``beat`` is called meanwhile: retrying a broker that is away at the start is
        alive (the main stage's /healthz heartbeat)."""
        while not self.topics_ready.wait(0.2):
            beat()
            if self._stop.is_set() or self.status is not None:
                return False
        return True

    def run(self) -> int:
        """Sessions until stopped; transient failures are retried with backoff."""
        while not self._stop.is_set():
            try:
                self._session()
                return 0
            except _Fatal as exc:
                return self._fail(f"evald run: repartition stage: {exc}")
            except (KafkaError, OSError, TimeoutError) as exc:
                advice = unrecoverable(exc)
                if advice is not None:
                    return self._fail(f"evald run: repartition stage cannot continue: {advice}")
                why, hint = self._explain(exc)
                # e.g. the stop ended a bootstrap, or came during the diagnosis
                if self._stop.is_set():
                    log.info("repartition stage stopping: the session ended on %r", exc)
                    return 0
                if why is not None:
                    return self._fail(f"evald run: repartition stage cannot continue: {why}")
                delay = self._backoff.next_delay()
                log.warning(
                    "repartition session failed (%s: %s%s); retrying in %.1fs",
                    type(exc).__name__,
                    exc,
                    hint,
                    delay,
                )
            except Exception:
                self._misdirected.reset()  # this session got past its bootstrap
                # never die on a surprise: the state is in Kafka, a new session resumes it
                delay = self._backoff.next_delay()
                log.exception("repartition session failed unexpectedly; retrying in %.1fs", delay)
            finally:
                self._teardown()
            self._stop.wait(delay)
        return 0

    # -- session --------------------------------------------------------------------------

    def _explain(self, exc: BaseException) -> tuple[str | None, str]:
        """Advice when no retry can fix a failed bootstrap (reach.py), and what each
        bootstrap address did for the retry's line ("" when not a failed bootstrap)."""
        kafka = self.settings.kafka
        found = diagnose(exc, kafka.bootstrap_servers, kafka.security_protocol, self._stop)
        if found is None:
            self._misdirected.reset()
            return None, ""
        advice, hint = self._misdirected.judge(found, self.clock())
        return advice, f": {hint}"

    def _fail(self, message: str) -> int:
        log.error("%s", message)
        self.status = 2
        self.on_fatal()
        return 2

    def _session(self) -> None:
        cfg = self.settings
        client = cfg.kafka.client_config(self._stop.client)
        check_resolves(cfg.kafka.bootstrap_servers)  # evald says so, at once (reach.py)
        self._admin = KafkaAdminClient(bootstrap_timeout_ms=client["request_timeout_ms"], **client)
        self._prepare_topics(self._admin)
        # the static member id in the stage's own group (the transactional id: names.py)
        stage_id = repartition_member(cfg.daemon.instance_id)
        self._producer = KafkaProducer(
            transactional_id=cfg.daemon.transactional_id(repartition=True),
            transaction_timeout_ms=cfg.kafka.transaction_timeout_ms,
            max_block_ms=cfg.kafka.request_timeout_ms,
            linger_ms=PRODUCER_LINGER_MS,
            batch_size=self._layout.batch_bytes,
            max_request_size=max(self._layout.dlq_limit, KAFKA_PYTHON_MAX_REQUEST_SIZE),
            **without_auto_create(),
            **client,
        )
        # fences and aborts whatever a previous incarnation of this instance left open
        self._producer.init_transactions()
        static = cfg.daemon.static_membership
        self._consumer = KafkaConsumer(
            group_id=repartition_group(cfg.daemon.group_id),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=cfg.kafka.session_timeout_ms,
            heartbeat_interval_ms=cfg.kafka.heartbeat_interval_ms,
            max_poll_interval_ms=cfg.kafka.max_poll_interval_ms,
            max_poll_records=cfg.daemon.max_poll_records,
            group_instance_id=stage_id if static else None,
            **without_auto_create(),
            **client,
        )
        self._sources = SourceWatch(self._consumer, self.clock)
        # the group's first assignment is computed from the consumer's metadata: fetched now,
        # or kafka-python may join before it has the topics and assign nothing until its next
        # metadata refresh (minutes)
        for name in self._kinds:
            if not self._consumer.partitions_for_topic(name):
                raise KafkaError(f"no partition metadata for {name} yet")
        self._consumer.subscribe(list(self._kinds), listener=_Listener(self._notes))
        self.topics_ready.set()
        while not self._stop.is_set():
            self._cycle()
        self._consumer.close(autocommit=False, timeout_ms=5_000)
        self._consumer = None

    def _prepare_topics(self, admin: KafkaAdminClient) -> None:
        """Refuse missing inputs or internal topics of another partition count; create the
        missing internal topics (and the DLQ, which this stage may write first)."""
        topics = self.settings.topics
        sources = (topics.impressions, topics.feedback)
        internal = tuple(self._internal()[name] for name in sources)
        counts = _partition_counts(admin, (*sources, *internal, topics.dlq))
        missing = [name for name in sources if counts[name] is None]
        if missing:
            raise _Fatal(
                f"input topic(s) {', '.join(missing)} do not exist; evald never creates input "
                "topics"
            )
        existing = {name: n for name in internal if (n := counts[name]) is not None}
        configured = self.settings.input.repartition_partitions
        wanted = configured or next(iter(existing.values()), None) or counts[topics.impressions]
        assert wanted is not None
        wrong = {name: n for name, n in existing.items() if n != wanted}
        if wrong:
            shown = ", ".join(f"{name} has {n}" for name, n in sorted(existing.items()))
            raise _Fatal(
                f"internal topics must both have {wanted} partitions, but {shown}; set "
                "input.repartition_partitions to their count, or delete them (with the "
                "consumer groups of this daemon and its results/checkpoint topics) to start over"
            )
        create = [name for name in internal if name not in existing]
        if create:
            log.info("creating topics %s with %d partitions", create, wanted)
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [
                        NewTopic(name, wanted, -1, topic_configs=INTERNAL_TOPIC_CONFIGS)
                        for name in create
                    ]
                )
            self._await_created(admin, internal, wanted)
        if counts[topics.dlq] is None:
            log.info("creating topic %s with %d partitions", topics.dlq, wanted)
            create_dlq(admin, topics.dlq, wanted, topics.results)
        # a limit bounds a whole batch: an internal topic accepting less than the batch refused
        # every batch of small copies, and the transaction waited on them forever
        dlq = max_message_bytes(admin, topics.dlq)
        limits = [dlq, *(max_message_bytes(admin, name) for name in internal)]
        self._layout = _Layout(wanted, dlq, batch_under(PRODUCER_BATCH_BYTES, limits))

    def _await_created(self, admin: KafkaAdminClient, names: tuple[str, ...], count: int) -> None:
        """Return once the new topics are described with all their partitions, so the main
        stage's first join sees them (else: an error, and the session is retried)."""
        deadline = self.clock() + self.settings.kafka.request_timeout_ms / 1000
        while _partition_counts(admin, names) != dict.fromkeys(names, count):
            if self.clock() > deadline or self._stop.wait(0.2):
                raise KafkaError(f"the new topics {', '.join(names)} are not visible yet")

    def _cycle(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        unpark_resumed(consumer)
        batches = consumer.poll(timeout_ms=self.settings.daemon.poll_timeout_ms)
        fresh = self._apply_rebalance()
        for tp in fresh:
            self._seek_committed(consumer, tp)
        assigned = sorted(consumer.assignment())
        owned = set(assigned)
        for tp, records in batches.items():
            # a fresh partition is fetched again from its commit; a revoked one is not ours
            if tp in owned and tp not in fresh:
                self._buffer.extend(tp, records)
        sources = self._sources
        assert sources is not None
        released = self._buffer.release(assigned, sources.caught_up)
        if released:
            self._transaction(consumer, released)
        self._flow(consumer, assigned)
        if self.clock() - self._last_purge >= PURGE_INTERVAL_S:
            self._purge()

    def _transaction(self, consumer: KafkaConsumer, released: list[Any]) -> None:
        """Steps 3-6 of the cycle (module docstring)."""
        producer = self._producer
        assert producer is not None
        producer.begin_transaction()
        appender = RecordAppender(producer)
        internal, partitions = self._internal(), self._layout.partitions
        futures: list[Any] = []
        copied: Counter[str] = Counter()
        rejected: Counter[tuple[str, str]] = Counter()
        touched: set[TopicPartition] = set()
        started: set[TopicPartition] = set()  # internal partitions added to the transaction
        for record in released:
            kind = self._kinds[record.topic]
            touched.add(TopicPartition(record.topic, record.partition))
            key = self._ids.key(record.value, kind)
            if isinstance(key, Unkeyable):
                futures.append(self._dead_letter(producer, record, kind, key))
                rejected[(record.topic, key.reason)] += 1
                continue
            tp = TopicPartition(internal[record.topic], partition_for(key, partitions))
            first = tp not in started
            started.add(tp)
            futures.append(
                appender.send(
                    tp,
                    key,
                    record.value,
                    first_in_transaction=first,
                    timestamp_ms=record.timestamp,
                    headers=list(record.headers or ()),
                )
            )
            copied[record.topic] += 1
        producer.flush(timeout=self.settings.kafka.request_timeout_ms / 1000)
        for future in futures:
            future.get(timeout=0)  # raises the send's error: the session ends, the txn aborts
        crash_point("repartition_sent")
        offsets = {}
        for tp in touched:
            held = self._buffer.next_offset(tp)
            offsets[tp] = OffsetAndMetadata(
                held if held is not None else consumer.position(tp), "", -1
            )
        answer_s = self.settings.kafka.transaction_timeout_ms / 1000
        send_offsets_within(producer, offsets, consumer.group_metadata(), answer_s)
        crash_point("repartition_offsets_sent")
        commit_within(producer, answer_s)
        crash_point("repartition_committed")
        with self.stats.lock:
            self.stats.repartitioned.update(copied)
            self.stats.rejected.update(rejected)
        self._backoff.reset()

    def _dead_letter(self, producer: KafkaProducer, record: Any, kind: str, why: Unkeyable) -> Any:
        """The record's dead letter, with the headers the main stage's letters carry."""
        headers = [
            ("evald-reason", why.reason.encode()),
            ("evald-detail", why.detail.encode()[:4096]),
            ("evald-source-topic", record.topic.encode()),
            ("evald-source-partition", str(record.partition).encode()),
            ("evald-source-offset", str(record.offset).encode()),
            ("evald-kind", kind.encode()),
        ]
        value = record.value if record.value is not None else b""
        letter = build_letter(record.key, value, headers, self._layout.dlq_limit)
        return producer.send(
            self.settings.topics.dlq, key=letter.key, value=letter.value, headers=letter.headers
        )

    def _internal(self) -> dict[str, str]:
        """Source topic -> its internal topic."""
        group = self.settings.daemon.group_id
        return {name: internal_topic(group, name) for name in self._kinds}

    def _flow(self, consumer: KafkaConsumer, assigned: list[TopicPartition]) -> None:
        """Pause a source partition whose buffer is full, resume it once half drained."""
        for tp in assigned:
            held = self._buffer.buffered(tp)
            if tp not in self._paused and held > BUFFER_CAP:
                consumer.pause(tp)
                self._paused.add(tp)
            elif tp in self._paused and held <= BUFFER_CAP // 2:
                consumer.resume(tp)
                self._paused.discard(tp)

    def _seek_committed(self, consumer: KafkaConsumer, tp: TopicPartition) -> None:
        """Read ``tp`` from this group's last commit (a reassigned partition may keep an old
        position and fetched records in kafka-python)."""
        committed = consumer.committed(tp)
        if committed is None:
            consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, committed)

    def _purge(self) -> None:
        """Delete the internal records the main stage's group has committed past (as Kafka
        Streams purges its repartition topics); a failure only waits for the next time."""
        self._last_purge = self.clock()
        admin = self._admin
        assert admin is not None
        group = self.settings.daemon.group_id
        internal = set(self._internal().values())
        try:
            offsets = admin.list_group_offsets({group: None}).get(group) or {}
            below = {
                tp: meta.offset
                for tp, meta in offsets.items()
                if tp.topic in internal and meta.offset > 0
            }
            if below:
                admin.delete_records(below)
        except KafkaError as exc:
            log.debug("purging the internal topics skipped: %s", exc)

    # -- rebalance ----------------------------------------------------------------------

    def _apply_rebalance(self) -> set[TopicPartition]:
        """Forget what was buffered for revoked and for newly assigned partitions; return the
        newly assigned ones (to be read from their committed offsets)."""
        fresh: set[TopicPartition] = set()
        for event, partitions in self._notes.take():
            for tp in partitions:
                self._buffer.drop(tp)
                self._paused.discard(tp)
            if event == "assigned":
                fresh |= partitions
            else:
                fresh -= partitions
        return fresh

    # -- teardown -------------------------------------------------------------------------

    def _teardown(self) -> None:
        """Close what the session opened; an open transaction is left for the broker."""
        for name in ("_consumer", "_admin", "_producer"):
            client = getattr(self, name)
            if client is not None:
                close_quietly(client)
                setattr(self, name, None)
        self._sources = None
        self._buffer.clear()
        self._paused.clear()
        self._notes.take()
        self._stop.close_clients()


def _partition_counts(admin: KafkaAdminClient, names: tuple[str, ...]) -> dict[str, int | None]:
    """Each topic's partition count (None: it does not exist)."""
    existing = set(admin.list_topics())
    counts: dict[str, int | None] = dict.fromkeys(names)
    present = sorted({name for name in names if name in existing})
    for desc in admin.describe_topics(present) if present else []:
        name = desc.get("name") or desc.get("topic")
        if not desc.get("error_code") and name in counts:
            counts[name] = len(desc["partitions"])
    return counts
