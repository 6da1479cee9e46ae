"""`python -m deploy.local_kafka`: fetch, or run a local Apache Kafka in the foreground.

python -m deploy.local_kafka fetch          # download the broker into the cache
python -m deploy.local_kafka start          # 127.0.0.1:9092 until Ctrl-C (`make kafka`)
python -m deploy.local_kafka start --fresh  # wipe the data directory first
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
from pathlib import Path

from deploy.local_kafka.broker import LocalKafka
from deploy.local_kafka.fetch import KAFKA_VERSION, LocalKafkaError, cache_root, ensure_libs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local_kafka", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="fetch the broker from Maven Central into the cache")
    start = sub.add_parser("start", help="run one broker in the foreground until Ctrl-C")
    start.add_argument("--port", type=int, default=9092, help="client port (default 9092)")
    start.add_argument(
        "--controller-port", type=int, default=9093, help="KRaft controller port (default 9093)"
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
    data = args.data or cache_root() / f"data-{args.port}"
    if args.fresh:
        shutil.rmtree(data, ignore_errors=True)
    broker = LocalKafka(
        data,
        port=args.port,
        controller_port=args.controller_port,
        # convenient for trying things by hand; the tests create every topic explicitly
        settings={"auto.create.topics.enable": "true"},
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"starting Apache Kafka {KAFKA_VERSION} (data in {data}) ...", flush=True)
    broker.start()
    print(
        f"Apache Kafka {KAFKA_VERSION} ready on {broker.bootstrap} (pid {broker.pid}, "
        f"log {broker.log_file}); Ctrl-C stops it",
        flush=True,
    )
    try:
        while not stop.wait(1.0):
            if not broker.running():
                print(f"the broker exited:\n{broker.log_tail()}", file=sys.stderr)
                return 1
    finally:
        broker.stop()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
