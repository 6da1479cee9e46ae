"""The commit cycle: everything a session produced since the last commit, in one transaction.

One instance has one transactional producer. Results and dead letters are sent into the open
transaction as the engine finalizes them (:meth:`Transaction.send_result`, ``DeadLetters``);
:meth:`Transaction.commit` closes it with the checkpoints and the offsets, so either all of it
becomes visible to ``read_committed`` readers and the group's offsets move, or none of it does
(docs/design.md, "Summary", items 1-4). The test-only crash points (crash.py) sit between the
steps named below, so every step boundary is covered by the kill tests.

The caller holds the daemon's engine lock; every wait on the broker inside a commit (flushes,
the answers to the sends, the offsets, EndTxn) runs inside the ``unlocked`` context the runner
hands in (``EngineLock.released``), so scrapes keep the engine's series while a broker is slow.
Only the committing thread changes the engine and the partitions' state (the loop thread, or a
revocation callback while the loop thread is blocked in ``poll()``), and it is the one waiting,
so nothing a step reads before a wait has changed after it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from enum import Enum
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from evald.daemon.backoff import Backoff
from evald.daemon.crash import crash_point
from evald.daemon.dead_letters import DeadLetters
from evald.daemon.kafka_compat import (
    RecordAppender,
    abort_within,
    close_quietly,
    commit_within,
    flush_within,
    send_offsets_within,
)
from evald.daemon.main import snapshots
from evald.daemon.main.checkpoint import Checkpoint, ResultRange, SnapshotRef
from evald.daemon.main.comparisons import statistics_topic
from evald.daemon.main.inputs import InputPartition, Inputs
from evald.daemon.main.interval import Interval
from evald.daemon.main.ledger import Ledger, Ranges
from evald.daemon.main.merge import KINDS
from evald.daemon.main.results import ResultEncoder
from evald.daemon.settings import Settings
from evald.daemon.stats import DaemonStats
from evald.engine import Engine, Result
from evald.partition_state import PartitionState

__all__ = ["Standing", "Status", "Transaction"]

log = logging.getLogger("evald.daemon")


class Status(Enum):
    """The broker transaction of the session (set by :class:`Transaction`'s methods only)."""

    IDLE = "idle"  # none open: the next result, dead letter or commit begins one
    OPEN = "open"  # begun, not yet committed or aborted


class Standing(Enum):
    """Whether the session's state can still be committed (set by :class:`Transaction`'s
    methods only; a session that failed stays ``ABANDONED`` until it is closed)."""

    LIVE = "live"
    #: a transaction was aborted during a rebalance: what it held for the partitions kept is
    #: gone too, so the session must resynchronise
    POISONED = "poisoned"
    #: the session failed: its in-memory state is not trusted any more (no commit)
    ABANDONED = "abandoned"


class Transaction:
    """The open transaction of one session and the commit policy."""

    def __init__(
        self,
        settings: Settings,
        stats: DaemonStats,
        inputs: Inputs,
        dead_letters: DeadLetters,
        backoff: Backoff,
        clock: Callable[[], float],
        topic_ids: Callable[[], dict[str, str]],
        unlocked: Callable[[], AbstractContextManager[None]] = nullcontext,
        waiting: Callable[[], None] = lambda: None,
    ) -> None:
        self._settings = settings
        #: entered around every wait on the broker: the engine lock let go of meanwhile
        self._unlocked = unlocked
        #: called about every second while a flush waits (the runner checks its topics: a
        #: deleted results topic shows up as a flush that never completes); may raise
        self._waiting = waiting
        self._stats = stats
        self._inputs = inputs
        self._dead_letters = dead_letters
        self._backoff = backoff
        self._topic_ids = topic_ids
        self._producer: KafkaProducer | None = None
        self._consumer: KafkaConsumer | None = None
        self._engine: Engine | None = None
        self._appender: RecordAppender | None = None
        self._encoder = ResultEncoder()
        self._results_tps: dict[int, TopicPartition] = {}
        self._status = Status.IDLE
        self._standing = Standing.LIVE
        #: each restored partition's committed result ranges (as long as it is assigned)
        self._ledgers: dict[int, Ledger] = {}
        #: what happened since the last commit; a new one once it commits
        self._interval = Interval()
        #: records fed since the last commit, and when the cycle last committed
        self._uncommitted = 0
        self._last_commit = clock()

    # -- status ---------------------------------------------------------------------------

    @property
    def open(self) -> bool:
        """A transaction is open on the broker (begun, not yet committed or aborted)."""
        return self._status is Status.OPEN

    @property
    def poisoned(self) -> bool:
        """A transaction was aborted during a rebalance: what it held for the partitions kept
        is gone too, so the session must resynchronise."""
        return self._standing is Standing.POISONED

    @property
    def abandoned(self) -> bool:
        """The session failed: its in-memory state is not trusted any more (no commit)."""
        return self._standing is Standing.ABANDONED

    def abandon(self) -> None:
        """The session failed (its teardown): no commit any more, until :meth:`close`."""
        self._standing = Standing.ABANDONED

    # -- partitions -----------------------------------------------------------------------

    def restored(self, p: int, checkpoint: Checkpoint | None) -> None:
        """Partition ``p`` was restored from ``checkpoint`` (None: a fresh start)."""
        self._ledgers[p] = Ledger(checkpoint)

    def forget(self, p: int) -> None:
        """Partition ``p`` is no longer owned."""
        self._ledgers.pop(p, None)
        self._interval.forget(p)

    def fed(self, counts: dict[int, int]) -> None:
        """The poll cycle fed ``counts`` records per partition."""
        for p in counts:
            self._interval.fed(p)
        self._uncommitted += sum(counts.values())

    def settled(self) -> bool:
        """No transaction is open and no restored partition changed since the last commit."""
        return not self.open and not any(
            self._interval.changed(part.partition) for part in self._inputs.restored()
        )

    def connect(self, producer: KafkaProducer, consumer: KafkaConsumer, engine: Engine) -> None:
        """The session's producer (transactions initialised), group consumer and engine."""
        self._producer = producer
        self._appender = RecordAppender(producer)
        self._consumer = consumer
        self._engine = engine

    # -- the cycle ------------------------------------------------------------------------

    def start_cycle(self, now: float) -> None:
        """A session starts polling: the commit interval counts from ``now`` (an outage is not
        a reason to commit at once)."""
        self._last_commit = now

    def due(self, now: float) -> bool:
        """Whether the poll cycle commits now: ``daemon.commit_max_records`` records fed or
        ``daemon.commit_interval_ms`` passed since the last commit."""
        daemon = self._settings.daemon
        return (
            self._uncommitted >= daemon.commit_max_records
            or now - self._last_commit >= daemon.commit_interval_ms / 1000
        )

    def commit_when_due(self, now: float) -> bool:
        """The poll cycle's commit: :meth:`commit` if :meth:`due`; returns whether it was."""
        if not self.due(now):
            return False
        self.commit()
        self._last_commit = now
        return True

    def begin(self) -> KafkaProducer:
        """The producer, with a transaction open."""
        producer = self._producer
        assert producer is not None
        if not self.open:
            producer.begin_transaction()
            self._status = Status.OPEN
        return producer

    def send_result(self, result: Result) -> None:
        """Send one result inside the open transaction (the engine's ``on_result``)."""
        p = result.partition
        key, value = self._encoder.encode(result)
        producer = self.begin()
        topic = self._settings.topics.results
        if self._dead_letters.divert_result(producer, topic, p, key, value):
            return
        owned = p in self._inputs.parts
        first = not owned or self._interval.sent(p) is None
        tp = self._results_tps.get(p) or self._results_tp(p)
        appender = self._appender
        assert appender is not None
        future = appender.send(tp, key, value, first_in_transaction=first)
        if owned:
            self._interval.result(p, future, int(result.ts))

    def _results_tp(self, p: int) -> TopicPartition:
        tp = self._results_tps[p] = TopicPartition(self._settings.topics.results, p)
        return tp

    def commit(self) -> None:
        """Commit the open transaction; a no-op when nothing changed since the last commit.

        The protocol, in order (docs/design.md, "Summary"):

        1. Open a transaction if none is (every commit writes at least the checkpoints: tansu
           applies transactional offset commits only of transactions that wrote a record).
        2. Flush what was sent into it while feeding: the results (results topic, partition
           p) and the dead letters; a dead letter the broker refused fails the commit.
           Crash point ``results_sent``.
        3. Per restored partition p, compute the result ranges extended by this
           transaction's results and pruned past the aggregation horizon. Where a snapshot
           is due (snapshots.due), send p's window aggregates as snapshot records to
           checkpoint topic partition p and flush to learn their offsets.
        4. Per partition, send its checkpoint record (checkpoint topic, partition p): the new
           snapshot (ranges then start empty) or the last committed one with the ranges after
           it, the engine's state of p (``Engine.state``: watermark, committed offsets, event
           times, evicted impressions, held feedback, open comparison shares), the consumed
           offsets (``InputPartition.consumed``: never below those of the checkpoint a replay is
           restoring) and the input topic ids. A click model larger than the inline limit is
           first sent as records of its own, which the checkpoint names. With comparisons (or
           interleaving teams), first send p's comparison (credit) shares that became final
           and its final mark
           (``Engine.final_shares``) to the statistics topic; the checkpoint keeps the shares
           not final yet.
        5. Flush the checkpoints (and the statistics records: crash point ``statistics_sent``
           when they hold a share), then send the group offsets into the transaction: per input
           topic the engine's low offset (the next unfed offset when nothing is pending), and
           on the checkpoint topic the checkpoint record's own offset + 1.
           Crash point ``offsets_sent``.
        6. Commit the transaction. Crash points ``committed``, ``statistics_committed``.
        7. Only now take the new ranges and snapshot as committed, count results, dead
           letters and the commit, and reset the retry backoff. Crash point
           ``replay_committed`` when a partition checkpointed was still replaying.
        """
        parts = self._inputs.restored()
        if not parts or not self._anything_to_commit(parts):
            return
        producer = self.begin()  # 1
        consumer = self._consumer
        assert consumer is not None
        # a test-only crash point: this commit checkpoints a partition in mid-replay
        replaying = any(s.fed_next[k] < s.replay_end.get(k, 0) for s in parts for k in KINDS)
        self._flush(producer)  # 2
        self._dead_letters.check()
        holds_results = any(self._interval.sent(part.partition) for part in parts)
        crash_point("results_sent", holds_results)
        checkpoint_topic = self._settings.topics.checkpoint_topic
        planned: list[tuple[Checkpoint, Any]] = []
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        # a restart compares them: an input recreated while no evald ran is refused too
        ids = self._topic_ids()
        extra = {"topic_ids": ids} if ids else {}
        extended = self._ranges_after([part.partition for part in parts])  # 3
        written = self._write_snapshots(parts, extended)
        statistics_sent: list[tuple[Any, bool]] = []  # (future, a share and not a mark)
        for part in parts:  # 4
            p = part.partition
            ranges, epoch = extended[p]
            snapshot = self._ledger(p).snapshot
            if p in written:  # it holds every result so far: no range before it is needed
                ranges, epoch, snapshot = (), None, written[p]
            self._send_statistics(p, statistics_sent)
            checkpoint = self._checkpoint(part, ranges, epoch, snapshot, extra)
            future = producer.send(
                checkpoint_topic, key=str(p).encode(), value=checkpoint.encode(), partition=p
            )
            planned.append((checkpoint, future))
            for kind in KINDS:
                offsets[self._inputs.tp(kind, p)] = OffsetAndMetadata(
                    checkpoint.committed[kind], "", -1
                )
        self._flush(producer)  # 5
        for future, _ in statistics_sent:
            future.get(timeout=30)  # a refused share fails the commit, like a dead letter
        holds_shares = any(share for _, share in statistics_sent)
        crash_point("statistics_sent", holds_shares)
        for checkpoint, future in planned:
            offsets[TopicPartition(checkpoint_topic, checkpoint.partition)] = OffsetAndMetadata(
                future.get(timeout=30).offset + 1, "", -1
            )
        answer_s = self._settings.kafka.transaction_timeout_ms / 1000
        group = consumer.group_metadata()
        with self._unlocked():
            send_offsets_within(producer, offsets, group, answer_s)
        crash_point("offsets_sent", holds_results)
        crash_point("commit_in_flight", holds_results)  # armed here, kills on the answer
        with self._unlocked():
            commit_within(producer, answer_s)  # 6
        crash_point("committed", holds_results)
        crash_point("statistics_committed", holds_shares)
        self._committed(planned)  # 7
        crash_point("replay_committed", replaying)

    def _flush(self, producer: KafkaProducer) -> None:
        """Wait, with the engine let go of, until the broker answered every record sent: the
        records' futures are resolved afterwards (or this raised), so reading them does not
        wait and stays under the lock."""
        with self._unlocked():
            timeout_s = self._settings.kafka.request_timeout_ms / 1000
            flush_within(producer, timeout_s, self._waiting)

    def _engine_of(self) -> Engine:
        engine = self._engine
        assert engine is not None
        return engine

    def _ledger(self, p: int) -> Ledger:
        """Partition p's ledger (set by :meth:`restored`; empty for one never restored)."""
        ledger = self._ledgers.get(p)
        if ledger is None:
            ledger = self._ledgers[p] = Ledger()
        return ledger

    def _ranges_after(self, ps: list[int]) -> dict[int, tuple[Ranges, int | None]]:
        """Per partition, (ranges, epoch start) once this transaction commits, the ranges no
        window reaches any more pruned."""
        horizon_ms = self.horizon_ms()
        marks = self._engine_of().watermarks()
        out = {}
        for p in ps:
            sent = self._interval.sent(p)
            written = None
            if sent is not None:
                first = sent.first.get(timeout=30).offset
                written = (first, sent.last.get(timeout=30).offset, sent.max_ts)
            mark = marks.get(p)
            horizon = None if mark is None or horizon_ms is None else mark - horizon_ms
            out[p] = self._ledger(p).after(written, horizon)
        return out

    def _write_snapshots(
        self, parts: list[InputPartition], extended: dict[int, tuple[Ranges, int | None]]
    ) -> dict[int, SnapshotRef]:
        """Step 3's snapshots: send, in the open transaction, the window aggregates of every
        partition whose results since its last snapshot got too many to re-read; returns
        where each went (the checkpoints name their offsets)."""
        engine, producer = self._engine, self._producer
        assert engine is not None and producer is not None
        now_ms = int(engine.clock() * 1000)
        topic = self._settings.topics.checkpoint_topic
        sent = {}
        for part in parts:
            p = part.partition
            if not snapshots.due(extended[p][0], self._ledger(p).snapshot, now_ms):
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
        self._flush(producer)
        return {
            p: SnapshotRef(
                tuple(f.get(timeout=30).offset for f in futures),
                len(raw),
                zlib.crc32(raw),
                now_ms,
            )
            for p, (raw, futures) in sent.items()
        }

    def _anything_to_commit(self, parts: list[InputPartition]) -> bool:
        """An open transaction, a partition fed or sent to, shares due or counts moved."""
        return (
            self.open
            or any(self._interval.changed(s.partition) for s in parts)
            or self._statistics_due(parts)
            or self._counted_since(parts)
        )

    def _counted_since(self, parts: list[InputPartition]) -> bool:
        """Whether the engine counted something for a partition since its last commit with
        nothing fed or sent: held feedback expiring (``orphaned``) as the watermark or the
        idle fallback moves on. Left out, the last checkpoint would miss those counts."""
        engine = self._engine
        return engine is not None and any(
            engine.counted(part.partition) != self._ledger(part.partition).counters
            for part in parts
        )

    def _statistics_due(self, parts: list[InputPartition]) -> bool:
        """Whether a partition's comparison shares have a final mark to publish (its
        watermark moved, maybe by the idle fallback, with no result to commit)."""
        engine = self._engine
        return engine is not None and any(engine.shares_due(part.partition) for part in parts)

    def _send_statistics(self, p: int, futures: list[tuple[Any, bool]]) -> None:
        """Step 4's statistics: send p's newly final shares, then its final mark, to the
        statistics topic (its open shares go in its checkpoint, ``Engine.state``). Taking them
        forgets them: if this transaction does not commit, the session restores p from the
        last committed checkpoint, which still holds them."""
        engine, producer = self._engine, self._producer
        assert engine is not None and producer is not None
        topic = statistics_topic(self._settings.topics)
        for frozen in engine.final_shares(p):  # the comparisons', then the interleaving credit
            for share in frozen.shares:
                future = producer.send(topic, key=share.key, value=share.encode(), partition=0)
                futures.append((future, True))
            mark = producer.send(topic, key=frozen.key, value=frozen.encode_mark(), partition=0)
            futures.append((mark, False))

    def _place_statistics(self, p: int, state: PartitionState) -> PartitionState:
        """The checkpoint's ``statistics``: p's open shares inline, or, past
        ``INLINE_STATISTICS_BYTES``, ``{"records": <SnapshotRef>}`` naming records of checkpoint
        topic partition p (key ``<p>.statistics``) that hold them, sent into the open
        transaction and flushed to learn their offsets."""
        if state.statistics is None:
            return state
        raw = json.dumps(state.statistics, separators=(",", ":")).encode()
        if len(raw) <= snapshots.INLINE_STATISTICS_BYTES:
            return state
        ref = self._send_records(p, "statistics", raw, int(self._engine_of().clock() * 1000))
        return dataclasses.replace(state, statistics={"records": ref.to_json()})

    def _send_records(self, p: int, name: str, raw: bytes, now_ms: int) -> SnapshotRef:
        """Send ``raw`` in chunks to checkpoint topic partition p (key ``<p>.<name>``) in the
        open transaction, flush, and say where they went."""
        producer = self._producer
        assert producer is not None
        topic, key = self._settings.topics.checkpoint_topic, f"{p}.{name}".encode()
        futures = [
            producer.send(topic, key=key, value=chunk, partition=p)
            for chunk in snapshots.chunks(raw)
        ]
        self._flush(producer)
        offsets = tuple(f.get(timeout=30).offset for f in futures)
        return SnapshotRef(offsets, len(raw), zlib.crc32(raw), now_ms)

    def _place_click_model(self, p: int, state: PartitionState) -> PartitionState:
        """The checkpoint's ``click_model``: p's model inline (base64), or, past
        ``INLINE_STATISTICS_BYTES``, ``{"records": <SnapshotRef>, "log": ...}`` naming records
        of checkpoint topic partition p (key ``<p>.click_model``) holding its snapshot's bytes
        (as the open comparison shares). A snapshot the last committed checkpoint already
        named (``StreamClicks.state`` hands the same one until it takes a new one) is named
        again; a new one is sent into the open transaction and flushed to learn its offsets."""
        doc = state.click_model
        if doc is None or len(doc["snapshot"]) <= snapshots.INLINE_STATISTICS_BYTES:
            return state
        rest = {k: v for k, v in doc.items() if k != "snapshot"}
        now_ms = int(self._engine_of().clock() * 1000)
        committed = self._ledger(p).click_records
        if (
            committed is not None
            and committed[0] == doc["snapshot"]
            and now_ms - committed[1].written_ms < snapshots.MAX_AGE_MS  # not yet aging out
        ):
            self._interval.click_records[p] = committed
            return dataclasses.replace(
                state, click_model={"records": committed[1].to_json(), **rest}
            )
        ref = self._send_records(p, "click_model", base64.b64decode(doc["snapshot"]), now_ms)
        self._interval.click_records[p] = (doc["snapshot"], ref)
        return dataclasses.replace(state, click_model={"records": ref.to_json(), **rest})

    def _checkpoint(
        self,
        part: InputPartition,
        ranges: tuple[ResultRange, ...],
        epoch: int | None,
        snapshot: SnapshotRef | None,
        extra: dict[str, Any],
    ) -> Checkpoint:
        """Partition ``part``'s checkpoint as of this transaction (step 4 of :meth:`commit`):
        the engine's state of it, its open shares placed, and the daemon's half."""
        p = part.partition
        state = self._place_statistics(p, self._engine_of().state(p, part.fed_next))
        state = self._place_click_model(p, state)
        instance = self._settings.daemon.instance_id
        return Checkpoint(p, state, part.consumed(), ranges, epoch, instance, extra, snapshot)

    def _committed(self, planned: list[tuple[Checkpoint, Any]]) -> None:
        """Step 7 of :meth:`commit`: the transaction is committed."""
        self._status = Status.IDLE
        produced = 0
        counted: list[dict[str, int]] = []
        for checkpoint, _ in planned:
            sent = self._interval.sent(checkpoint.partition)
            produced += 0 if sent is None else sent.count
            counted.append(self._ledger(checkpoint.partition).committed(checkpoint))
            records = self._interval.click_records.get(checkpoint.partition)
            self._ledger(checkpoint.partition).click_records = records
        self._interval = Interval()
        reasons = self._dead_letters.committed()
        with self._stats.lock:
            self._stats.results_produced += produced
            self._stats.dlq.update(reasons)
            self._stats.commits += 1
            engine = self._engine_of()
            clicks = None if engine.clicks is None else engine.clicks.scored()
            self._stats.committed.commit(engine.scored(), engine.stats, counted, clicks)
        self._uncommitted = 0
        self._backoff.reset()

    def horizon_ms(self) -> int | None:
        """How far back (event time) rebuilt aggregates can reach: retention plus lateness,
        plus the longest window (a window is pruned whole, ``Aggregates.reach``)."""
        if self._engine is None:
            return None
        config = self._engine.config
        return (
            int(config.retention)
            + int(config.window)
            + int(config.lateness)
            + max(int(w) for w in config.windows)
        )

    def abort(self, *, poisoned: bool = False) -> None:
        """Abandon the open transaction; every owned partition must then be restored again.
        ``poisoned``: aborted during a rebalance, so the partitions kept lost their part of it
        too and the session must resynchronise.

        The broker is asked to abort it at most for ``kafka.transaction_timeout_ms``, and not at
        all once the session failed (``abandoned``, the consumer's close revokes): its broker
        may be why it failed, and the teardown would wait on the consumer's I/O thread, holding
        the engine, for as long as the broker is away. The next session's
        ``init_transactions()`` aborts it, or the broker times it out."""
        producer = self._producer
        if self.open and producer is not None and not self.abandoned:
            try:
                abort_within(producer, self._settings.kafka.transaction_timeout_ms / 1000)
            except KafkaError as exc:
                log.warning("abort failed (%s); the broker will time the transaction out", exc)
        self._status = Status.IDLE
        self._dead_letters.forget()
        with self._stats.lock:
            self._stats.aborts += 1
        if poisoned and self._standing is Standing.LIVE:
            self._standing = Standing.POISONED

    def close(self) -> None:
        """The session ended: close the producer; an open transaction is left for the broker."""
        if self._producer is not None:
            close_quietly(self._producer)
        self._producer = None
        self._appender = None
        self._consumer = None
        self._status = Status.IDLE
        self._standing = Standing.LIVE
        self._ledgers.clear()
        self._interval = Interval()
        self._dead_letters.forget()
