"""`evald run` as a real process when topics it uses are deleted under it, on a broker set up as a
default install is (``acl_broker``: it creates a topic any client asks metadata for): evald says
what happened and exits 2, and no client of evald brings a deleted topic back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import Instance, names

pytestmark = pytest.mark.kafka


def delete_topic(bootstrap: str, topic: str) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
    finally:
        admin.close()


def partition_counts(bootstrap: str, *topics: str) -> dict[str, int | None]:
    """Each topic's partition count now (None: it does not exist); asks without creating."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_topics(list(topics))
    finally:
        admin.close()
    return {
        d["name"]: None if d["error_code"] else len(d["partitions"])
        for d in described
        if d["name"] in topics
    }


def exited(inst: Instance, timeout: float, what: str) -> str:
    """Wait for ``inst`` to exit; its log."""
    wait_until(lambda: inst.proc.poll() is not None, timeout, what)
    return inst.log_path.read_text(errors="replace")


def test_results_topic_deleted_while_running_exits_2_and_a_restart_refuses_it(
    acl_broker: Broker, unique: str, tmp_path: Path
) -> None:
    """Before: /readyz stayed 200 for ~32 s with no result (the commit's flush waiting on a
    topic that was gone), then evald created the results topic again and retried the restore
    every ~61 s forever (the checkpoints' result ranges point into the old topic)."""
    tools = KafkaTools(acl_broker.bootstrap)
    topics = names(unique)
    tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    tools.produce_sim(topics["impressions"], topics["feedback"], events=600, seed=41)
    first = Instance(acl_broker.bootstrap, unique, "a", tmp_path)
    second = None
    try:
        wait_until(lambda: first.lag_zero(1), 90, "the daemon to catch up")
        delete_topic(acl_broker.bootstrap, topics["results"])
        deleted_at = time.monotonic()
        more = {"events": 600, "seed": 41, "skip": 600}
        tools.produce_sim(topics["impressions"], topics["feedback"], **more)
        text = exited(first, 30, "evald to stop after its results topic was deleted")
        took = time.monotonic() - deleted_at
        assert first.proc.returncode == 2
        said = f"evald run: stopping: output topic {topics['results']} was deleted while evald ran"
        assert said in text, text[-3000:]
        assert "start evald with a new daemon.group_id" in text
        assert "Traceback" not in text
        # neither evald's producer nor its consumers created it again
        assert partition_counts(acl_broker.bootstrap, topics["results"]) == {
            topics["results"]: None
        }
        # a restart creates the results topic anew, and its restore refuses the checkpoint
        # that points into the old one
        second = Instance(acl_broker.bootstrap, unique, "b", tmp_path)
        text = exited(second, 60, "the restarted evald to exit")
        assert second.proc.returncode == 2
        said = f"results topic {topics['results']} was deleted and recreated since the checkpoint"
        assert said in text, text[-3000:]
    finally:
        first.close()
        if second is not None:
            second.close()
    print(f"results topic deleted while running: exit 2 after {took:.1f}s")


def test_an_input_topic_deleted_on_a_broker_that_creates_topics_is_reported_deleted(
    acl_broker: Broker, unique: str, tmp_path: Path
) -> None:
    """Before: kafka-python's group consumer (asked not to) had the broker create the deleted
    topic again with one partition, and evald said it "changed from 2 to 1 partitions"."""
    tools = KafkaTools(acl_broker.bootstrap)
    topics = names(unique)
    tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    tools.produce_sim(topics["impressions"], topics["feedback"], events=400, seed=42)
    inst = Instance(acl_broker.bootstrap, unique, "a", tmp_path)
    try:
        wait_until(lambda: inst.lag_zero(2), 90, "the daemon to catch up")
        delete_topic(acl_broker.bootstrap, topics["impressions"])
        text = exited(inst, 30, "evald to stop after an input topic was deleted")
    finally:
        inst.close()
    assert inst.proc.returncode == 2
    said = f"evald run: stopping: input topic {topics['impressions']} no longer exists (deleted"
    assert said in text, text[-3000:]
    assert "partitions while evald ran" not in text
    assert "Traceback" not in text
    time.sleep(1.0)  # a metadata request in flight at the exit would have created it by now
    assert partition_counts(acl_broker.bootstrap, topics["impressions"]) == {
        topics["impressions"]: None
    }
