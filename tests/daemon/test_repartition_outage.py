"""`evald run` with ``input.repartition`` through a broker outage: the proxy in front of the
broker cut once the stage has copied, every fetch failing, then restored.

Oracle: the results topic read ``read_committed`` without deduplication equals `evald replay` of
the same records (as tests/daemon/test_kafka_repartition.py), and every copy a
``read_committed`` reader of the internal topics saw is a source record, unchanged, seen once,
in its request id's partition, and in timestamp order within its partition: the order the stage
promises the main stage (interleave.py), which a release on a stale watermark breaks.

Unlike the crash tests, the readers here lose the broker too, and kafka-python reconnects them
with a backoff of up to 30 s, while the stage deletes what the main stage has committed (every
30 s): a reader may miss copies, so what it saw is checked, not that it saw everything.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from kafka_harness import Broker, CommittedReader, KafkaTools, TcpProxy, wait_until
from test_kafka_repartition import (
    INTERNAL_PARTITIONS,
    Evald,
    internal_topics_exist,
    produce_keyed_by_client,
    replay_results,
    results_once,
    topics_of,
)

from evald.daemon.names import internal_topic
from evald.daemon.repartition.rekey import partition_for

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]  # a broker fault, ~30 s: the chaos tier


def shape(record: Any) -> tuple[bytes, int, tuple[Any, ...]]:
    return record.value, record.timestamp, tuple(record.headers)


def assert_copies_sound(name: str, copies: list[Any], source: list[Any]) -> None:
    """Each copy is a source record, unchanged, once, in its request id's partition; each
    internal partition's copies are in timestamp order."""
    originals = Counter(shape(r) for r in source)
    seen = Counter(shape(r) for r in copies)
    assert not seen - originals, f"{name}: copies that are no source record, or doubled"
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for record in copies:
        assert record.partition == partition_for(record.key, INTERNAL_PARTITIONS)
        assert json.loads(record.value)["request_id"].encode() == record.key
        by_partition.setdefault(record.partition, []).append((record.offset, record.timestamp))
    for partition, stamped in by_partition.items():
        stamps = [timestamp for _, timestamp in sorted(stamped)]
        back = [(a, b) for a, b in pairwise(stamps) if b < a]
        assert not back, f"{name}[{partition}]: timestamps go back, e.g. {back[:3]}"


def test_an_outage_while_the_stage_copies_keeps_the_results_and_the_order(
    proxied_broker: tuple[Broker, TcpProxy], unique: str, tmp_path: Path
) -> None:
    broker, proxy = proxied_broker
    tools = KafkaTools(broker.bootstrap)
    topics = topics_of(unique)
    tools.create({topics["impressions"]: 3, topics["feedback"]: 2})
    events = produce_keyed_by_client(tools, topics, 6000)
    expected = replay_results(events, tmp_path)
    run = Evald(broker, unique, tmp_path)
    readers: dict[str, CommittedReader] = {}
    try:
        wait_until(lambda: internal_topics_exist(tools, topics), 60, "the internal topics")
        for kind in ("impressions", "feedback"):
            name = topics[kind]
            readers[name] = CommittedReader(tools.bootstrap, internal_topic(topics["group"], name))
        wait_until(
            lambda: run.metric("evald_repartitioned_records_total") > 0 or None,
            60,
            "the stage's first copies",
        )
        # the stage's fetches (and its transaction, if one is under way) fail; whether it is
        # still copying or idle at the inputs' end depends on the machine's speed
        proxy.cut()
        copied_at_cut = run.metric("evald_repartitioned_records_total")
        wait_until(lambda: run.metric("evald_ready") == 0 or None, 30, "/metrics: not ready")
        proxy.restore()
        wait_until(
            lambda: len(results_once(tools, topics["results"])) >= len(expected) or None,
            180,
            "every result after the outage",
        )
    finally:
        status = run.stop()
        copies = {name: reader.stop() for name, reader in readers.items()}
    assert status == 0, run.log()
    print(f"outage after {copied_at_cut:.0f} of {len(events)} records copied")
    assert results_once(tools, topics["results"]) == expected
    for name, seen in copies.items():
        assert seen, f"the reader of {name}'s copies saw none"
        assert_copies_sound(name, seen, tools.read(name, committed=True))
