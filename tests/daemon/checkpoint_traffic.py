"""The checkpoints a fixed run writes, through the real commit cycle over the in-memory Kafka
(fake_kafka.py): the scenario behind ``data/checkpoints-2026-11-27.jsonl``, which holds the
checkpoint records this run wrote with the code of 2026-11-27 (before ``PartitionState``).

The run is made to fill every field a checkpoint can hold: a pending cap small enough to evict
impressions (``evicted``), repeated impressions and feedback for request ids never served
(``evicted`` and ``held_feedback``), a comparison (``statistics``), enough results for
snapshots of the window aggregates (``snapshot``), and a kill -9 followed by a restore whose
first commits are made while the partitions replay (``consumed`` above what was fed).
"""

from __future__ import annotations

from fake_kafka import Cluster, Session
from replay_traffic import traffic
from settable_clock import SettableClock

from evald.daemon.settings import Settings, load_settings

TOPICS = {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"}
ENGINE = {
    "window": "1m",
    "lateness": "10s",
    "windows": ["1m", "5m"],
    "retention": "2h",
    "min_event_time": 0,
    "max_event_lead": None,
    "max_pending": 40,
    "statistics": {
        "window": "1m",
        "comparisons": [
            {"name": "ab", "label": "arm", "control": "a0", "treatments": ["a1"], "start": 0}
        ],
    },
}
PARTITIONS = (0, 1)
BASE = 10_000_000


def settings() -> Settings:
    return load_settings(
        environ={},
        flags={
            "topics": TOPICS,
            "daemon": {"group_id": "g", "instance_id": "a"},
            "engine": ENGINE,
        },
    )


def written() -> list[bytes]:
    """Every checkpoint record the run writes, in the order of the checkpoint topic's
    partitions and offsets (committed ones: the run commits every transaction it opens)."""
    cluster, clock = Cluster(), SettableClock()
    for p in PARTITIONS:
        rows = traffic(seed=11, partition=p, n=2_600, base=BASE, repeats=0.05, orphans=0.05)
        for kind, at, value in rows:
            topic = TOPICS["impressions"] if kind == "impression" else TOPICS["feedback"]
            cluster.append(topic, p, value, timestamp=at, key=b"k")
    first = Session(cluster, settings(), PARTITIONS, clock)
    for _ in range(6):
        first.cycle(limit=400)
        clock.now += 3.0
        first.commit()
    first.cycle(limit=300)  # fed, never committed: the kill -9 below loses it
    second = Session(cluster, settings(), PARTITIONS, clock)
    second.cycle(limit=0)  # restores both partitions
    for limit in (5, 50, 2_000, 2_000, 2_000):
        clock.now += 3.0
        second.cycle(limit=limit)
        second.commit()
    topic = settings().topics.checkpoint_topic
    return [
        record.value or b""
        for record in cluster.records(topic)
        if record.key is not None and record.key.isdigit()
    ]
