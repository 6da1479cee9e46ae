"""`evald run`'s comparisons over every partition, on Apache Kafka: two instances share the
partitions, one is killed -9 mid-stream, and the comparison series on the survivor's /metrics
(difference, bounds, n per arm, p-value, CUSUMs, sample-ratio guard) equal those of one
uninterrupted engine folding the same records — the engine `evald replay` runs, fed per
partition in the daemon's documented order (docs/design.md, "Statistics over all partitions").
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

import pytest
from kafka_harness import ENGINE, Broker, KafkaTools, wait_until
from kafka_instances import Instance, names
from prometheus_client import generate_latest

from evald.config import load_config
from evald.daemon.comparisons import statistics_topic
from evald.daemon.settings import TopicSettings
from evald.exposition import build_registry
from evald.statistics.shares import Frozen, Share, decode_record

pytestmark = pytest.mark.kafka

STATISTICS = {
    "window": "5m",
    "min_n": 30,
    "cusum_min_n": 10,
    "tuning_n": 2000,
    "comparisons": [
        {
            "name": "ab",
            "label": "arm",
            "control": "control",
            "treatments": ["treatment"],
            "start": 0,
            "arm_scoped_labels": ["model"],
            "min_effect": {"nDCG@10": 0.01},
        }
    ],
}
PREFIXES = ("evald_comparison_", "evald_cusum_")
#: impressions per second of event time: 8000 records span about six 5-minute windows
RATE = 2.0


def comparison_samples(text: str) -> dict[str, float]:
    """The comparison series of an exposition: sample line (name and labels) -> value."""
    out = {}
    for line in text.splitlines():
        if line.startswith(PREFIXES):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def equal(got: dict[str, float], want: dict[str, float]) -> bool:
    return got.keys() == want.keys() and all(
        math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-12) for k in want
    )


def reference(tools: KafkaTools, unique: str) -> dict[str, float]:
    """The uninterrupted engine's comparison series (what `evald replay` folds)."""
    topics = names(unique)
    config = load_config({**ENGINE, "statistics": STATISTICS})
    _, engine = tools.expected(
        config, topics["impressions"], topics["feedback"], global_statistics=True
    )
    registry, _ = build_registry(engine, process=False)
    return comparison_samples(generate_latest(registry).decode())


def test_two_instances_one_killed_fold_the_same_comparison_as_one_engine(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 4, topics["feedback"]: 4})
    extra = ("--set", f"engine.statistics={json.dumps(STATISTICS)}")
    a, b = instances("a", extra=extra), instances("b", extra=extra)
    wait_until(lambda: a.lag_zero(2) and b.lag_zero(2), 90, "two partitions for each instance")
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=8000, seed=6, rate=RATE
    )
    wait_until(
        lambda: (
            a.metric("evald_results_produced_total") > 100
            and b.metric("evald_results_produced_total") > 100
        ),
        90,
        "both instances producing results",
    )
    a.kill()
    wait_until(lambda: b.lag_zero(4), 150, "the survivor to take over and catch up")
    want = reference(kafka_tools, unique)
    assert any(k.startswith("evald_comparison_lower{") for k in want), "no bound: too little data"
    assert want['evald_comparison_end_timestamp_seconds{comparison="ab"}'] > 0

    def survivor() -> dict[str, float]:
        return comparison_samples(b.get("/metrics")[1])

    try:
        wait_until(lambda: equal(survivor(), want), 60, "the survivor's comparison to settle")
    finally:
        got = survivor()
        for key in sorted(want.keys() | got.keys()):
            if not math.isclose(got.get(key, math.nan), want.get(key, math.nan), rel_tol=1e-9):
                print(f"{key}: got {got.get(key)} want {want.get(key)}")
    # every (window, partition) share was written once, by a committed transaction
    topic = statistics_topic(TopicSettings(**{k: v for k, v in topics.items()}))
    records = [decode_record(r.value) for r in kafka_tools.read(topic, committed=True)]
    shares = [(r.start, r.partition) for r in records if isinstance(r, Share)]
    assert shares and len(shares) == len(set(shares))
    assert {r.partition for r in records if isinstance(r, Frozen)} == {0, 1, 2, 3}
    # a fresh instance folds the same comparison from the topic alone
    c = instances("c", extra=extra)
    started = time.monotonic()
    wait_until(lambda: equal(comparison_samples(c.get("/metrics")[1]), want), 60, "a new reader")
    took = time.monotonic() - started
    print(f"a third instance folded the comparison from the topic in {took:.1f}s")
    assert b.terminate() == 0 and c.terminate() == 0
