"""Three Apache Kafka nodes on loopback: a static KRaft quorum of combined broker+controllers.

Every topic gets replication factor 3 and min.insync.replicas 2, the internal ones included, so
one node can die without losing or stalling anything and two down stop writes (nothing acked is
lost). Each node is a :class:`LocalKafka` with its own data directory, so it can be killed,
paused and restarted on its data like a single broker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from deploy.local_kafka.broker import LocalKafka, free_port, new_cluster_id
from deploy.local_kafka.fetch import LocalKafkaError

THREE_NODES = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    # an out-of-sync replica never becomes leader: a record acked by min ISR is never lost
    "unclean.leader.election.enable": "false",
}
"""Settings every node of a three-node cluster gets on top of the single-node ones."""


class LocalCluster:
    """Three KRaft nodes (ids 1-3) whose data lives in ``data_dir/node-N``.

    ``start()`` formats and launches all three (a quorum needs a majority up before anything
    answers) and returns once each lists every broker; ``stop()`` ends them by PID. ``node(i)``
    is one node, to kill, pause or restart; ``wait_in_sync()`` waits until every replica of
    every partition is back in its ISR.
    """

    SIZE = 3

    def __init__(
        self,
        data_dir: Path,
        *,
        ports: Sequence[int] | None = None,
        controller_ports: Sequence[int] | None = None,
        settings: Mapping[str, str] | None = None,
        heap: str = "512m",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        ids = range(1, self.SIZE + 1)
        ports = list(ports or [free_port() for _ in ids])
        controllers = list(controller_ports or [free_port() for _ in ids])
        if len(ports) != self.SIZE or len(controllers) != self.SIZE:
            raise LocalKafkaError(f"a cluster needs {self.SIZE} client and controller ports")
        quorum = ",".join(f"{i}@127.0.0.1:{port}" for i, port in zip(ids, controllers, strict=True))
        cluster_id = new_cluster_id()
        self._clock = clock
        self.nodes = {
            i: LocalKafka(
                Path(data_dir) / f"node-{i}",
                port=port,
                controller_port=controller,
                settings={**THREE_NODES, **(settings or {})},
                heap=heap,
                node_id=i,
                quorum=quorum,
                cluster_id=cluster_id,
                clock=clock,
            )
            for i, port, controller in zip(ids, ports, controllers, strict=True)
        }

    @property
    def bootstrap(self) -> str:
        """Every node's address: a client still bootstraps while one or two are down."""
        return ",".join(node.bootstrap for node in self.nodes.values())

    def node(self, node_id: int) -> LocalKafka:
        return self.nodes[node_id]

    def start(self, timeout: float = 300.0) -> None:
        """Launch every node not running, then wait until each answers listing all brokers."""
        try:
            for node in self.nodes.values():
                node.launch()
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until every node answers an admin ``describe_cluster`` naming all three."""
        deadline = self._clock() + timeout
        for node in self.nodes.values():
            while len(node.describe_cluster().get("brokers") or ()) < self.SIZE:
                if not node.running():
                    raise LocalKafkaError(
                        f"Kafka node {node.node_id} exited during start-up:\n{node.log_tail()}"
                    )
                if self._clock() > deadline:
                    raise LocalKafkaError(
                        f"Kafka node {node.node_id} did not see all {self.SIZE} brokers within "
                        f"{timeout:.0f}s:\n{node.log_tail()}"
                    )
                time.sleep(0.2)

    def wait_in_sync(self, timeout: float = 120.0) -> None:
        """Block until every partition of every topic has all its replicas in sync."""
        deadline = self._clock() + timeout
        while self.out_of_sync():
            if self._clock() > deadline:
                raise LocalKafkaError(
                    f"partitions still out of sync after {timeout:.0f}s: {self.out_of_sync()[:5]}"
                )
            time.sleep(0.3)

    def out_of_sync(self) -> list[str]:
        """``topic-partition`` of every partition whose ISR lacks a replica, internal topics
        included; a node's own failure to answer counts as everything out of sync."""
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        try:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000)
        except (KafkaError, OSError) as exc:
            return [f"no answer: {exc}"]
        try:
            described = admin.describe_topics()
        except (KafkaError, OSError) as exc:
            return [f"no answer: {exc}"]
        finally:
            admin.close()
        return [
            f"{topic['name']}-{part['partition_index']}"
            for topic in described
            for part in topic["partitions"]
            if set(part["isr_nodes"]) != set(part["replica_nodes"]) or part["leader_id"] < 0
        ]

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown of every node (SIGTERM, SIGKILL after ``timeout``)."""
        for node in self.nodes.values():
            node.stop(timeout)

    def kill(self) -> None:
        for node in self.nodes.values():
            node.kill()
