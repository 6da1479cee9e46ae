"""`evald produce` into a real broker, and the daemon's own Prometheus series."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from itertools import islice

import pytest
from kafka_harness import Broker, KafkaTools
from prometheus_client import CollectorRegistry, generate_latest

from evald.daemon.stats import DaemonCollector, DaemonStats
from evald.demo.simulator import DEFAULT_START_MS, IMPRESSION, Simulator


@pytest.mark.kafka
@pytest.mark.parametrize("regress_at", [None, 0.01], ids=["steady", "regressed"])
def test_produce_writes_the_simulator_stream_keyed_and_timestamped(
    broker: Broker, kafka_tools: KafkaTools, unique: str, regress_at: float | None
) -> None:
    imp, fb = f"pimp-{unique}", f"pfb-{unique}"
    regress_flags = [] if regress_at is None else ["--regress-at", str(regress_at)]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evald",
            "produce",
            "--bootstrap-servers",
            broker.bootstrap,
            "--impressions-topic",
            imp,
            "--feedback-topic",
            fb,
            "--events",
            "400",
            "--seed",
            "7",
            "--partitions",
            "2",
            *regress_flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    # 0.01 wall s at the default 60x speed = 600 ms of event time after the stream starts
    regress_at_ms = None if regress_at is None else DEFAULT_START_MS + 600
    want = list(islice(Simulator(7, regress_at_ms=regress_at_ms).events(), 400))  # endless
    if regress_at is not None:  # the flag changed what the treatment arm served
        assert want != list(islice(Simulator(7).events(), 400))
    got = {(r.key, r.value, r.timestamp) for r in kafka_tools.read(imp) + kafka_tools.read(fb)}
    assert got == {(e.key, e.value, e.at_ms) for e in want}
    # co-partitioned by key: every request's records share one partition number
    partitions: dict[bytes, set[int]] = {}
    for record in kafka_tools.read(imp) + kafka_tools.read(fb):
        partitions.setdefault(record.key, set()).add(record.partition)
    assert all(len(p) == 1 for p in partitions.values())
    kinds = Counter(e.kind for e in want)
    assert len(kafka_tools.read(imp)) == kinds[IMPRESSION]


def test_collector_exports_the_daemon_series() -> None:
    stats = DaemonStats(pauses=3, results_produced=42, ready=True)
    stats.dlq.update({"invalid_json": 2})
    stats.set_lag({("imp", 0): 5, ("fb", 1): 0})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(stats))
    text = generate_latest(registry).decode()
    assert 'evald_consumer_lag{partition="0",topic="imp"} 5.0' in text
    assert 'evald_consumer_lag{partition="1",topic="fb"} 0.0' in text
    assert "evald_backpressure_pauses_total 3.0" in text
    assert 'evald_dlq_records_total{reason="invalid_json"} 2.0' in text
    assert "evald_results_produced_total 42.0" in text
    assert "evald_ready 1.0" in text
    quiet = CollectorRegistry(auto_describe=False)
    quiet.register(DaemonCollector(stats, include_ready=False))
    assert "evald_ready" not in generate_latest(quiet).decode()


def test_check_config_via_the_cli_exits_2_naming_the_field() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "evald", "check-config", "--set", "daemon.pause_at=2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "daemon.pause_at" in proc.stderr
