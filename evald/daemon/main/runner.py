"""The consumer loop of `evald run`: the session lifecycle and the poll cycle.

One *session* = one consumer, one transactional producer, one engine. Anything transient that
goes wrong (broker gone, coordinator moved, transaction fenced) ends the session: the open
transaction is abandoned (the broker aborts it), the clients are closed, and after a jittered
backoff a new session restores every assigned partition from its last committed checkpoint.
That single recovery path is what makes crash, rebalance and outage behave the same way; see
docs/design.md for why the result is exactly-once.

Each concern of a cycle has its module: inputs.py (buffering, merge, feeding), backpressure.py,
transaction.py (the commit cycle), rebalance.py, restore.py, health.py, dead_letters.py and
topics.py; this class wires them to the clients of a session.

Threading: kafka-python runs network I/O and rebalance callbacks on its own threads; a
callback runs while the loop thread is blocked inside ``poll()``/``close()``, so one thread at
a time changes the engine and the partitions' state: the loop thread, or a callback standing in
for it (it records what happened and, on revocation, commits). Scrapes and the status line only
read the engine, under ``self.lock`` (engine_lock.py), which a commit lets go of while it waits
on the broker.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import (
    AuthorizationError,
    CommitFailedError,
    FencedInstanceIdError,
    IllegalGenerationError,
    InvalidProducerEpochError,
    KafkaError,
    ProducerFencedError,
    UnknownMemberIdError,
)

from evald.daemon.backoff import Backoff
from evald.daemon.dead_letters import DeadLetters
from evald.daemon.fatal import Fatal, causes, unrecoverable
from evald.daemon.health import TWIN_FENCES, TWIN_WINDOW_S, Health
from evald.daemon.kafka_compat import (
    StopEvent,
    close_quietly,
    unpark_resumed,
    without_auto_create,
)
from evald.daemon.main.backpressure import Action, Backpressure
from evald.daemon.main.comparisons import ComparisonReader, publishes_statistics, statistics_topic
from evald.daemon.main.engine_lock import EngineLock
from evald.daemon.main.inputs import Inputs
from evald.daemon.main.rebalance import Rebalance
from evald.daemon.main.restore import RestoreError, Restorer
from evald.daemon.main.transaction import Transaction
from evald.daemon.permissions import explain_denial
from evald.daemon.reach import check_resolves, diagnose
from evald.daemon.settings import Settings
from evald.daemon.stats import DaemonStats
from evald.daemon.topics import TopicGuard
from evald.engine import Engine, Result

__all__ = ["Daemon", "EngineFactory"]

log = logging.getLogger("evald.daemon")

EngineFactory = Callable[[Callable[[Result], None]], Engine]
"""Builds a fresh engine whose ``on_result`` is the given callback."""

#: producer batching: one cycle's results for a partition fit in one batch, so the sender thread
#: is woken per batch rather than per record (a second queued batch makes kafka-python report
#: every append as "batch full" and wake the sender on each send); commits flush anyway
PRODUCER_BATCH_BYTES = 512 * 1024
PRODUCER_LINGER_MS = 50
#: kafka-python's default ``max_request_size``
KAFKA_PYTHON_MAX_REQUEST_SIZE = 1_048_576

#: the broker refusing a commit because a newer incarnation or generation owns the work
FENCING_ERRORS = (
    ProducerFencedError,
    InvalidProducerEpochError,
    CommitFailedError,
    IllegalGenerationError,
    UnknownMemberIdError,
    FencedInstanceIdError,
)

#: fencing that says another process holds this instance's ids (its transactional id, or its
#: static member id), not a rebalance
TWIN_ERRORS = (ProducerFencedError, InvalidProducerEpochError, FencedInstanceIdError)

#: a commit slower than this is logged (the broker was slow; scrapes are served meanwhile)
SLOW_COMMIT_S = 5.0
#: while a flush waits, the topics are checked this often (TopicGuard.recheck)
WAITING_CHECK_S = 1.0
#: group states of a rebalance in progress (DescribeGroups)
REBALANCING = ("PreparingRebalance", "CompletingRebalance")


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
        #: a stop also ends the bootstraps of the session's clients (their ``kafka_client``),
        #: and each session's teardown closes them all
        self._stop = StopEvent()
        #: held around every engine access; scrapes take it to copy a consistent state. Never
        #: held across consumer.poll()/close() (the rebalance callbacks take it there), and let
        #: go of while a commit waits on the broker
        self.lock = EngineLock()
        self._backoff = Backoff(
            settings.daemon.retry_backoff_initial_ms / 1000,
            settings.daemon.retry_backoff_max_ms / 1000,
        )
        topics = settings.topics
        self.inputs = Inputs(topics.impressions, topics.feedback, clock, merge_hold_s)
        compares = publishes_statistics(settings.engine_config())
        self.topics = TopicGuard(settings, clock, statistics_topic(topics) if compares else None)
        self.dead_letters = DeadLetters(topics.dlq)
        self.transaction = Transaction(
            settings,
            self.stats,
            self.inputs,
            self.dead_letters,
            self._backoff,
            clock,
            self.topics.topic_ids,
            unlocked=self.lock.released,
            waiting=self._waiting,
        )
        self.backpressure = Backpressure(settings.daemon.pause_at, settings.daemon.resume_at)
        self.health = Health(self.stats, clock, settings.daemon.stall_timeout_s)
        self._engine: Engine | None = None
        #: the comparisons folded from the statistics topic (started by the first session)
        self.comparisons: ComparisonReader | None = None
        self._consumer: KafkaConsumer | None = None
        self._admin: KafkaAdminClient | None = None
        #: restores the session's assigned partitions (and holds its group-less reader)
        self._restorer: Restorer | None = None

    # -- public ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish: stop fetching, commit, leave the group, return 0."""
        self._stop.set()

    def ready(self) -> tuple[bool, str]:
        """/readyz: every assigned partition restored and the broker answering."""
        return self.health.ready(
            connected=self._consumer is not None,
            waiting=self.inputs.waiting(),
            owned=len(self.inputs.parts),
        )

    def stalled(self) -> str | None:
        """Why the loop counts as stalled (see ``Health.stalled``); None while it is not."""
        return self.health.stalled()

    def run(self) -> int:
        """Run sessions until stopped; transient failures are retried with backoff."""
        try:
            return self._run()
        finally:
            if self.comparisons is not None:
                self.comparisons.stop()

    def _run(self) -> int:
        while not self._stop.is_set():
            try:
                self._session()
                return 0
            except Fatal as exc:
                log.error("%s", exc)
                return exc.status
            except (KafkaError, OSError, RestoreError, TimeoutError) as exc:
                advice = unrecoverable(exc, self._denied)
                if advice is not None:
                    log.error("evald run: cannot continue: %s", advice)
                    return 2
                twin = self._fenced(exc)
                advice, why = self._explain(exc)
                # e.g. the stop ended a bootstrap, or came during the diagnosis: nothing to
                # retry, and nothing to exit 2 for
                if self._stop.is_set():
                    log.info("stopping: the session ended on %s (%s)", type(exc).__name__, exc)
                    return 0
                if advice is not None:
                    log.error("evald run: cannot continue: %s", advice)
                    return 2
                if twin is not None and self.health.twin_due(self.clock()):
                    log.error("evald run: %s", twin)  # also on /readyz, at every fence
                self.health.set_ready(False)
                delay = self._backoff.next_delay()
                self.health.retry(f"retrying after {why}" if twin is None else twin)
                log.warning("kafka session failed (%s); retrying in %.1fs", why, delay)
            except Exception:
                # a topic deleted under the session shows up as surprises inside kafka-python
                # first (a KeyError from ListOffsets, a seek on a partition no longer assigned)
                status = self._topics_gone()
                if status is not None:
                    return status
                self.health.misdirected.reset()  # this session got past its bootstrap
                # never die on a surprise: the state is in Kafka, a new session restores it
                self.health.set_ready(False)
                delay = self._backoff.next_delay()
                log.exception("kafka session failed unexpectedly; retrying in %.1fs", delay)
            finally:
                self._teardown()
            self._beat()  # retrying a broker that is away is alive, only not ready
            self._stop.wait(delay)
        return 0

    def _fenced(self, exc: BaseException) -> str | None:
        """Count a session fenced (at a stop too: its transaction is lost; the error wrapped
        as kafka-python wraps a failed transactional request's in a later send's). Returns
        what to do when sessions are fenced again and again by a twin (Health.fenced)."""
        found = [cause for cause in causes(exc) if isinstance(cause, FENCING_ERRORS)]
        if not found:
            return None
        with self.stats.lock:
            self.stats.fenced_sessions += 1
        if not isinstance(found[0], TWIN_ERRORS) or self._stop.is_set():
            return None
        fences = self.health.fenced(self.stats.commits)
        if fences < TWIN_FENCES:
            return None
        daemon = self.settings.daemon
        return (
            f"{fences} sessions (in a row with no commit between them, or within "
            f"{TWIN_WINDOW_S / 60:.0f} minutes) were fenced by another "
            f"holder of this instance's ids (transactional id {daemon.transactional_id()}): "
            f"another evald runs with daemon.group_id {daemon.group_id!r} and daemon.instance_id "
            f"{daemon.instance_id!r} (the host name unless set), and each fences the other; "
            "give every instance its own --instance-id (EVALD_DAEMON__INSTANCE_ID)"
        )

    def _explain(self, exc: BaseException) -> tuple[str | None, str]:
        """Why the session failed: advice when no retry can fix it (every bootstrap address
        answered as another service, bootstrap after bootstrap: reach.py), and the retry's
        reason, with what each bootstrap address did when none could be bootstrapped from."""
        why = f"{type(exc).__name__}: {exc}"
        kafka = self.settings.kafka
        found = diagnose(exc, kafka.bootstrap_servers, kafka.security_protocol, self._stop)
        if found is None:
            self.health.misdirected.reset()
            return None, why
        advice, hint = self.health.misdirected.judge(found, self.clock())
        return advice, f"{why}: {hint}"

    def _topics_gone(self) -> int | None:
        """Check the topics at once after a surprise: the exit status when one is gone."""
        if self._admin is None:
            return None
        try:
            self.topics.recheck(self._admin, self.clock(), interval_s=0.0)
        except Fatal as fatal:
            log.error("%s", fatal)
            return fatal.status
        except Exception:
            log.debug("topic check after a failed session failed too", exc_info=True)
        return None

    def _waiting(self) -> None:
        """Called while a commit's flush waits: a results topic deleted under the session
        leaves its records unanswered, so the topics are checked (at most every second) and
        the session stops with what happened instead of waiting out the flush."""
        if self._admin is not None:
            self.topics.recheck(self._admin, self.clock(), interval_s=WAITING_CHECK_S)

    def _denied(self, error: AuthorizationError) -> str:
        """What to grant after ``error``: the broker asked which operations evald's principal
        holds on its topics now, so the message names the ones missing."""
        authorized = None
        if self._admin is not None:
            try:
                authorized = self.topics.authorized(self._admin)
            except Exception:
                log.debug("could not ask the broker for the authorized operations", exc_info=True)
        return explain_denial(self.settings, error, authorized)

    def open_engine(self) -> Engine:
        """Build the session's engine (every session starts from a fresh one)."""
        engine = self._engine = self.engine_factory(self.transaction.send_result)
        self.backpressure.start(engine.config.max_pending)
        with self.stats.lock:
            self.stats.committed.session_started()
        engine.export_committed(self.stats.committed)  # never a count a kill -9 makes twice
        if self.comparisons is not None:
            self._attach(engine, self.comparisons)
        if self.on_engine is not None:
            self.on_engine(engine)
        return engine

    def process(self, batches: dict[TopicPartition, list[Any]], consumer: KafkaConsumer) -> int:
        """One poll's worth of work under the lock: restore what was assigned, buffer
        ``batches``, feed what the merge releases, tick the engine and apply backpressure;
        the pauses and resumes the inputs decide are applied to ``consumer``.
        Returns how many records were fed."""
        engine = self._engine
        assert engine is not None
        self._restore(self.inputs.to_restore())
        pause = self.inputs.take(batches)
        if pause:
            consumer.pause(*pause)
        fed = self.inputs.feed(engine.feed_batch)
        for rejection, record, kind in fed.rejected:
            self.dead_letters.send(self.transaction.begin(), rejection, record, kind)
        if fed.resume:
            consumer.resume(*fed.resume)
        self.transaction.fed(fed.counts)
        engine.tick()
        self._backpressure(engine, consumer)
        return sum(fed.counts.values())

    # -- session --------------------------------------------------------------------------

    def _session(self) -> None:
        cfg = self.settings
        client = cfg.kafka.client_config(self._stop.client)
        self.stats.sessions += 1
        # a name that does not resolve fails at once, said by evald (kafka-python would retry
        # it for its whole bootstrap, logging only its own lines)
        check_resolves(cfg.kafka.bootstrap_servers)
        self._admin = KafkaAdminClient(bootstrap_timeout_ms=client["request_timeout_ms"], **client)
        limits = self.topics.start(self._admin)
        self.dead_letters.limit, self.dead_letters.results_limit = limits.dlq, limits.results
        engine = self.open_engine()
        if publishes_statistics(engine.config) and self.comparisons is None:
            self._read_comparisons(self._admin, engine)
        producer = KafkaProducer(
            transactional_id=cfg.daemon.transactional_id(),
            transaction_timeout_ms=cfg.kafka.transaction_timeout_ms,
            max_block_ms=cfg.kafka.request_timeout_ms,
            linger_ms=PRODUCER_LINGER_MS,
            batch_size=limits.batch_bytes(PRODUCER_BATCH_BYTES),
            # never refuse a dead letter the DLQ topic accepts (letters are fitted to its
            # limit) nor a result the results topic does (larger ones are dead-lettered)
            max_request_size=max(*limits, KAFKA_PYTHON_MAX_REQUEST_SIZE),
            **without_auto_create(),
            **client,
        )
        # fences and aborts whatever a previous incarnation of this instance left open
        producer.init_transactions()
        # no client may create a topic: after a broker lost its data, an input topic created
        # empty by a metadata request would be consumed as if nothing had happened, and a
        # deleted one would come back with the broker's default partition count
        consumer = self._consumer = KafkaConsumer(
            group_id=cfg.daemon.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=cfg.kafka.session_timeout_ms,
            heartbeat_interval_ms=cfg.kafka.heartbeat_interval_ms,
            max_poll_interval_ms=cfg.kafka.max_poll_interval_ms,
            max_poll_records=cfg.daemon.max_poll_records,
            group_instance_id=cfg.daemon.instance_id if cfg.daemon.static_membership else None,
            **without_auto_create(),
            **client,
        )
        self.transaction.connect(producer, consumer, engine)
        self.inputs.connect(consumer)
        self._restorer = self._open_restorer(consumer, engine, client)
        listener = Rebalance(
            self.lock, self.inputs, self.transaction, engine, self.health, self.stats
        )
        consumer.subscribe([cfg.topics.impressions, cfg.topics.feedback], listener=listener)
        self._stop.running()  # a stop now ends the session cleanly, restores included
        started = self.clock()
        self.health.session_started(started)  # an outage is not a stall
        self.transaction.start_cycle(started)
        while not self._stop.is_set():
            now = self._cycle(consumer)
            if self.health.probe_due(now, cfg.daemon.commit_interval_ms / 1000):
                self._probe()
                self.health.probed(now)
            self.topics.recheck(self._admin, now)
        self._shutdown()

    def _open_restorer(
        self, consumer: KafkaConsumer, engine: Engine, client: dict[str, Any]
    ) -> Restorer:
        """The session's restore (restore.py), with its own group-less readers."""
        admin = self._admin
        assert admin is not None

        def reader(isolation: str) -> KafkaConsumer:
            return KafkaConsumer(
                group_id=None,
                enable_auto_commit=False,
                isolation_level=isolation,
                **without_auto_create(),
                **client,
            )

        return Restorer(
            self.settings,
            consumer=consumer,
            reader=reader("read_uncommitted"),
            committed_reader=lambda: reader("read_committed"),
            engine=engine,
            guard=self.topics,
            inputs=self.inputs,
            clock=self.clock,
            heartbeat=self._beat,
            verify_topics=lambda: self.topics.verify(admin),
            offset_wait_s=self._offset_wait_s(),
        )

    def _read_comparisons(self, admin: KafkaAdminClient, engine: Engine) -> None:
        """Start folding the statistics topic (once per process; every session's
        ``TopicGuard.start`` created it if it was missing)."""
        partitions = max(shape.partitions for shape in self.topics.inputs.values())
        reader = ComparisonReader(self.settings, engine.config, engine.measure_names, partitions)
        self.comparisons = reader
        reader.start()
        self._attach(engine, reader)

    @staticmethod
    def _attach(engine: Engine, reader: ComparisonReader) -> None:
        """The engine's comparisons and interleaving test are the reader's folds."""
        if engine.config.statistics.comparisons:
            engine.attach_statistics(reader.live)
        engine.interleaving.attach(reader.credit)

    def _cycle(self, consumer: KafkaConsumer) -> float:
        """Poll, process and commit when due; returns the cycle's time."""
        self._beat()
        unpark_resumed(consumer)
        batches = consumer.poll(timeout_ms=self.settings.daemon.poll_timeout_ms)
        transaction = self.transaction
        if transaction.poisoned:
            raise KafkaError("transaction aborted during a rebalance; resynchronising")
        with self.lock:
            fed = self.process(batches, consumer)
            now = self.clock()
            if fed:
                self.health.progressed(now)
            if transaction.commit_when_due(now):
                took = self.clock() - now
                if took > SLOW_COMMIT_S:
                    log.warning("a commit took %.1fs: the broker was slow to answer", took)
        return now

    def _restore(self, partitions: list[int]) -> None:
        """Resume the partitions just assigned from their committed checkpoints (or from the
        start), all together (restore.py), and hand what each was restored to to the inputs
        and the transaction's ledgers."""
        ps = [p for p in partitions if p in self.inputs.parts]
        restorer = self._restorer
        if not ps or restorer is None or self._consumer is None:
            return
        for p, restored in restorer.restore(ps).items():
            self.inputs.resume(p, restored)
            self.transaction.restored(p, restored.checkpoint)
        with self.stats.lock:
            self.stats.restores += len(ps)

    def _offset_wait_s(self) -> float:
        """How long a restore waits for the group's committed offset: a request, plus the
        transaction timeout after which the broker aborts a dead instance's open transaction
        that still holds the group's offsets (a takeover waits for that, docs/design.md,
        "Fencing"); longer, the coordinator is not answering and a new session is tried."""
        kafka = self.settings.kafka
        return (kafka.request_timeout_ms + kafka.transaction_timeout_ms) / 1000

    def _backpressure(self, engine: Engine, consumer: KafkaConsumer) -> None:
        """Decide (backpressure.py) and apply it to the impressions fetch."""
        pending = engine.pending()
        self.stats.peak_pending = max(self.stats.peak_pending, pending)
        action = self.backpressure.step(pending, self.inputs.feedback_waiting(), self.clock())
        if action is Action.PAUSE:
            self.stats.pauses += 1
            pause = self.inputs.hold_impressions()
            if pause:
                consumer.pause(*pause)
        elif action is Action.RESUME:
            resume = self.inputs.release_impressions()
            if resume:
                consumer.resume(*resume)

    def _probe(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        if self.health.probe(consumer, self.inputs):
            self._check_assignment()
            self.health.set_ready(self.ready()[0])

    def _check_assignment(self) -> None:
        """A joined session that owns no partition for a session timeout is a standby only
        if the group has more members than partitions; otherwise its rejoin went wrong (seen
        after a coordinator kill: an empty assignment made without the topics' metadata,
        then a rejoin that never completed) and a new session joins afresh."""
        idle = self.health.unassigned_for(len(self.inputs.parts))
        if idle < self.settings.kafka.session_timeout_ms / 1000:
            return
        admin = self._admin
        assert admin is not None
        group = self.settings.daemon.group_id
        described = admin.describe_groups([group]).get(group) or {}
        rebalance_s = self.settings.kafka.max_poll_interval_ms / 1000  # the rebalance timeout
        if described.get("group_state") in REBALANCING and idle < rebalance_s:
            return  # members are still joining: the assignment is coming
        members = len(described.get("members") or ())
        shape = self.topics.inputs.get(self.settings.topics.impressions)
        # an input topic not described is no reason to stand by
        partitions = shape.partitions if shape is not None else members
        why = self.health.judge_unassigned(idle, members, partitions)
        if why is not None:
            raise KafkaError(why)

    # -- shutdown -------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Stop fetching, commit, leave the group (close() revokes: nothing left to commit)."""
        consumer = self._consumer
        assert consumer is not None
        assigned = list(consumer.assignment())
        if assigned:
            consumer.pause(*assigned)
        with self.lock:
            self.transaction.commit()
            if self.settings.daemon.windows_file and self._engine is not None:
                self._write_windows(self.settings.daemon.windows_file)
        consumer.close(autocommit=False, timeout_ms=5_000)
        self._consumer = None
        self.health.set_ready(False)

    def _write_windows(self, path: str) -> None:
        """Dump every window aggregate in retention (same lines as `evald replay --windows`)."""
        assert self._engine is not None
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            for row in self._engine.window_rows(last_only=False):
                out.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
        os.replace(tmp, path)

    def _teardown(self) -> None:
        """Close whatever the session opened; an open transaction is left for the broker.
        Logs what the session's engine counted (its series start again at 0 in the next
        session), so that counts can be reconciled across sessions and restarts."""
        if self._engine is not None:
            counted = self._engine.stats.counted()
            log.info(
                "session %d ended; its engine counted %s",
                self.stats.sessions,
                json.dumps(counted, sort_keys=True),
                extra={"counted": counted},
            )
            self._engine = None
        self.health.broker_lost()
        self.transaction.abandon()
        for name in ("_consumer", "_admin"):
            client = getattr(self, name)
            if client is not None:
                close_quietly(client)
                setattr(self, name, None)
        if self._restorer is not None:
            self._restorer.close()
            self._restorer = None
        self.transaction.close()
        # last: also those whose constructor raised, each with an I/O thread still running
        self._stop.close_clients()
        self.inputs.clear()
        self.inputs.connect(None)
        self.backpressure.reset()
        self.health.reset_session()
