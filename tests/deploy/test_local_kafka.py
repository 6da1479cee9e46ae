"""The local Apache Kafka launcher: what it says when Java or Maven is missing, and its parts
that need no JVM (the broker itself is exercised by every test in tests/daemon)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.local_kafka import LocalKafka, LocalKafkaError, ensure_libs
from deploy.local_kafka.broker import SINGLE_NODE, java_major


@pytest.fixture
def no_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A PATH with neither java nor mvn on it."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return empty


def test_start_without_java_says_what_to_install(no_java: Path, tmp_path: Path) -> None:
    with pytest.raises(LocalKafkaError, match="openjdk-17-jdk-headless"):
        LocalKafka(tmp_path / "data").start()


def test_fetch_without_maven_says_what_to_install(no_java: Path, tmp_path: Path) -> None:
    with pytest.raises(LocalKafkaError, match="maven"):
        ensure_libs(tmp_path / "cache")
    # nothing half-fetched is taken for a complete cache later
    assert not list((tmp_path / "cache").glob("kafka-*/.complete"))


def test_the_command_exits_2_with_the_hint(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path), "LOCAL_KAFKA_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.local_kafka", "start", "--data", str(tmp_path / "d")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "Java >= 17" in proc.stderr and "maven" in proc.stderr


@pytest.mark.parametrize(
    ("banner", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_392"', 8),
    ],
)
def test_java_major_reads_the_version_banner(tmp_path: Path, banner: str, major: int) -> None:
    fake = tmp_path / "java"
    fake.write_text(f"#!/bin/sh\necho '{banner}' >&2\n")
    fake.chmod(0o755)
    assert java_major(str(fake)) == major


def test_single_node_settings_keep_internal_topics_on_one_replica_and_every_record() -> None:
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
    ):
        assert SINGLE_NODE[key] == "1", key
    assert SINGLE_NODE["log.retention.ms"] == "-1"


def test_a_cluster_is_three_voters_of_one_quorum_with_every_topic_on_three_replicas(
    tmp_path: Path,
) -> None:
    from deploy.local_kafka.cluster import THREE_NODES, LocalCluster

    cluster = LocalCluster(
        tmp_path, ports=[19092, 19093, 19094], controller_ports=[19095, 19096, 19097]
    )
    assert cluster.bootstrap == "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"
    quorum = "1@127.0.0.1:19095,2@127.0.0.1:19096,3@127.0.0.1:19097"
    nodes = [cluster.node(i) for i in (1, 2, 3)]
    assert [n.node_id for n in nodes] == [1, 2, 3]
    assert {n.quorum for n in nodes} == {quorum}
    assert len({n.cluster_id for n in nodes}) == 1  # formatted as one cluster
    assert len({n.data_dir for n in nodes}) == 3
    for node in nodes:
        assert node.settings["transaction.state.log.replication.factor"] == "3"
        assert node.settings["transaction.state.log.min.isr"] == "2"
        assert node.settings["offsets.topic.replication.factor"] == "3"
        assert node.settings["min.insync.replicas"] == "2"
        assert node.settings["unclean.leader.election.enable"] == "false"
        # the single-node test speed-ups stay
        assert (
            node.settings["broker.session.timeout.ms"] == SINGLE_NODE["broker.session.timeout.ms"]
        )
    assert THREE_NODES["default.replication.factor"] == "3"


def test_the_command_refuses_a_two_node_cluster(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.local_kafka", "start", "--nodes", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--nodes" in proc.stderr


#: a child that supervises one node that never exits, polling as fast as it can, so that a
#: signal has every chance to land while the loop is inside its wait
SUPERVISOR = """
import sys
from deploy.local_kafka.__main__ import supervise

class Node:
    node_id = 1
    def running(self): return True
    def stop(self): print("node stopped", flush=True)
    def log_tail(self): return ""

print("supervising", flush=True)
sys.exit(supervise([Node()], poll=0.0))
"""


def test_the_launcher_stops_on_every_burst_of_ctrl_c() -> None:
    """Bursts of SIGINT (Ctrl-C pressed again while it stops) end the launcher's loop each
    time: a handler that takes the lock of what the main thread waits on deadlocks there."""
    import signal
    import time

    from child_processes import die_with_parent

    root = Path(__file__).resolve().parents[2]
    for attempt in range(12):
        proc = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "supervising\n"
            time.sleep(0.3)  # the handlers are installed right after that line
            for _ in range(20):
                os.kill(proc.pid, signal.SIGINT)
                time.sleep(0.0005)
            try:
                out, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                pytest.fail(f"attempt {attempt}: the launcher hung in its signal handler")
            assert proc.returncode == 0, out
            assert out == "node stopped\nstopped\n"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
