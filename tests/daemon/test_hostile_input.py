"""`evald run` as a real process on the test broker, fed what production throws at it: a record
just under Kafka's size limit, a flood of impressions without feedback, topics deleted and
recreated under it, a SIGHUP (issue 10)."""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka_harness import Broker, KafkaTools
from test_kafka import ENGINE, Instance, names, wait_until

pytestmark = pytest.mark.kafka


@pytest.fixture
def instances(broker: Broker, unique: str, tmp_path: Path) -> Iterator[Callable[..., Instance]]:
    started: list[Instance] = []

    def start(instance: str = "a", extra: tuple[str, ...] = ()) -> Instance:
        started.append(Instance(broker.bootstrap, unique, instance, tmp_path, False, extra))
        return started[-1]

    try:
        yield start
    finally:
        for inst in started:
            inst.close()


def log_text(inst: Instance) -> str:
    inst.log.flush()
    return Path(inst.log.name).read_text(errors="replace")


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets on ``topic`` (partition -> offset)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


def test_sighup_stops_cleanly_with_a_commit(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=3000, seed=11)
    inst = instances(extra=("--set", "daemon.commit_interval_ms=600000"))
    # every record fed; nothing committed by the interval (ten minutes): only the stop commits
    wait_until(lambda: inst.metric("evald_events_total") >= 3000, 90, "every record fed")
    assert not committed(broker.bootstrap, f"g-{unique}", topics["feedback"])
    inst.proc.send_signal(signal.SIGHUP)
    assert inst.proc.wait(timeout=40) == 0
    text = log_text(inst)
    assert "received SIGHUP" in text
    assert inst.windows.exists(), "the clean-stop path (which writes the windows file) did not run"
    fed = sum(committed(broker.bootstrap, f"g-{unique}", topics["feedback"]).values())
    assert fed > 0, "no commit on SIGHUP"
