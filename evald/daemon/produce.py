"""`evald produce`: write the demo simulator's traffic into the impressions and feedback topics.

Records are keyed by request_id (so the default partitioner co-partitions the two topics) and
carry the simulated arrival time as their Kafka timestamp, which is the order `evald run` merges
the two topics in.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from itertools import islice

from evald.daemon.options import add_settings_flags, settings_from_args
from evald.daemon.settings import SettingsError

SUMMARY = "write simulated search traffic (impressions + feedback) into Kafka for `evald run`"
EXAMPLES = """\
  evald produce --bootstrap-servers localhost:9092 --events 100000
  evald produce --config evald.yaml --partitions 6 --realtime --rate 2000
"""


def configure(parser: argparse.ArgumentParser) -> None:
    """Same connection/topic flags as `evald run`, plus the traffic shape."""
    add_settings_flags(parser)
    parser.add_argument(
        "--events",
        type=int,
        default=None,
        help="stop after this many records (default: endless with --realtime, else 100000)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=3_000.0, help="events per wall second")
    parser.add_argument(
        "--speed", type=float, default=60.0, help="event-time seconds per wall second"
    )
    parser.add_argument(
        "--clean", action="store_true", help="no duplicates, losses or malformed records"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=3,
        help="partition count when the topics have to be created",
    )
    parser.add_argument(
        "--realtime", action="store_true", help="pace records by their simulated arrival time"
    )
    parser.add_argument(
        "--regress-at",
        type=float,
        default=None,
        metavar="SECONDS",
        help="wall seconds (at --speed) after which the treatment arm's ranker degrades, so "
        "dashboards and alerts have a drop to show (default: never)",
    )


def run(args: argparse.Namespace) -> int:
    """Produce until ``--events`` records were written (or forever with --realtime)."""
    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        print(f"evald produce: invalid settings\n{exc}", file=sys.stderr)
        return 2
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    from evald.demo.simulator import DEFAULT_START_MS, IMPRESSION, Faults, Simulator

    client = settings.kafka.client_config()
    topics = settings.topics
    admin = KafkaAdminClient(**client)
    try:
        existing = set(admin.list_topics())
        create = [t for t in (topics.impressions, topics.feedback) if t not in existing]
        if create:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics([NewTopic(t, args.partitions, 1) for t in create])
    finally:
        admin.close()
    regress_at_ms = (
        None
        if args.regress_at is None
        else DEFAULT_START_MS + int(args.regress_at * 1000 * args.speed)
    )
    sim = Simulator(
        args.seed,
        rate=args.rate,
        speed=args.speed,
        regress_at_ms=regress_at_ms,
        faults=Faults.none() if args.clean else None,
    )
    limit = args.events if args.events is not None else (None if args.realtime else 100_000)
    producer = KafkaProducer(linger_ms=20, **client)
    started = time.monotonic()
    written = 0
    try:
        for event in islice(sim.events(), limit):
            if args.realtime:
                due = (event.at_ms - sim.start_ms) / 1000.0 / args.speed
                delay = due - (time.monotonic() - started)
                if delay > 0:
                    time.sleep(delay)
            topic = topics.impressions if event.kind == IMPRESSION else topics.feedback
            producer.send(topic, key=event.key, value=event.value, timestamp_ms=event.at_ms)
            written += 1
    except KeyboardInterrupt:
        pass
    finally:
        producer.flush()
        producer.close()
    print(
        f"evald produce: wrote {written} records to {topics.impressions} / {topics.feedback}",
        file=sys.stderr,
    )
    return 0
