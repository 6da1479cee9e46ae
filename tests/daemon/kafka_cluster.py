"""Harness for the three-broker tier: the cluster, where its leaders and coordinators are, a
paced producer that keeps traffic flowing through a fault, and a sampler of evald's /readyz and
result counter that times the recovery.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploy.local_kafka import LocalKafka, LocalKafkaError
from deploy.local_kafka.cluster import LocalCluster

#: cluster starts tried when a chosen port was taken by another process
START_ATTEMPTS = 3

PRODUCED = "evald_results_produced_total"

#: transaction states in which a transaction is still open (not decided and written out)
OPEN_STATES = {"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"}


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit wrap-around)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` / ``__transaction_state`` whose leader
    coordinates ``key`` (a group id / a transactional id): Kafka's
    ``Utils.abs(key.hashCode()) % partitions``."""
    h = java_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class Cluster:
    """Three Apache Kafka nodes for the module; a test fails (never skips) without Java."""

    def __init__(self, data_dir: Path) -> None:
        self._cluster = self._started(data_dir)

    @staticmethod
    def _started(data_dir: Path) -> LocalCluster:
        """Start three nodes on free ports; when another process took a chosen port before a
        node bound it ("Address already in use"), start afresh on new ports."""
        for attempt in range(1, START_ATTEMPTS + 1):
            cluster = LocalCluster(
                data_dir / f"attempt-{attempt}", settings={"auto.create.topics.enable": "false"}
            )
            try:
                cluster.start()  # stops every node when it fails
                return cluster
            except LocalKafkaError as exc:
                taken = [n.bind_failure() for n in cluster.nodes.values()]
                if attempt == START_ATTEMPTS or not any(taken):
                    pytest.fail(f"the three-broker tier cannot run: {exc}", pytrace=False)
        raise AssertionError("unreachable")

    @property
    def bootstrap(self) -> str:
        return self._cluster.bootstrap

    def node(self, node_id: int) -> LocalKafka:
        return self._cluster.node(node_id)

    def restart(self, *node_ids: int) -> None:
        """Start the given nodes again on their data; return once every node lists all."""
        for node_id in node_ids:
            self.node(node_id).launch()
        self._cluster.wait_ready(timeout=180)

    def heal(self) -> None:
        """Every node running again and every replica in sync: what a case that failed midway
        leaves behind must not fail the next one."""
        down = [i for i, node in self._cluster.nodes.items() if not node.running()]
        for node in self._cluster.nodes.values():
            node.resume()
        if down:
            self.restart(*down)
        self.wait_in_sync()

    def wait_in_sync(self, timeout: float = 180.0) -> None:
        self._cluster.wait_in_sync(timeout)

    def stop(self) -> None:
        self._cluster.stop()

    @contextlib.contextmanager
    def admin(self) -> Iterator[Any]:
        from kafka import KafkaAdminClient

        client = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=10_000)
        try:
            yield client
        finally:
            client.close()

    def create(self, topics: dict[str, int]) -> None:
        """Create topics on three replicas each (min.insync.replicas 2 is the cluster's)."""
        from kafka.admin import NewTopic

        with self.admin() as admin:
            admin.create_topics([NewTopic(name, n, 3) for name, n in topics.items()])

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> node id of its leader (-1 while it has none)."""
        with self.admin() as admin:
            (described,) = admin.describe_topics([topic])
        return {p["partition_index"]: p["leader_id"] for p in described["partitions"]}

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node coordinating ``transactional_id``: the leader of its ``__transaction_state``
        partition, checked against the coordinator the admin client's DescribeTransactions
        found with FindCoordinator (key type transaction)."""
        leaders = self.leaders("__transaction_state")
        node = leaders[coordinator_partition(transactional_id, len(leaders))]
        with self.admin() as admin:
            found = admin.describe_transactions([transactional_id])[transactional_id]
        assert found.coordinator_id == node, (found.coordinator_id, node)
        return node

    def group_coordinator(self, group_id: str) -> int:
        """The node coordinating ``group_id``: the leader of its ``__consumer_offsets``
        partition, checked by DescribeGroups sent to that node (another node would answer
        NOT_COORDINATOR)."""
        leaders = self.leaders("__consumer_offsets")
        node = leaders[coordinator_partition(group_id, len(leaders))]
        with self.admin() as admin:
            described = admin.describe_groups([group_id], group_coordinator_id=node)
        assert group_id in described
        return node

    def open_transactions(self, transactional_prefix: str) -> list[Any]:
        """Transactions of ids starting with the prefix that are not complete, on any node
        (``Ongoing``: undecided; ``Prepare*``: decided, markers still being written)."""
        with self.admin() as admin:
            listed = admin.list_transactions()
        return [
            t
            for rows in listed.values()
            for t in rows
            if t.transactional_id.startswith(transactional_prefix) and t.state in OPEN_STATES
        ]

    def producers_with_open_transactions(self, topic: str) -> list[Any]:
        """Producers that hold a transaction open on a partition of ``topic`` (DescribeProducers
        on each leader: an open one has a current transaction start offset)."""
        from kafka import TopicPartition

        partitions = [TopicPartition(topic, p) for p in self.leaders(topic)]
        with self.admin() as admin:
            states = admin.describe_producers(partitions)
        return [
            (tp, p)
            for tp, state in states.items()
            for p in state.active_producers
            if p.current_transaction_start_offset >= 0
        ]

    def committed_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the group's committed offset."""
        with self.admin() as admin:
            offsets = admin.list_group_offsets({group_id: None})[group_id]
        return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}

    def end_offsets(self, topic: str) -> dict[tuple[str, int], int]:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap)
        try:
            tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            return {(tp.topic, tp.partition): end for tp, end in consumer.end_offsets(tps).items()}
        finally:
            consumer.close()


class Feeder:
    """Simulator events written to the input topics at a steady pace on a thread, acks=all and
    idempotent: the traffic keeps coming while brokers die, and none of it is lost or doubled
    (with two brokers down the writes wait for min ISR, as any producer's would).

    Every ``FLUSH_EVERY`` events the feeder waits until all are acknowledged, as one source
    writing both topics in order would: when the leader of one input partition fails over,
    the other topic's writes wait too. Without that, impressions kept arriving while the
    feedback of the same moments waited for the new leader (seconds, i.e. minutes of event
    time), and feedback arriving more than the merge's hold after newer impressions is fed in
    arrival order, so it was late (docs/design.md, "Determinism" and "What real Kafka changed").
    """

    #: 20 events at the simulator's pace span ~4 s of event time, under the 10 s lateness
    FLUSH_EVERY = 20

    def __init__(
        self,
        bootstrap: str,
        impressions: str,
        feedback: str,
        *,
        events: int,
        seed: int,
        rate: float,
    ) -> None:
        self.written = 0
        self.error: BaseException | None = None
        self._args = (bootstrap, impressions, feedback, events, seed, rate)
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kafka import KafkaProducer

        from evald.demo.simulator import IMPRESSION, Simulator

        bootstrap, impressions, feedback, events, seed, rate = self._args
        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=10,
            delivery_timeout_ms=300_000,
            max_block_ms=300_000,
        )
        try:
            started = time.monotonic()
            sim = Simulator(seed, rate=200.0, speed=60)
            for i, event in enumerate(sim.events()):
                if i == events:
                    break
                topic = impressions if event.kind == IMPRESSION else feedback
                producer.send(topic, key=event.key, value=event.value, timestamp_ms=event.at_ms)
                self.written += 1
                if self.written % self.FLUSH_EVERY == 0:
                    producer.flush(timeout=300)
                ahead = started + i / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            producer.flush(timeout=300)
        except BaseException as exc:  # reported by join(): a thread's exception is otherwise lost
            self.error = exc
        finally:
            producer.close(timeout=10)

    def join(self, timeout: float = 360.0) -> int:
        """Wait until every event is acknowledged; how many were written."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the feeder did not finish in {timeout}s"
        if self.error is not None:
            raise AssertionError(f"the feeder failed: {self.error!r}") from self.error
        return self.written


@dataclass(frozen=True)
class Sample:
    at: float
    ready: int
    reason: str
    produced: float | None


def results_produced(instance: Any, timeout: float = 60.0) -> float | None:
    """evald's results counter, asking /metrics again until it answers (a loaded evald can
    miss a scrape); None if it did not within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        status, text = instance.get("/metrics")
        if status == 200:
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(PRODUCED) and line[len(PRODUCED)] in " {"
            )
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


class Sampler:
    """evald's /readyz and results counter, sampled on a thread, to time a recovery:
    fault -> ready again, fault -> results flowing again."""

    def __init__(self, instance: Any, interval: float = 0.25) -> None:
        self.samples: list[Sample] = []
        self._instance = instance
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            status, body = self._instance.get("/readyz")
            produced = results_produced(self._instance, timeout=0)
            reason = body.strip() if status else "no answer within 2 s"
            self.samples.append(Sample(time.monotonic(), status, reason, produced))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def after(self, at: float) -> list[Sample]:
        return [s for s in self.samples if s.at >= at]

    def not_ready_reasons(self, at: float) -> list[str]:
        """What /readyz said while not ready, after ``at`` (each distinct reason once)."""
        return list(dict.fromkeys(s.reason for s in self.after(at) if s.ready != 200))

    def ready_again(self, at: float) -> float | None:
        """Seconds from ``at`` to /readyz 200 after its first not-ready answer since; 0 when it
        never stopped answering 200 (evald did not notice), None when it never came back."""
        later = self.after(at)
        down = next((i for i, s in enumerate(later) if s.ready != 200), None)
        if down is None:
            return 0.0
        up = next((s for s in later[down:] if s.ready == 200), None)
        return None if up is None else up.at - at

    def longest_pause(self, at: float) -> float:
        """The longest time after ``at`` during which the results counter did not move (only
        between two increases: the quiet after the last result is the end of the traffic)."""
        answered = [s for s in self.samples if s.produced is not None]
        rises = [s.at for a, s in itertools.pairwise(answered) if s.produced > a.produced]  # type: ignore[operator]
        rises = [at, *(t for t in rises if t >= at)]
        return max((b - a for a, b in itertools.pairwise(rises)), default=0.0)

    def flowing_again(self, at: float, produced_before: float) -> float | None:
        """Seconds from ``at`` to the first sample counting more results than
        ``produced_before``; None when none did."""
        up = next(
            (s for s in self.after(at) if s.produced is not None and s.produced > produced_before),
            None,
        )
        return None if up is None else up.at - at
