"""An in-memory Kafka for the daemon's commit and restore cycle, fast and deterministic: the
real ``Transaction``, ``Inputs``, ``Restorer`` and ``Engine`` over partition logs
with transactions, so a test can stop a session at any cycle (a restart, a rebalance) and
compare what the committed logs hold with an uninterrupted session.

What it keeps of Kafka: offsets per partition; a transaction's records and group offsets
become committed together or not at all; a commit or abort marker takes an offset; a new
producer with the same transactional id aborts what the old one left open (as
``init_transactions()`` does); ``read_committed`` reads skip aborted and open records. The
group consumer fetches what the test asks for (``fetch``), so the test decides where each
session stops. A session (:class:`Session`) is the pieces ``Daemon`` wires, driven the way
``Daemon.process`` and its commit drive them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from evald.daemon.backoff import Backoff
from evald.daemon.dead_letters import DeadLetters
from evald.daemon.main.checkpoint import Checkpoint
from evald.daemon.main.inputs import Inputs
from evald.daemon.main.restore import Restorer
from evald.daemon.main.transaction import Transaction
from evald.daemon.settings import Settings
from evald.daemon.stats import DaemonStats
from evald.daemon.topics import TopicGuard
from evald.decode import Rejection
from evald.engine import Engine


@dataclass(frozen=True)
class Stored:
    """One record on a fake partition log (the fields kafka-python's records have)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class Sent:
    """A send's metadata: what ``future.get()`` returns."""

    offset: int


class Done:
    """A resolved send future."""

    def __init__(self, offset: int) -> None:
        self._sent = Sent(offset)
        self.exception = None

    def get(self, timeout: float | None = None) -> Sent:
        return self._sent

    def failed(self) -> bool:
        return False


@dataclass
class Cluster:
    """The partition logs (a None entry is a transaction marker), the transactions' fates
    and the groups' committed offsets."""

    logs: dict[TopicPartition, list[Stored | None]] = field(
        default_factory=lambda: defaultdict(list)
    )
    aborted: set[tuple[TopicPartition, int]] = field(default_factory=set)
    #: transactional id -> the records of its open transaction
    open: dict[str, list[tuple[TopicPartition, int]]] = field(default_factory=dict)
    groups: dict[str, dict[TopicPartition, int]] = field(default_factory=lambda: defaultdict(dict))

    def append(
        self,
        topic: str,
        partition: int,
        value: bytes | None,
        *,
        timestamp: int = 0,
        key: bytes | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
    ) -> int:
        """Write one record; returns its offset."""
        tp = TopicPartition(topic, partition)
        log = self.logs[tp]
        log.append(Stored(topic, partition, len(log), timestamp, key, value, tuple(headers)))
        return len(log) - 1

    def end(self, topic: str, partition: int) -> int:
        return len(self.logs[TopicPartition(topic, partition)])

    def records(self, topic: str, *, committed: bool = True) -> list[Stored]:
        """Every record of ``topic`` (all partitions), ``read_committed`` unless told not."""
        pending = {entry for txn in self.open.values() for entry in txn}
        out = []
        for tp, log in sorted(self.logs.items()):
            if tp.topic != topic:
                continue
            for record in log:
                if record is None:
                    continue
                spot = (tp, record.offset)
                if committed and (spot in self.aborted or spot in pending):
                    continue
                out.append(record)
        return out

    def finish(self, txid: str, *, commit: bool) -> None:
        """End ``txid``'s open transaction: markers, and its records aborted unless ``commit``."""
        written = self.open.pop(txid, [])
        for tp in sorted({tp for tp, _ in written}):
            self.logs[tp].append(None)
        if not commit:
            self.aborted.update(written)

    def checkpoint(self, group: str, topic: str, partition: int) -> Checkpoint:
        """The group's committed checkpoint of ``partition`` (the record before its offset)."""
        at = self.groups[group][TopicPartition(topic, partition)]
        record = self.logs[TopicPartition(topic, partition)][at - 1]
        assert record is not None
        return Checkpoint.decode(record.value or b"")


class Producer:
    """A transactional producer on the cluster (``transaction.connect``'s producer)."""

    def __init__(self, cluster: Cluster, txid: str) -> None:
        self.config = {"max_request_size": 1_048_576}
        self._cluster = cluster
        self._txid = txid
        self._offsets: tuple[str, dict[TopicPartition, Any]] | None = None
        cluster.finish(txid, commit=False)  # init_transactions(): a zombie's is aborted

    def begin_transaction(self) -> None:
        self._cluster.open[self._txid] = []
        self._offsets = None

    def send(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        timestamp_ms: int | None = None,
    ) -> Done:
        p = partition or 0
        offset = self._cluster.append(
            topic, p, value, key=key, headers=headers or (), timestamp=timestamp_ms or 0
        )
        self._cluster.open[self._txid].append((TopicPartition(topic, p), offset))
        return Done(offset)

    def flush(self, timeout: float | None = None) -> None:
        pass

    def send_offsets_to_transaction(self, offsets: dict[TopicPartition, Any], group: str) -> None:
        self._offsets = (group, offsets)

    def commit_transaction(self) -> None:
        self._cluster.finish(self._txid, commit=True)
        if self._offsets is not None:
            group, offsets = self._offsets
            self._cluster.groups[group].update({tp: om.offset for tp, om in offsets.items()})

    def abort_transaction(self) -> None:
        self._cluster.finish(self._txid, commit=False)


class GroupConsumer:
    """The session's group consumer: committed offsets, positions, pauses; ``fetch`` is the
    test's poll."""

    def __init__(self, cluster: Cluster, group: str) -> None:
        self._cluster = cluster
        self._group = group
        self._positions: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()

    def committed(
        self, tp: TopicPartition, metadata: bool = False, timeout_ms: int | None = None
    ) -> Any:
        offset = self._cluster.groups[self._group].get(tp)
        if offset is None or not metadata:
            return offset
        return OffsetAndMetadata(offset, "", -1)

    def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._positions[tp] = offset

    def position(self, tp: TopicPartition) -> int | None:
        return self._positions.get(tp)

    def highwater(self, tp: TopicPartition) -> int:
        return len(self._cluster.logs[tp])

    def pause(self, *tps: TopicPartition) -> None:
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused.difference_update(tps)

    def group_metadata(self) -> str:
        return self._group

    def fetch(self, tps: Iterable[TopicPartition], limit: int) -> dict[TopicPartition, list[Any]]:
        """At most ``limit`` records of each of ``tps`` (sought, not paused) from its position."""
        out = {}
        for tp in tps:
            at = self._positions.get(tp)
            if at is None or tp in self.paused:
                continue
            log = self._cluster.logs[tp]
            records = []
            while at < len(log) and len(records) < limit:
                if log[at] is not None:
                    records.append(log[at])
                at += 1
            self._positions[tp] = at
            if records:
                out[tp] = records
        return out


class Reader:
    """A group-less reader a restore reads state with (``read_uncommitted`` by default):
    several partitions at once, each from its own position; ``committed`` skips records of
    aborted and open transactions, as ``read_committed`` does."""

    def __init__(self, cluster: Cluster, *, committed: bool = False) -> None:
        self._cluster = cluster
        self._committed = committed
        self._at: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()

    def assign(self, tps: list[TopicPartition]) -> None:
        self._at = {tp: self._at.get(tp, 0) for tp in tps}
        self._paused &= set(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._at[tp] = offset
        self._paused.discard(tp)

    def pause(self, *tps: TopicPartition) -> None:
        self._paused.update(tps)

    def position(self, tp: TopicPartition) -> int:
        return self._at[tp]

    def highwater(self, tp: TopicPartition) -> int:
        return len(self._cluster.logs[tp])

    def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: len(self._cluster.logs[tp]) for tp in tps}

    def close(self, timeout_ms: int | None = None) -> None:
        pass

    def poll(self, timeout_ms: int = 0, max_records: int = 500) -> dict[TopicPartition, list[Any]]:
        pending = {entry for txn in self._cluster.open.values() for entry in txn}
        out = {}
        for tp, at in self._at.items():
            if tp in self._paused:
                continue
            log = self._cluster.logs[tp]
            end = min(len(log), at + max_records)
            records = [
                r
                for r in log[at:end]
                if r is not None
                and not (
                    self._committed
                    and ((tp, r.offset) in self._cluster.aborted or (tp, r.offset) in pending)
                )
            ]
            self._at[tp] = end
            if records:
                out[tp] = records
        return out


class Session:
    """One session of the daemon on the cluster: its inputs, transaction, dead letters and
    engine, driven as ``Daemon.process`` and the commit drive them. ``stop`` is a clean stop
    (the shutdown commit); dropping a session without it is a kill -9."""

    def __init__(
        self,
        cluster: Cluster,
        settings: Settings,
        partitions: Iterable[int],
        clock: Callable[[], float],
    ) -> None:
        topics = settings.topics
        self.settings = settings
        self.stats = DaemonStats()
        self.inputs = Inputs(topics.impressions, topics.feedback, clock, merge_hold_s=2.0)
        self.dead_letters = DeadLetters(topics.dlq)
        self.transaction = Transaction(
            settings, self.stats, self.inputs, self.dead_letters, Backoff(0.1, 1.0), clock, dict
        )
        self.engine = Engine(
            settings.engine_config(), clock=lambda: 0.0, on_result=self.transaction.send_result
        )
        self.consumer = GroupConsumer(cluster, settings.daemon.group_id)
        self._producer = Producer(cluster, settings.daemon.transactional_id())
        self._guard = TopicGuard(settings, clock)
        self._restorer = Restorer(
            settings,
            consumer=self.consumer,  # type: ignore[arg-type]
            reader=Reader(cluster),  # type: ignore[arg-type]
            committed_reader=lambda: Reader(cluster, committed=True),  # type: ignore[arg-type,return-value]
            engine=self.engine,
            guard=self._guard,
            inputs=self.inputs,
            clock=clock,
        )
        self._clock = clock
        self.transaction.connect(self._producer, self.consumer, self.engine)  # type: ignore[arg-type]
        self.inputs.connect(self.consumer)  # type: ignore[arg-type]
        self.inputs.assign(set(partitions))

    def _restore(self, ps: list[int]) -> None:
        for p, restored in self._restorer.restore(ps).items():
            self.inputs.resume(p, restored)
            self.transaction.restored(p, restored.checkpoint)

    def _dead_letter(self, rejection: Rejection, record: Any, kind: str) -> None:
        self.dead_letters.send(self.transaction.begin(), rejection, record, kind)  # type: ignore[arg-type]

    def cycle(self, limit: int = 1_000, partitions: Iterable[int] | None = None) -> int:
        """Fetch at most ``limit`` records per input partition (of ``partitions``, default all
        owned), then what ``Daemon.process`` does; returns how many records were fed."""
        owned = sorted(self.inputs.parts if partitions is None else partitions)
        tps = [self.inputs.tp(kind, p) for p in owned for kind in ("impression", "feedback")]
        batches = self.consumer.fetch(tps, limit)
        self._restore(self.inputs.to_restore())
        self.consumer.pause(*self.inputs.take(batches))
        fed = self.inputs.feed(self.engine.feed_batch)
        for rejection, record, kind in fed.rejected:
            self._dead_letter(rejection, record, kind)
        self.consumer.resume(*fed.resume)
        self.transaction.fed(fed.counts)
        self.engine.tick()
        return sum(fed.counts.values())

    def commit(self) -> None:
        self.transaction.commit()

    def revoke(self) -> None:
        """A rebalance takes every partition away: the revocation commit, then forget them."""
        self.transaction.commit()
        for p in self.inputs.revoke(set(self.inputs.parts)):
            self.engine.drop_partition(p)
            self.transaction.forget(p)
