"""`python -m deploy.local_kafka`: fetch, or run a local Apache Kafka in the foreground.

python -m deploy.local_kafka fetch          # download the broker into the cache
python -m deploy.local_kafka start          # 127.0.0.1:9092 until Ctrl-C (`make kafka`)
python -m deploy.local_kafka start --fresh  # wipe the data directory first
python -m deploy.local_kafka start --nodes 3  # three nodes on 127.0.0.1:9092-9094 (RF 3, min ISR 2)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from deploy.local_kafka.broker import LocalKafka
from deploy.local_kafka.cluster import LocalCluster
from deploy.local_kafka.fetch import KAFKA_VERSION, LocalKafkaError, cache_root, ensure_libs
from evald.signals import StopSignals


class Node(Protocol):
    """What :func:`supervise` needs of a node (:class:`LocalKafka`)."""

    node_id: int

    def running(self) -> bool: ...

    def stop(self) -> None: ...

    def log_tail(self) -> str: ...


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local_kafka", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="fetch the broker from Maven Central into the cache")
    start = sub.add_parser("start", help="run one broker in the foreground until Ctrl-C")
    start.add_argument(
        "--nodes",
        type=int,
        choices=(1, LocalCluster.SIZE),
        default=1,
        help="one node, or a three-node cluster on consecutive ports (default 1)",
    )
    start.add_argument(
        "--port", type=int, default=9092, help="client port of the first node (default 9092)"
    )
    start.add_argument(
        "--controller-port",
        type=int,
        help="KRaft controller port of the first node (default: the port after the client ports)",
    )
    start.add_argument(
        "--data", type=Path, help="data directory (default: the cache's data-PORT directory)"
    )
    start.add_argument("--fresh", action="store_true", help="delete the data directory first")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(ensure_libs())
            return 0
        return run_foreground(args)
    except LocalKafkaError as exc:
        print(f"local kafka: {exc}", file=sys.stderr)
        return 2


def run_foreground(args: argparse.Namespace) -> int:
    data = args.data or cache_root() / (
        f"data-{args.port}" if args.nodes == 1 else f"cluster-{args.port}"
    )
    if args.fresh:
        shutil.rmtree(data, ignore_errors=True)
    ports = [args.port + i for i in range(args.nodes)]
    first_controller = args.controller_port or args.port + args.nodes
    controllers = [first_controller + i for i in range(args.nodes)]
    # convenient for trying things by hand; the tests create every topic explicitly
    settings = {"auto.create.topics.enable": "true"}
    nodes: list[LocalKafka]
    if args.nodes == 1:
        nodes = [LocalKafka(data, port=ports[0], controller_port=controllers[0], settings=settings)]
        start: Callable[[], None] = nodes[0].start
    else:
        # the three voters share a cluster id chosen at format time, kept in each node's data
        cluster = LocalCluster(data, ports=ports, controller_ports=controllers, settings=settings)
        nodes, start = list(cluster.nodes.values()), cluster.start
    print(f"starting Apache Kafka {KAFKA_VERSION} (data in {data}) ...", flush=True)
    start()  # Ctrl-C meanwhile: KeyboardInterrupt, and start() kills the half-started nodes
    bootstrap = ",".join(node.bootstrap for node in nodes)
    pids = ", ".join(str(node.pid) for node in nodes)
    ready = (
        f"Apache Kafka {KAFKA_VERSION} ready on {bootstrap} (pid {pids}, "
        f"log {' '.join(str(node.log_file) for node in nodes)}); Ctrl-C stops it"
    )
    return supervise(nodes, ready=ready)


def supervise(nodes: Sequence[Node], poll: float = 1.0, ready: str = "") -> int:
    """Print ``ready`` and run until SIGINT/SIGTERM (0) or a node exits (1), then stop every
    node. The handlers only note the signal (evald.signals says why: an ``Event.set`` there
    deadlocked), so Ctrl-C pressed again while the nodes stop changes nothing."""
    with StopSignals() as stop:
        if ready:
            print(ready, flush=True)  # the handlers are in place: Ctrl-C stops it from now on
        try:
            while not stop.wait(poll):
                for node in nodes:
                    if not node.running():
                        print(f"node {node.node_id} exited:\n{node.log_tail()}", file=sys.stderr)
                        return 1
        finally:
            for node in nodes:
                node.stop()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
