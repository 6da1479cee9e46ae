"""The consumer loop of `evald run`: poll, merge, feed, tick, and commit it all in one transaction.

One *session* = one consumer, one transactional producer, one engine. Anything transient that
goes wrong (broker gone, coordinator moved, transaction fenced) ends the session: the open
transaction is abandoned (the broker aborts it), the clients are closed, and after a jittered
backoff a new session restores every assigned partition from its last committed checkpoint.
That single recovery path is what makes crash, rebalance and outage behave the same way; see
docs/design.md for why the result is exactly-once.

Threading: kafka-python runs network I/O and rebalance callbacks on its own thread while the
main thread is inside ``poll()``/``close()``; the callbacks here only record what happened
(plus, on revocation, commit through the producer, which has its own I/O thread), and all
engine work stays on the main thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import zlib
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import (
    CommitFailedError,
    FencedInstanceIdError,
    IllegalGenerationError,
    InvalidProducerEpochError,
    KafkaError,
    ProducerFencedError,
    TopicAlreadyExistsError,
    UnknownMemberIdError,
)
from kafka.structs import OffsetAndMetadata

from evald.daemon import snapshots
from evald.daemon.backoff import Backoff
from evald.daemon.checkpoint import (
    Checkpoint,
    ResultRange,
    SnapshotRef,
    extend_ranges,
    from_runs,
    prune_ranges,
    to_runs,
)
from evald.daemon.dead_letters import (
    DEFAULT_MAX_MESSAGE_BYTES,
    build_letter,
    max_message_bytes,
)
from evald.daemon.fatal import unrecoverable
from evald.daemon.kafka_compat import RecordAppender, unpark_resumed
from evald.daemon.logs import event_time
from evald.daemon.merge import KINDS, Merger
from evald.daemon.restore import (
    Progress,
    RestoreError,
    read_checkpoint,
    read_ranges,
    read_snapshot,
)
from evald.daemon.results import ResultEncoder
from evald.daemon.settings import Settings
from evald.daemon.stats import DaemonStats
from evald.daemon.topics import (
    TopicLayoutError,
    TopicShape,
    check_checkpoint_ids,
    check_layout,
    check_unchanged,
    missing_outputs,
)
from evald.decode import Rejection
from evald.engine import Engine, Result

__all__ = ["Daemon", "EngineFactory"]

log = logging.getLogger("evald.daemon")

EngineFactory = Callable[[Callable[[Result], None]], Engine]
"""Builds a fresh engine whose ``on_result`` is the given callback."""

#: how long restoring one partition may take before the session is restarted
#: a restore read that makes no progress for this long fails (transient); no overall deadline
RESTORE_STALL_S = 60.0
#: records of one kind held in a partition's merge buffer before its fetch is paused
MERGE_BUFFER_CAP = 20_000
#: producer batching: one cycle's results for a partition fit in one batch, so the sender thread
#: is woken per batch rather than per record (a second queued batch makes kafka-python report
#: every append as "batch full" and wake the sender on each send); commits flush anyway
PRODUCER_BATCH_BYTES = 512 * 1024
PRODUCER_LINGER_MS = 50
#: kafka-python's default ``max_request_size``
KAFKA_PYTHON_MAX_REQUEST_SIZE = 1_048_576
#: after backpressure let impressions through because no feedback was left to drain pending
#: ones, the engine's cap evicts; it is not paused again for this long (no pause/resume flapping)
BACKPRESSURE_COOLDOWN_S = 10.0
#: backpressure state changes are logged at most this often (with a count of those in between)
BACKPRESSURE_LOG_INTERVAL_S = 10.0
#: how often the input topics' ids and partition counts are compared with those seen at start
TOPIC_CHECK_INTERVAL_S = 10.0
#: the id a broker reports for a topic when it has none (Kafka's Uuid.ZERO)
NO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"


#: the broker refusing a commit because a newer incarnation or generation owns the work
FENCING_ERRORS = (
    ProducerFencedError,
    InvalidProducerEpochError,
    CommitFailedError,
    IllegalGenerationError,
    UnknownMemberIdError,
    FencedInstanceIdError,
)


CRASH_ENV = "TESTING_EVALD_CRASH_AT"
"""Test-only fault injection: ``TESTING_EVALD_CRASH_AT=<step>`` makes the process SIGKILL itself
the first time it reaches that step of the commit cycle (``results_sent``, ``offsets_sent``,
``committed``: in a transaction holding results; ``revoking``: once results were committed) or
of a restore (``restore``). Not
an ``EVALD_*`` name: those are all settings."""


def _crash_point(step: str, armed: bool = True) -> None:
    if armed and os.environ.get(CRASH_ENV) == step:
        log.warning("%s=%s: killing this process", CRASH_ENV, step)
        os.kill(os.getpid(), 9)


class _Fatal(Exception):
    """Ends the daemon with an exit status (e.g. topics not co-partitioned: 2)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Part:
    """The daemon's bookkeeping for one owned partition number p (both input topics)."""

    partition: int
    merger: Merger[Any]
    restored: bool = False
    fed_next: dict[str, int] = field(default_factory=dict)
    fetched_next: dict[str, int] = field(default_factory=dict)
    #: per kind, the offset the restored checkpoint had consumed up to: records below it are
    #: read again only to rebuild pending joins
    replay_end: dict[str, int] = field(default_factory=dict)
    ranges: tuple[ResultRange, ...] = ()
    epoch_start: int | None = None
    #: the committed snapshot of p's window aggregates; ``ranges`` are the results after it
    snapshot: SnapshotRef | None = None
    #: futures of the first and the last result sent in the open transaction (offsets grow
    #: within a partition: the idempotent producer keeps their order)
    txn_first: Any = None
    txn_last: Any = None
    txn_count: int = 0
    txn_max_ts: int | None = None
    dirty: bool = False
    merge_paused: set[str] = field(default_factory=set)


class _Listener(ConsumerRebalanceListener):
    """Rebalance callbacks (run on kafka-python's I/O thread while the main thread polls)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.daemon._on_revoked({tp.partition for tp in revoked}, lost=False)

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.daemon._on_assigned({tp.partition for tp in assigned})

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.daemon._on_revoked({tp.partition for tp in lost}, lost=True)


class Daemon:
    """`evald run`'s loop. ``run()`` returns the exit status; ``stop()`` may be called anytime."""

    def __init__(
        self,
        settings: Settings,
        engine_factory: EngineFactory,
        *,
        stats: DaemonStats | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_engine: Callable[[Any], None] | None = None,
        merge_hold_s: float = 2.0,
        heartbeat: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        #: called on every cycle and every retry: /healthz is red only when the loop is stuck
        self._beat = heartbeat or (lambda: None)
        self.engine_factory = engine_factory
        self.stats = stats or DaemonStats()
        self.clock = clock
        self.on_engine = on_engine
        self.merge_hold_s = merge_hold_s
        self._stop = threading.Event()
        #: held around every engine access; scrapes take it to copy a consistent state. Never
        #: held across consumer.poll()/close(): rebalance callbacks take it on the I/O thread.
        self.lock = threading.RLock()
        self._backoff = Backoff(
            settings.daemon.retry_backoff_initial_ms / 1000,
            settings.daemon.retry_backoff_max_ms / 1000,
        )
        self._parts: dict[int, _Part] = {}
        self._to_restore: set[int] = set()
        self._engine: Engine | None = None
        self._consumer: KafkaConsumer | None = None
        self._producer: KafkaProducer | None = None
        self._reader: KafkaConsumer | None = None
        self._admin: KafkaAdminClient | None = None
        #: the input topics as first seen by this process; kept across sessions, so a topic
        #: recreated during an outage is noticed when the next session starts
        self._inputs: dict[str, TopicShape] = {}
        self._last_topic_check = 0.0
        self._txn_open = False
        self._txn_poisoned = False
        self._abandoning = False
        self._joined = False
        #: why the last session failed, shown on /readyz until a new session has joined
        self._retrying: str | None = None
        self._bp_paused = False
        #: the impressions partitions backpressure paused (not those still fetching a replay)
        self._bp_tps: set[TopicPartition] = set()
        #: no new pause before this time (monotonic clock): set when feedback ran dry
        self._bp_cooldown_until = 0.0
        self._bp_logged_at: float | None = None
        self._bp_unlogged = 0
        #: last time records were fed or the lag was zero (the stall signal of /readyz)
        self._progress_at = clock()
        self._max_pending = 1
        self._uncommitted = 0
        self._pending_dlq: list[str] = []
        #: futures of the dead letters sent in the open transaction, with their source
        self._dlq_sent: list[tuple[Any, tuple[str, int, int]]] = []
        #: sources whose dead letter the broker refused: written as headers only from now on
        #: (kept across sessions, so the re-read record does not fail the same way again)
        self._minimal_letters: set[tuple[str, int, int]] = set()
        self._dlq_limit = DEFAULT_MAX_MESSAGE_BYTES
        self._encoder = ResultEncoder()
        self._appender: RecordAppender | None = None
        self._results_tps: dict[int, TopicPartition] = {}
        self._last_commit = clock()
        self._last_probe = 0.0
        #: a poll returned records since the last probe (the broker is answering)
        self._fetched = False
        self._broker_ok = False
        self.started_at = clock()
        self.ready_at: float | None = None

    # -- public ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish: stop fetching, commit, leave the group, return 0."""
        self._stop.set()

    def ready(self) -> tuple[bool, str]:
        """/readyz: every assigned partition restored and the broker answering."""
        if self._retrying is not None:
            return False, self._retrying
        if not self._broker_ok:
            return False, "broker not reachable (retrying)"
        if self._consumer is None:
            return False, "not connected"
        if not self._joined:
            return False, "joining the consumer group"
        waiting = sorted(self._to_restore | {p for p, s in self._parts.items() if not s.restored})
        if waiting:
            return False, f"restoring partitions {waiting}"
        stalled = self.stalled()
        if stalled:
            return False, stalled
        return True, "ok"

    def stalled(self) -> str | None:
        """Why the loop counts as stalled: records are waiting (lag) but none was fed for
        ``daemon.stall_timeout_s``; None while it makes progress or has nothing to do."""
        lag = sum(self.stats.lag.values())
        idle = self.clock() - self._progress_at
        if lag > 0 and idle > self.settings.daemon.stall_timeout_s:
            return f"stalled: {lag} records of lag and nothing consumed for {idle:.0f}s"
        return None

    def run(self) -> int:
        """Run sessions until stopped; transient failures are retried with backoff."""
        while not self._stop.is_set():
            try:
                self._session()
                return 0
            except _Fatal as exc:
                log.error("%s", exc)
                return exc.status
            except (KafkaError, OSError, RestoreError, TimeoutError) as exc:
                advice = unrecoverable(exc)
                if advice is not None:
                    log.error("evald run: cannot continue: %s", advice)
                    return 2
                if isinstance(exc, FENCING_ERRORS):
                    with self.stats.lock:
                        self.stats.fenced += 1
                self._set_ready(False)
                delay = self._backoff.next_delay()
                self._retrying = f"retrying after {type(exc).__name__}: {exc}"
                log.warning(
                    "kafka session failed (%s: %s); retrying in %.1fs",
                    type(exc).__name__,
                    exc,
                    delay,
                )
            except Exception:
                # never die on a surprise: the state is in Kafka, a new session restores it
                self._set_ready(False)
                delay = self._backoff.next_delay()
                log.exception("kafka session failed unexpectedly; retrying in %.1fs", delay)
            finally:
                self._teardown()
            self._beat()  # retrying a broker that is away is alive, only not ready
            self._stop.wait(delay)
        return 0

    # -- session --------------------------------------------------------------------------

    def _session(self) -> None:
        cfg = self.settings
        client = cfg.kafka.client_config()
        self.stats.sessions += 1
        self._admin = KafkaAdminClient(**client)
        self._check_topics(self._admin)
        self._engine = self.engine_factory(self._on_result)
        self._max_pending = self._engine.config.max_pending
        if self.on_engine is not None:
            self.on_engine(self._engine)
        self._producer = KafkaProducer(
            transactional_id=f"evald-{cfg.daemon.group_id}-{cfg.daemon.instance_id}",
            transaction_timeout_ms=cfg.kafka.transaction_timeout_ms,
            max_block_ms=cfg.kafka.request_timeout_ms,
            linger_ms=PRODUCER_LINGER_MS,
            batch_size=PRODUCER_BATCH_BYTES,
            # never refuse a dead letter the DLQ topic accepts (letters are fitted to its limit)
            max_request_size=max(self._dlq_limit, KAFKA_PYTHON_MAX_REQUEST_SIZE),
            **client,
        )
        # fences and aborts whatever a previous incarnation of this instance left open
        self._producer.init_transactions()
        self._appender = RecordAppender(self._producer)
        # neither consumer may create a topic: after a broker lost its data, an input topic
        # created empty by a metadata request would be consumed as if nothing had happened
        self._reader = KafkaConsumer(
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_uncommitted",
            allow_auto_create_topics=False,
            **client,
        )
        self._consumer = KafkaConsumer(
            group_id=cfg.daemon.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=cfg.kafka.session_timeout_ms,
            heartbeat_interval_ms=cfg.kafka.heartbeat_interval_ms,
            max_poll_interval_ms=cfg.kafka.max_poll_interval_ms,
            max_poll_records=cfg.daemon.max_poll_records,
            group_instance_id=cfg.daemon.instance_id if cfg.daemon.static_membership else None,
            allow_auto_create_topics=False,
            **client,
        )
        self._consumer.subscribe(
            [cfg.topics.impressions, cfg.topics.feedback], listener=_Listener(self)
        )
        self._broker_ok = True
        self._last_commit = self._progress_at = self.clock()  # an outage is not a stall
        while not self._stop.is_set():
            self._cycle()
        self._shutdown()

    def _check_topics(self, admin: KafkaAdminClient) -> None:
        """Refuse input topics that are missing, not co-partitioned or not those this process
        consumed before; create missing output topics."""
        topics = self.settings.topics
        inputs = (topics.impressions, topics.feedback)
        outputs = (topics.results, topics.checkpoint_topic, topics.dlq)
        shapes = _describe(admin, (*inputs, *outputs))
        counts = {
            name: None if shape is None else shape.partitions for name, shape in shapes.items()
        }
        try:
            # first: a topic this process consumed before and that is gone now gets the message
            # that says what to do about the old offsets, not the one for a first start
            check_unchanged(self._inputs, shapes)
            partitions = check_layout(
                counts, impressions=topics.impressions, feedback=topics.feedback, outputs=outputs
            )
        except TopicLayoutError as exc:
            raise _Fatal(2, f"evald run: refusing to start: {exc}") from None
        # check_layout passed: both inputs exist
        self._inputs = {name: shape for name in inputs if (shape := shapes[name]) is not None}
        self._last_topic_check = self.clock()
        self._dlq_limit = max_message_bytes(admin, topics.dlq)
        create = missing_outputs(counts, outputs)
        if create:
            log.info("creating output topics %s with %d partitions", create, partitions)
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics([NewTopic(name, partitions, 1) for name in create])

    def _recheck_topics(self) -> None:
        """Stop (exit 2) when an input topic was deleted, recreated or repartitioned."""
        admin = self._admin
        assert admin is not None
        self._last_topic_check = self.clock()
        try:
            shapes = _describe(admin, tuple(self._inputs))
        except KafkaError as exc:
            log.debug("topic check skipped: %s", exc)  # the lag probe reports the broker
            return
        try:
            check_unchanged(self._inputs, shapes)
        except TopicLayoutError as exc:
            raise _Fatal(2, f"evald run: stopping: {exc}") from None

    def _cycle(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        self._beat()
        unpark_resumed(consumer)
        batches = consumer.poll(timeout_ms=self.settings.daemon.poll_timeout_ms)
        if self._txn_poisoned:
            raise KafkaError("transaction aborted during a rebalance; resynchronising")
        with self.lock:
            self._take(batches)
            fed = self._feed()
            assert self._engine is not None
            self._engine.tick()
            self._backpressure(fed)
            self._uncommitted += fed
            now = self.clock()
            if fed:
                self._progress_at = now
            interval = self.settings.daemon.commit_interval_ms / 1000
            if (
                self._uncommitted >= self.settings.daemon.commit_max_records
                or now - self._last_commit >= interval
            ):
                self._commit()
                self._last_commit = now
        if now - self._last_probe >= interval:
            self._probe()
            self._last_probe = now
        if now - self._last_topic_check >= TOPIC_CHECK_INTERVAL_S:
            self._recheck_topics()

    # -- input ----------------------------------------------------------------------------

    def _kind(self, topic: str) -> str:
        return "impression" if topic == self.settings.topics.impressions else "feedback"

    def _tp(self, kind: str, p: int) -> TopicPartition:
        topics = self.settings.topics
        return TopicPartition(topics.impressions if kind == "impression" else topics.feedback, p)

    def _take(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """Restore the partitions assigned since the last cycle, then buffer what the poll
        returned. A partition restored now drops this poll's records: they may come from the
        position it had before (kafka-python can keep a reassigned partition's position and
        fetched batches), and the restore's seek has them fetched again from the checkpoint.
        Taken as an offset gap instead, they would make the re-fetch look like a duplicate."""
        restored = set(self._to_restore)
        for p in sorted(restored):
            self._restore(p)
        self._to_restore.clear()
        for tp, records in batches.items():
            if tp.partition not in restored:
                self._buffer(tp, records)
                self._fetched = True

    def _buffer(self, tp: TopicPartition, records: list[Any]) -> None:
        part = self._parts.get(tp.partition)
        if part is None or not part.restored or not records:
            return  # not ours (any more): the new owner re-reads from the committed offset
        kind = self._kind(tp.topic)
        expected = part.fetched_next[kind]
        if records[0].offset < expected:  # re-fetched after a seek: skip what we have
            records = [record for record in records if record.offset >= expected]
            if not records:
                return
        first, last = records[0].offset, records[-1].offset
        if first > expected or last - first + 1 != len(records):
            # a gap can only come from compaction/retention (or transaction markers): accept
            # it, never go back
            log.debug("offset gap on %s: expected %d, got %d..%d", tp, expected, first, last)
        replay_end = part.replay_end.get(kind, 0)
        if first < replay_end:
            # rebuilding pending joins: these records were merged before the crash
            replayed = records[: bisect_left(records, replay_end, key=attrgetter("offset"))]
            part.merger.extend(
                kind, [record.timestamp for record in replayed], replayed, replayed=True
            )
            records = records[len(replayed) :]
        if records:
            part.merger.extend(kind, [record.timestamp for record in records], records)
        part.fetched_next[kind] = last + 1
        consumer = self._consumer
        assert consumer is not None
        if part.merger.buffered(kind) > MERGE_BUFFER_CAP and kind not in part.merge_paused:
            consumer.pause(tp)
            part.merge_paused.add(kind)

    def _caught_up(self, part: _Part) -> dict[str, bool]:
        """Per kind: fetched up to the latest fetch high watermark, or its impressions paused by
        backpressure; never before the records to replay are all fetched (a fetch high
        watermark can be stale, the restored checkpoint's offsets are not, and replayed
        records of the other kind skip the hold on the strength of this)."""
        consumer = self._consumer
        assert consumer is not None
        out = {}
        for kind in KINDS:
            fetched = part.fetched_next[kind]
            if fetched < part.replay_end.get(kind, 0):
                out[kind] = False
                continue
            tp = self._tp(kind, part.partition)
            high = consumer.highwater(tp)
            paused = tp in self._bp_tps
            out[kind] = paused or (high is not None and fetched >= high)
        return out

    def _feed(self) -> int:
        engine = self._engine
        consumer = self._consumer
        assert consumer is not None and engine is not None
        feed_batch = engine.feed_batch
        fed = 0
        for p, part in sorted(self._parts.items()):
            if not part.restored:
                continue
            fed_next = part.fed_next
            runs = part.merger.release_runs(self._caught_up(part))
            if runs:
                # one engine call per partition and cycle: feed_batch pays its setup per call
                records: list[Any] = []
                kinds: list[str] = []
                for kind, run in runs:
                    records += run
                    kinds += repeat(kind, len(run))
                    fed_next[kind] = run[-1].offset + 1
                rejections = feed_batch(
                    [record.value or b"" for record in records],
                    partition=p,
                    kinds=kinds,
                    offsets=[record.offset for record in records],
                    timestamps=[record.timestamp for record in records],
                )
                for position, rejection in rejections:
                    self._dead_letter(rejection, records[position], kinds[position])
                part.dirty = True
                fed += len(records)
            for kind in list(part.merge_paused):
                if part.merger.buffered(kind) <= MERGE_BUFFER_CAP // 2:
                    part.merge_paused.discard(kind)
                    if self._tp(kind, p) not in self._bp_tps:
                        consumer.resume(self._tp(kind, p))
        return fed

    def _backpressure(self, fed: int) -> None:
        """Pause the impressions near max_pending while feedback can drain them; else let the
        engine's cap evict (docs/design.md, "Backpressure and memory").

        Pausing helps only while feedback is there to move the watermark: buffered, or behind
        the high watermark on an owned partition. Without it (a flood of impressions whose
        feedback never comes), a pause only stalls; impressions are released at once and not
        paused again for ``BACKPRESSURE_COOLDOWN_S``, and the cap closes the earliest-deadline
        impression per new one, at close to the uncapped rate.
        """
        consumer = self._consumer
        assert consumer is not None and self._engine is not None
        pending = self._engine.pending()
        self.stats.peak_pending = max(self.stats.peak_pending, pending)
        daemon = self.settings.daemon
        now = self.clock()
        if not self._bp_paused:
            if (
                pending >= daemon.pause_at * self._max_pending
                and now >= self._bp_cooldown_until
                and self._feedback_waiting()
            ):
                self._pause_impressions(pending, now)
            return
        if pending <= daemon.resume_at * self._max_pending:
            self._resume_impressions(pending, now, "drained")
        elif not self._feedback_waiting():
            self._bp_cooldown_until = now + BACKPRESSURE_COOLDOWN_S
            self._resume_impressions(pending, now, "no feedback to drain them; the cap evicts")

    def _feedback_waiting(self) -> bool:
        """Feedback is buffered, or fetchable, on a restored partition."""
        consumer = self._consumer
        assert consumer is not None
        for p, part in self._parts.items():
            if not part.restored:
                continue
            if part.merger.buffered("feedback"):
                return True
            high = consumer.highwater(self._tp("feedback", p))
            if high is not None and part.fetched_next["feedback"] < high:
                return True
        return False

    def _pause_impressions(self, pending: int, now: float) -> None:
        consumer = self._consumer
        assert consumer is not None
        self._bp_paused = True
        self.stats.pauses += 1
        # a partition still fetching its replay is not paused: the replayed impressions were
        # pending before the restart, and the other topic's replayed records wait for them
        pause = [
            self._tp("impression", p)
            for p, part in self._parts.items()
            if part.restored
            and part.fetched_next["impression"] >= part.replay_end.get("impression", 0)
        ]
        self._bp_tps = set(pause)
        if pause:
            consumer.pause(*pause)
        self._log_backpressure(
            now, "backpressure: %d pending impressions, pausing impressions", pending
        )

    def _resume_impressions(self, pending: int, now: float, why: str) -> None:
        consumer = self._consumer
        assert consumer is not None
        self._bp_paused = False
        resume = [
            tp
            for tp in self._bp_tps
            if tp.partition in self._parts
            and "impression" not in self._parts[tp.partition].merge_paused
        ]
        self._bp_tps = set()
        if resume:
            consumer.resume(*resume)
        self._log_backpressure(
            now, "backpressure released (%s): %d pending impressions", why, pending
        )

    def _log_backpressure(self, now: float, message: str, *args: Any) -> None:
        """Log a state change, at most once per BACKPRESSURE_LOG_INTERVAL_S."""
        if (
            self._bp_logged_at is not None
            and now - self._bp_logged_at < BACKPRESSURE_LOG_INTERVAL_S
        ):
            self._bp_unlogged += 1
            return
        if self._bp_unlogged:
            message += " (%d more changes since the last line)"
            args = (*args, self._bp_unlogged)
        log.info(message, *args)
        self._bp_logged_at, self._bp_unlogged = now, 0

    # -- output ---------------------------------------------------------------------------

    def _begin(self) -> KafkaProducer:
        producer = self._producer
        assert producer is not None
        if not self._txn_open:
            producer.begin_transaction()
            self._txn_open = True
        return producer

    def _on_result(self, result: Result) -> None:
        """Send one result inside the open transaction (called from the engine's scoring)."""
        p = result.partition
        key, value = self._encoder.encode(result)
        if not self._txn_open:
            self._begin()
        part = self._parts.get(p)
        first = part is None or part.txn_first is None
        tp = self._results_tps.get(p) or self._results_tp(p)
        appender = self._appender
        assert appender is not None
        future = appender.send(tp, key, value, first_in_transaction=first)
        if part is not None:
            if first:
                part.txn_first = future
            part.txn_last = future
            part.txn_count += 1
            ts = int(result.ts)
            if part.txn_max_ts is None or ts > part.txn_max_ts:
                part.txn_max_ts = ts
            part.dirty = True

    def _results_tp(self, p: int) -> TopicPartition:
        tp = self._results_tps[p] = TopicPartition(self.settings.topics.results, p)
        return tp

    def _dead_letter(self, rejection: Rejection, record: Any, kind: str) -> None:
        """Send a rejected record's dead letter, truncated if it would not fit the DLQ topic."""
        reason, detail = rejection.reason, rejection.detail
        producer = self._begin()
        source = (record.topic, record.partition, record.offset)
        value = record.value if record.value is not None else b""
        headers = [
            ("evald-reason", reason.encode()),
            ("evald-detail", detail.encode()[:4096]),
            ("evald-source-topic", record.topic.encode()),
            ("evald-source-partition", str(record.partition).encode()),
            ("evald-source-offset", str(record.offset).encode()),
            ("evald-kind", kind.encode()),
        ]
        minimal = source in self._minimal_letters
        letter = build_letter(record.key, value, headers, self._dlq_limit, minimal=minimal)
        dlq = self.settings.topics.dlq
        try:
            future = producer.send(dlq, key=letter.key, value=letter.value, headers=letter.headers)
        except KafkaError as exc:
            if minimal:
                raise self._refused(source, exc) from exc
            if exc.retriable:
                raise
            # refused before it left (the producer's own checks): headers only, at once
            self._minimal_letters.add(source)
            self._dead_letter(rejection, record, kind)
            return
        if letter.truncated:
            log.warning(
                "dead letter for %s/%d@%d truncated to %d of %d bytes (DLQ limit %d)",
                *source,
                len(letter.value),
                len(value),
                self._dlq_limit,
            )
        self._dlq_sent.append((future, source))
        self._pending_dlq.append(reason)

    def _check_dead_letters(self) -> None:
        """After a flush: a dead letter the broker refused for good is written as headers
        only by the next session (this transaction is lost: the failed batch aborts it)."""
        for future, source in self._dlq_sent:
            exc = future.exception if future.failed() else None
            if exc is None or getattr(exc, "retriable", False):
                continue
            if source in self._minimal_letters:
                raise self._refused(source, exc)
            self._minimal_letters.add(source)
            raise KafkaError(
                f"the DLQ topic refused the dead letter of {source[0]}/{source[1]}@{source[2]} "
                f"({type(exc).__name__}); writing it as headers only"
            )

    def _refused(self, source: tuple[str, int, int], exc: Exception) -> _Fatal:
        topic = self.settings.topics.dlq
        return _Fatal(
            2,
            f"evald run: stopping: the DLQ topic {topic} refused even a headers-only dead letter "
            f"(for {source[0]}/{source[1]}@{source[2]}: {type(exc).__name__}: {exc}); no retry "
            f"can fix that. Check that {topic} exists, is writable by evald and that its "
            "max.message.bytes (and the broker's message.max.bytes) are at least a few KiB, "
            "then restart evald",
        )

    def _commit(self) -> None:
        """One transaction: results + dead letters + checkpoints + input and checkpoint offsets.

        Tansu only applies transactional offset commits of transactions that also wrote a
        record, and the checkpoint records are always there, so every commit carries one.
        """
        parts = [s for s in self._parts.values() if s.restored]
        if not parts or not (self._txn_open or any(s.dirty for s in parts)):
            return
        producer = self._begin()
        consumer = self._consumer
        assert consumer is not None
        producer.flush(timeout=self.settings.kafka.request_timeout_ms / 1000)
        self._check_dead_letters()
        holds_results = any(part.txn_count for part in parts)
        _crash_point("results_sent", holds_results)
        engine = self._engine
        assert engine is not None
        topics = self.settings.topics
        planned: list[tuple[_Part, Checkpoint, Any]] = []
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        horizon_ms = self._horizon_ms()
        # a restart compares them: an input recreated while no evald ran is refused too
        ids = {name: shape.topic_id for name, shape in self._inputs.items() if shape.topic_id}
        topic_ids = {"topic_ids": ids} if ids else {}
        extended = {part.partition: self._ranges_after(part, horizon_ms) for part in parts}
        written = self._write_snapshots(parts, extended)
        for part in parts:
            p = part.partition
            ranges, epoch = extended[p]
            snapshot = part.snapshot
            if p in written:  # it holds every result so far: no range before it is needed
                ranges, epoch, snapshot = (), None, written[p]
            checkpoint = self._checkpoint(part, ranges, epoch, snapshot, topic_ids)
            committed = checkpoint.committed
            future = producer.send(
                topics.checkpoint_topic, key=str(p).encode(), value=checkpoint.encode(), partition=p
            )
            planned.append((part, checkpoint, future))
            for kind in KINDS:
                offsets[self._tp(kind, p)] = OffsetAndMetadata(committed[kind], "", -1)
        producer.flush(timeout=self.settings.kafka.request_timeout_ms / 1000)
        for _, checkpoint, future in planned:
            offsets[TopicPartition(topics.checkpoint_topic, checkpoint.partition)] = (
                OffsetAndMetadata(future.get(timeout=30).offset + 1, "", -1)
            )
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        _crash_point("offsets_sent", holds_results)
        producer.commit_transaction()
        _crash_point("committed", holds_results)
        self._txn_open = False
        produced = 0
        for part, checkpoint, _ in planned:
            produced += part.txn_count
            part.ranges, part.epoch_start = checkpoint.results, checkpoint.epoch_start
            part.snapshot = checkpoint.snapshot
            part.txn_first = part.txn_last = None
            part.txn_count = 0
            part.txn_max_ts = None
            part.dirty = False
        with self.stats.lock:
            self.stats.results_produced += produced
            self.stats.dlq.update(self._pending_dlq)
            self.stats.commits += 1
        self._pending_dlq = []
        self._dlq_sent = []
        self._uncommitted = 0
        self._backoff.reset()

    def _ranges_after(
        self, part: _Part, horizon_ms: int | None
    ) -> tuple[tuple[ResultRange, ...], int | None]:
        """(ranges, epoch start) of p once the open transaction commits, the unreachable
        ranges pruned."""
        ranges, epoch = part.ranges, part.epoch_start
        if part.txn_first is not None:
            first = part.txn_first.get(timeout=30).offset
            last = part.txn_last.get(timeout=30).offset
            ranges, epoch = extend_ranges(ranges, epoch, first, last, part.txn_max_ts)
        watermark = self._engine.checkpoint(part.partition) if self._engine else None
        if watermark is not None and horizon_ms is not None:
            ranges = prune_ranges(ranges, watermark - horizon_ms)
        return ranges, epoch

    def _checkpoint(
        self,
        part: _Part,
        ranges: tuple[ResultRange, ...],
        epoch: int | None,
        snapshot: SnapshotRef | None,
        extra: dict[str, Any],
    ) -> Checkpoint:
        """p's checkpoint for the open transaction: replay from the engine's low offsets."""
        engine = self._engine
        assert engine is not None
        p = part.partition
        low = engine.low_offsets(p)
        committed = {}
        for kind in KINDS:
            low_kind = low.get(kind)
            fed = part.fed_next[kind]
            committed[kind] = fed if low_kind is None else min(low_kind, fed)
        return Checkpoint(
            partition=p,
            watermark=engine.checkpoint(p),
            committed=committed,
            consumed=dict(part.fed_next),
            results=ranges,
            epoch_start=epoch,
            instance=self.settings.daemon.instance_id,
            extra=extra,
            event_times=engine.event_times(p),
            snapshot=snapshot,
            evicted=to_runs(engine.evicted(p, committed["impression"])),
        )

    def _write_snapshots(
        self, parts: list[_Part], extended: dict[int, tuple[tuple[ResultRange, ...], int | None]]
    ) -> dict[int, SnapshotRef]:
        """Send, in the open transaction, the window-aggregate snapshot of every partition
        whose results since its last snapshot got too many to re-read (snapshots.due);
        returns where each went. Before the checkpoints, which name their offsets."""
        engine, producer = self._engine, self._producer
        assert engine is not None and producer is not None
        now_ms = int(engine.clock() * 1000)
        topic = self.settings.topics.checkpoint_topic
        sent = {}
        for part in parts:
            p = part.partition
            if not snapshots.due(extended[p][0], part.snapshot, now_ms):
                continue
            raw = engine.snapshot(p)
            key = f"{p}.snapshot".encode()
            futures = [
                producer.send(topic, key=key, value=chunk, partition=p)
                for chunk in snapshots.chunks(raw)
            ]
            sent[p] = (raw, futures)
        if not sent:
            return {}
        producer.flush(timeout=self.settings.kafka.request_timeout_ms / 1000)
        return {
            p: SnapshotRef(
                tuple(f.get(timeout=30).offset for f in futures),
                len(raw),
                zlib.crc32(raw),
                now_ms,
            )
            for p, (raw, futures) in sent.items()
        }

    def _horizon_ms(self) -> int | None:
        """How far back (event time) rebuilt aggregates can reach: retention plus lateness."""
        if self._engine is None:
            return None
        config = self._engine.config
        return int(config.retention) + int(config.window) + int(config.lateness)

    def _abort(self) -> None:
        """Abandon the open transaction; every owned partition must then be restored again."""
        producer = self._producer
        if self._txn_open and producer is not None:
            try:
                producer.abort_transaction()
            except KafkaError as exc:
                log.warning("abort failed (%s); the broker will time the transaction out", exc)
        self._txn_open = False
        self._pending_dlq = []
        self._dlq_sent = []
        with self.stats.lock:
            self.stats.aborts += 1

    # -- rebalance ------------------------------------------------------------------------

    def _on_revoked(self, partitions: set[int], *, lost: bool) -> None:
        """Commit what is finalized (unless lost), then forget the revoked partitions."""
        with self.lock:
            self._revoke(partitions, lost=lost)

    def _revoke(self, partitions: set[int], *, lost: bool) -> None:
        if self._abandoning:
            lost = True  # the session failed: its in-memory state is not trusted any more
        if not lost:
            _crash_point("revoking", self.stats.results_produced > 0)
            try:
                self._commit()
            except Exception:
                log.exception("commit on revocation failed; aborting")
                lost = True
        if lost and self._txn_open:
            if not self._abandoning:  # taken over while our transaction was open: a zombie
                with self.stats.lock:
                    self.stats.fenced += 1
            self._abort()
            # what the aborted transaction held for partitions we keep is gone too
            self._txn_poisoned = True
        for p in partitions:
            part = self._parts.pop(p, None)
            self._to_restore.discard(p)
            self._bp_tps.discard(self._tp("impression", p))
            if part is not None and self._engine is not None:
                self._engine.drop_partition(p)
        log.info("partitions %s %s", sorted(partitions), "lost" if lost else "revoked")

    def _on_assigned(self, partitions: set[int]) -> None:
        with self.lock:
            self._assign(partitions)

    def _assign(self, partitions: set[int]) -> None:
        self._joined = True
        self._retrying = None
        for p in partitions:
            if p not in self._parts:
                self._parts[p] = _Part(p, Merger(self.merge_hold_s, self.clock))
                self._to_restore.add(p)
        log.info("partitions %s assigned", sorted(partitions))

    def _restore(self, p: int) -> None:
        """Resume partition p from its committed checkpoint (or from the start)."""
        part = self._parts.get(p)
        consumer, reader = self._consumer, self._reader
        if part is None or consumer is None or reader is None:
            return
        started = self.clock()
        topics = self.settings.topics
        ckpt_tp = TopicPartition(topics.checkpoint_topic, p)
        committed = consumer.committed(ckpt_tp)
        _crash_point("restore")
        engine = self._engine
        assert engine is not None
        if committed:
            progress = Progress(RESTORE_STALL_S, self.clock, self._beat)
            checkpoint = read_checkpoint(reader, topics.checkpoint_topic, p, committed, progress)
            try:
                saved = checkpoint.extra.get("topic_ids")
                check_checkpoint_ids(saved if isinstance(saved, dict) else {}, self._inputs, p)
            except TopicLayoutError as exc:
                raise _Fatal(2, f"evald run: refusing to restore: {exc}") from None
            engine.restore(
                p,
                checkpoint.watermark,
                dict(checkpoint.consumed),
                checkpoint.event_times,
                from_runs(checkpoint.evicted),
            )
            absorbed = self._rebuild_windows(p, checkpoint, progress)
            start = dict(checkpoint.committed)
            part.replay_end = dict(checkpoint.consumed)
            part.ranges, part.snapshot = checkpoint.results, checkpoint.snapshot
            log.info(
                "partition %d restored: watermark %s, replay from %s to %s, snapshot of %s "
                "bytes, %d results absorbed, %d records (%d bytes) read in %.2fs",
                p,
                event_time(checkpoint.watermark),
                start,
                checkpoint.consumed,
                "no" if checkpoint.snapshot is None else checkpoint.snapshot.size,
                absorbed,
                progress.records,
                progress.bytes,
                self.clock() - started,
            )
        else:
            start = {}
            for kind in KINDS:
                tp = self._tp(kind, p)
                start[kind] = consumer.beginning_offsets([tp])[tp]
            part.replay_end = dict(start)
        part.epoch_start = None
        for kind in KINDS:
            consumer.seek(self._tp(kind, p), start[kind])
        part.fed_next = dict(start)
        part.fetched_next = dict(start)
        part.merger.clear()
        part.restored = True
        with self.stats.lock:
            self.stats.restores += 1

    def _rebuild_windows(self, p: int, checkpoint: Checkpoint, progress: Progress) -> int:
        """p's window aggregates as committed: the checkpoint's snapshot (if any), then the
        results written after it; returns how many results were absorbed."""
        engine, reader = self._engine, self._reader
        assert engine is not None and reader is not None
        topics = self.settings.topics
        if checkpoint.snapshot is not None:
            ref = checkpoint.snapshot
            raw = read_snapshot(reader, topics.checkpoint_topic, p, ref, progress)
            try:
                engine.load_snapshot(p, raw)
            except ValueError as exc:
                raise RestoreError(f"snapshot of partition {p}: {exc}") from None
        absorbed = 0
        for doc in read_ranges(reader, topics.results, p, checkpoint.results, progress):
            engine.absorb_result(doc, p)
            absorbed += 1
        return absorbed

    # -- health ---------------------------------------------------------------------------

    def _probe(self) -> None:
        """Refresh consumer lag; doubles as the broker reachability check behind /readyz.

        While fetches keep returning records, the broker is evidently answering and every
        fetch response carries the partition's high watermark, so the lag is taken from those
        and the loop skips a blocking ListOffsets round trip (about 3% of the drain time in
        kafka_bench). When nothing was fetched since the last probe, the broker is asked.
        A partition with no fetch response since it was assigned has no lag series yet: some
        brokers (tansu) answer ListOffsets behind the last batch, so that answer alone could
        report a restored partition that has fetched nothing as caught up.
        """
        consumer = self._consumer
        assert consumer is not None
        tps = [self._tp(kind, p) for p, s in self._parts.items() if s.restored for kind in KINDS]
        fetched, self._fetched = self._fetched, False
        highs = {tp: consumer.highwater(tp) for tp in tps}
        try:
            if fetched and None not in highs.values():
                ends = {tp: high for tp, high in highs.items() if high is not None}
            else:
                ends = consumer.end_offsets(tps, timeout_ms=2_000) if tps else {}
        except KafkaError as exc:
            self._broker_ok = False
            self._set_ready(False)
            log.warning("broker not answering: %s", exc)
            return
        self._broker_ok = True
        lag = {}
        for tp, end in ends.items():
            part = self._parts.get(tp.partition)
            high = highs.get(tp)
            if part is not None and part.restored and high is not None:
                # the high watermark of the latest fetch is exact; ListOffsets may lag
                lag[(tp.topic, tp.partition)] = max(
                    0, max(end, high) - part.fed_next[self._kind(tp.topic)]
                )
        self.stats.set_lag(lag)
        if not any(lag.values()):
            self._progress_at = self.clock()  # nothing to consume is not a stall
        self._set_ready(self.ready()[0])

    def _set_ready(self, ready: bool) -> None:
        if ready and self.ready_at is None:
            self.ready_at = self.clock()
            log.info("ready %.2fs after start", self.ready_at - self.started_at)
        self.stats.ready = ready

    # -- shutdown -------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Stop fetching, commit, leave the group (close() revokes: nothing left to commit)."""
        consumer = self._consumer
        assert consumer is not None
        assigned = list(consumer.assignment())
        if assigned:
            consumer.pause(*assigned)
        with self.lock:
            self._commit()
            if self.settings.daemon.windows_file and self._engine is not None:
                self._write_windows(self.settings.daemon.windows_file)
        consumer.close(autocommit=False, timeout_ms=5_000)
        self._consumer = None
        self._set_ready(False)

    def _write_windows(self, path: str) -> None:
        """Dump every window aggregate in retention (same lines as `evald replay --windows`)."""
        assert self._engine is not None
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            for row in self._engine.window_rows(last_only=False):
                out.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
        os.replace(tmp, path)

    def _teardown(self) -> None:
        """Close whatever the session opened; an open transaction is left for the broker."""
        self._broker_ok = False
        self._abandoning = True
        for name in ("_consumer", "_reader", "_admin"):
            client = getattr(self, name)
            if client is not None:
                try:
                    if name == "_admin":
                        client.close()
                    else:
                        client.close(autocommit=False, timeout_ms=1_000)
                except Exception:
                    log.debug("closing %s failed", name, exc_info=True)
                setattr(self, name, None)
        if self._producer is not None:
            try:
                self._producer.close(timeout=1)
            except Exception:
                log.debug("closing producer failed", exc_info=True)
            self._producer = None
            self._appender = None
        self._parts.clear()
        self._to_restore.clear()
        self._txn_open = False
        self._txn_poisoned = False
        self._bp_paused = False
        self._bp_tps = set()
        self._pending_dlq = []
        self._dlq_sent = []
        self._abandoning = False
        self._joined = False


def _describe(admin: KafkaAdminClient, names: tuple[str, ...]) -> dict[str, TopicShape | None]:
    """Each topic's id and partition count (None: it does not exist)."""
    existing = set(admin.list_topics())
    shapes: dict[str, TopicShape | None] = dict.fromkeys(names)
    present = [name for name in names if name in existing]
    for desc in admin.describe_topics(present) if present else []:
        name = desc.get("name") or desc.get("topic")
        if desc.get("error_code") or name not in shapes:
            continue  # deleted between the two requests: missing
        topic_id = desc.get("topic_id")
        shapes[name] = TopicShape(
            None if not topic_id or topic_id == NO_TOPIC_ID else str(topic_id),
            len(desc["partitions"]),
        )
    return shapes
