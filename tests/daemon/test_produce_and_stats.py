"""`evald produce` into a real broker, and the daemon's own Prometheus series."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest
from child_processes import die_with_parent
from kafka_harness import Broker, KafkaTools
from prometheus_client import CollectorRegistry, generate_latest
from settable_clock import SettableClock

from evald.daemon import produce
from evald.daemon.produce import Progress
from evald.daemon.stats import DaemonCollector, DaemonStats
from evald.demo.simulator import DEFAULT_START_MS, IMPRESSION, TEAMS, Faults, Simulator

ROOT = Path(__file__).resolve().parents[2]
PRODUCE = [sys.executable, "-m", "evald", "produce"]


def _produce(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PRODUCE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.kafka
@pytest.mark.parametrize("regress_at", [None, 0.01], ids=["steady", "regressed"])
def test_produce_writes_the_simulator_stream_keyed_and_timestamped(
    broker: Broker, kafka_tools: KafkaTools, unique: str, regress_at: float | None
) -> None:
    imp, fb = f"pimp-{unique}", f"pfb-{unique}"
    regress_flags = [] if regress_at is None else ["--regress-at", str(regress_at)]
    proc = _produce(
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
        "--start",
        "2026-01-01T00:00:00Z",
        "--run-id",
        "fixed",
        *regress_flags,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"created topics {imp}, {fb} with 2 partitions each" in proc.stderr
    assert "400 records" in proc.stderr.splitlines()[-1]
    # 0.01 wall s at the default 60x speed = 600 ms of event time after the stream starts
    regress_at_ms = None if regress_at is None else DEFAULT_START_MS + 600
    sim = Simulator(7, regress_at_ms=regress_at_ms, run_id="fixed")
    want = list(islice(sim.events(), 400))  # endless
    if regress_at is not None:  # the flag changed what the treatment arm served
        assert want != list(islice(Simulator(7, run_id="fixed").events(), 400))
    got = {(r.key, r.value, r.timestamp) for r in kafka_tools.read(imp) + kafka_tools.read(fb)}
    assert got == {(e.key, e.value, e.at_ms) for e in want}
    # co-partitioned by key: every request's records share one partition number
    partitions: dict[bytes, set[int]] = {}
    for record in kafka_tools.read(imp) + kafka_tools.read(fb):
        partitions.setdefault(record.key, set()).add(record.partition)
    assert all(len(p) == 1 for p in partitions.values())
    kinds = Counter(e.kind for e in want)
    assert len(kafka_tools.read(imp)) == kinds[IMPRESSION]
    again = _produce(
        "--bootstrap-servers", broker.bootstrap, "--impressions-topic", imp,
        "--feedback-topic", fb, "--events", "10",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"writing to existing topics {imp}, {fb}" in again.stderr
    assert "created topics" not in again.stderr


def _request_ids(path: Path) -> set[str]:
    ids = set()
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and isinstance(doc.get("request_id"), str):
                ids.add(doc["request_id"])
    return ids


def test_each_run_starts_now_with_fresh_request_ids(tmp_path: Path) -> None:
    """Two default runs never collide, and their event time is the present, not 2026-01-01."""
    before = time.time() * 1000
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (first, second):
        proc = _produce("--events", "3000", "--output", str(path))
        assert proc.returncode == 0, proc.stderr
    after = time.time() * 1000
    ids_a, ids_b = _request_ids(first), _request_ids(second)
    assert len(ids_a) > 500 and len(ids_b) > 500
    assert not (ids_a & ids_b - {"broken", "bad-action", "bad-items", "bad-grade"})
    stamps = [json.loads(line)["ts"] for line in first.read_text().splitlines()[:10]]
    assert all(before <= ts <= after + 3_600_000 for ts in stamps), (before, stamps)


def test_output_is_the_same_traffic_and_replays(tmp_path: Path) -> None:
    out = tmp_path / "traffic.jsonl"
    proc = _produce(
        "--events", "2000", "--seed", "3", "--start", "1767225600000", "--run-id", "r.1",
        "--output", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    want = list(islice(Simulator(3, run_id="r.1").events(), 2000))
    assert out.read_bytes() == b"".join(e.value + b"\n" for e in want)
    assert "run id r.1, event time from 2026-01-01T00:00:00Z" in proc.stderr
    replay = subprocess.run(
        [sys.executable, "-m", "evald", "replay", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    assert "lines read             2,000" in replay.stdout, replay.stdout
    assert "finalized impressions" in replay.stdout


def test_interleave_writes_team_draft_lists_that_replay_credits(tmp_path: Path) -> None:
    """--interleave: the simulator's interleaving mode, byte for byte; `evald replay` with the
    teams declared credits the lists to the two rankers."""
    out, config = tmp_path / "mixed.jsonl", tmp_path / "engine.json"
    proc = _produce(
        "--events", "20000", "--seed", "3", "--start", "1767225600000", "--run-id", "r.1",
        "--clean", "--interleave", "0.3", "--output", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sim = Simulator(3, run_id="r.1", faults=Faults.none(), interleave=0.3)
    want = list(islice(sim.events(), 20_000))
    assert out.read_bytes() == b"".join(e.value + b"\n" for e in want)
    config.write_text(json.dumps({"interleaving": {"teams": list(TEAMS), "window": "5m"}}))
    replay = subprocess.run(
        [sys.executable, "-m", "evald", "replay", str(out), "--config", str(config),
         "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    records = json.loads(replay.stdout)["interleaving"]
    assert {r["segment"]["arm"] for r in records} == {"interleaved"}
    assert all((r["team_a"], r["team_b"]) == TEAMS for r in records)
    assert sum(r["compared"] for r in records) > 500
    bad = _produce("--interleave", "1.5", "--output", "-")
    assert bad.returncode == 2 and "--interleave" in bad.stderr


def test_sigterm_stops_like_ctrl_c_and_keeps_whole_lines(tmp_path: Path) -> None:
    out, err_path = tmp_path / "live.jsonl", tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            [*PRODUCE, "--realtime", "--clean", "--progress-interval", "0.2", "--output", str(out)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=die_with_parent,
        )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "records (" not in err_path.read_text():
            time.sleep(0.05)
        assert "records (" in err_path.read_text(), err_path.read_text()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        status = proc.wait(30)
    text = err_path.read_text()
    assert status == 0, text
    assert "(stopped by SIGTERM)" in text and "Traceback" not in text
    lines = out.read_text().splitlines()
    assert lines and all(json.loads(line)["request_id"] for line in lines)


def test_progress_line_counts_kinds_and_rate() -> None:
    clock, stream = SettableClock(100.0), io.StringIO()
    progress = Progress(stream, 5.0, clock=clock)
    events = list(islice(Simulator(1, run_id="p").events(), 50))
    for event in events[:30]:
        progress.count(event, impression=event.kind == IMPRESSION)
    assert stream.getvalue() == ""  # not due yet
    clock.now += 5.0
    for event in events[30:]:
        progress.count(event, impression=event.kind == IMPRESSION)
    (line,) = stream.getvalue().splitlines()
    imps = sum(1 for e in events[:31] if e.kind == IMPRESSION)
    assert line.startswith(f"evald produce: 31 records ({imps} impressions, {31 - imps} feedback)")
    assert "in 5s, 6/s · event time 2026-01-01T00:00:" in line


def test_an_unreachable_broker_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = _produce(
        "--bootstrap-servers", f"127.0.0.1:{port}", "--set", "kafka.request_timeout_ms=1000",
        "--events", "10",
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"cannot reach Kafka at 127.0.0.1:{port}" in proc.stderr
    assert "check --bootstrap-servers" in proc.stderr and "Traceback" not in proc.stderr


def test_help_lists_only_flags_produce_uses() -> None:
    parser = argparse.ArgumentParser()
    produce.configure(parser)
    text = parser.format_help()
    for unused in ("--results-topic", "--dlq-topic", "--checkpoint-topic", "--group-id",
                   "--instance-id", "--metrics-address"):  # fmt: skip
        assert unused not in text
    proc = _produce("--set", "daemon.group_id=x", "--output", "-")
    assert proc.returncode == 2 and "--set daemon.group_id=x" in proc.stderr
    bad = _produce("--run-id", 'a"b', "--output", "-")
    assert bad.returncode == 2 and "--run-id" in bad.stderr


# each ended `evald produce` with a traceback (an overflow, numpy refusing a negative seed,
# islice refusing a count past sys.maxsize)
@pytest.mark.parametrize(
    "argv",
    [
        ["--events", "1" + "0" * 400],
        ["--speed", "1e308"],
        ["--start", "1" + "0" * 400],
        ["--start", "99999999999999999"],
        ["--regress-at", "inf"],
        ["--regress-at", "nan"],
        ["--regress-at", "1e308"],
        ["--regress-at", "-1"],
        ["--seed", "-1"],
    ],
)
def test_flags_out_of_range_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    produce.configure(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--output", "-", *argv])
    assert exc.value.code == 2
    assert f"argument {argv[0]}: " in capsys.readouterr().err


def test_counts_go_up_to_what_they_are_counted_in() -> None:
    """--events stopped at 1e9 with the times and rates, refusing a soak test of 2e9 records:
    a count makes no event time; it goes to sys.maxsize, --partitions to Kafka's INT32."""
    parser = argparse.ArgumentParser()
    produce.configure(parser)
    args = parser.parse_args(["--output", "-", "--events", "2000000000", "--partitions", "5000"])
    assert (args.events, args.partitions) == (2_000_000_000, 5000)
    with pytest.raises(SystemExit):
        parser.parse_args(["--output", "-", "--partitions", str(2**31)])


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
