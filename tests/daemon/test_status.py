"""`evald run`'s status line and log formats: pure pieces, a real engine, and the real process."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from child_processes import die_with_parent
from kafka_harness import Broker, KafkaTools
from settable_clock import SettableClock

from evald.config import load_config
from evald.daemon.logs import event_time, setup_logging
from evald.daemon.stats import DaemonStats
from evald.daemon.status import Sample, StatusReporter, format_status, sample, status
from evald.engine import Engine

ROOT = Path(__file__).resolve().parents[2]
PRODUCE = [sys.executable, "-m", "evald", "produce"]
RUN = [
    sys.executable,
    "-m",
    "evald",
    "run",
    "--metrics-address",
    "127.0.0.1:0",
    "--log-format",
    "json",
]
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _impression(rid: str, ts: int) -> bytes:
    doc = {"type": "impression", "request_id": rid, "ts": ts, "items": ["a", "b"]}
    return json.dumps(doc).encode()


def test_status_rates_levels_and_a_new_session_resetting_counters() -> None:
    prev = Sample(T0, 1_000, 100, 5, 10, None, None)
    cur = Sample(T0 + 10, 31_000, 2_100, 8, 40_211, 1_234, int((T0 + 10 - 187) * 1000))
    fields = status(prev, cur)
    assert fields == {
        "ready": True,
        "reason": "ok",
        "consumed_per_s": 3000.0,
        "results_per_s": 200.0,
        "lag": 1234,
        "watermark_delay_s": 187.0,
        "pending": 40211,
        "rejected": 8,
        "rejected_new": 3,
    }
    assert format_status(fields) == (
        "status: consumed 3,000/s · results 200/s · lag 1,234 · watermark delay 3m07s"
        " · pending 40,211 · rejected 8 (+3)"
    )
    # a new session's engine starts at 0: count from there, never a negative rate
    restarted = Sample(T0 + 20, 500, 2_100, 1, 0, None, None)
    after = status(cur, restarted)
    assert after["consumed_per_s"] == 50.0 and after["rejected_new"] == 1
    assert format_status(after).startswith("status: consumed 50/s")
    assert "lag - · watermark delay -" in format_status(after)
    away = format_status(status(cur, restarted, (False, "broker not reachable (retrying)")))
    assert away.startswith("status (not ready: broker not reachable (retrying)): consumed 50/s")


def test_sample_reads_a_real_engine_and_the_daemon_stats() -> None:
    # blocks of two events: a partition's watermark moves once both of a block have reached a
    # time (docs/semantics.md §3)
    engine = Engine(load_config(watermark_quorum=2))
    ts = int(T0 * 1000)
    engine.feed(_impression("r1", ts), partition=0)
    engine.feed(_impression("r1b", ts + 1_000), partition=0)
    engine.feed(_impression("r2", ts + 60_000), partition=1)
    engine.feed(_impression("r2b", ts + 61_000), partition=1)
    engine.feed(b"{not json", partition=0)
    stats = DaemonStats(results_produced=7)
    stats.set_lag({("imp", 0): 3, ("fb", 0): 4})
    got = sample(engine, stats, T0 + 600)
    assert (got.consumed, got.rejected, got.pending, got.results, got.lag) == (5, 1, 4, 7, 7)
    marks = [m for m in engine.watermarks().values() if m is not None]
    assert len(marks) == 2 and got.watermark_ms == min(marks)
    assert sample(None, stats, T0).consumed == 0  # between sessions there is no engine


def test_reporter_logs_one_line_per_report_with_structured_fields() -> None:
    clock = SettableClock()
    clock.now = T0
    engine = Engine(load_config())
    stats = DaemonStats()
    out = io.StringIO()
    logger = logging.getLogger("evald.test.status")
    handler = logging.StreamHandler(out)
    from evald.daemon.logs import JsonFormatter

    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        reporter = StatusReporter(
            lambda: engine, stats, threading.Lock(), 60.0, clock=clock, logger=logger
        )
        assert reporter.report() is None  # the first sample only sets the baseline
        for i in range(120):
            engine.feed(_impression(f"r{i}", int(T0 * 1000)))
        clock.now += 60
        fields = reporter.report()
    finally:
        logger.removeHandler(handler)
    assert fields is not None and fields["consumed_per_s"] == 2.0
    (line,) = out.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["message"].startswith("status: consumed 2/s")
    assert doc["status"]["pending"] == 120 and doc["level"] == "INFO"
    assert doc["time"].endswith("Z")


def test_text_log_times_are_iso_utc_and_event_times_readable() -> None:
    out = io.StringIO()
    setup_logging("INFO", "text", out)
    try:
        logging.getLogger("evald.test").info("hello %d", 5)
    finally:
        setup_logging("WARNING", "text", sys.stderr)
    line = out.getvalue().strip()
    stamp, rest = line.split(" ", 1)
    assert rest == "INFO evald.test: hello 5"
    assert len(stamp) == len("2026-11-24T02:47:26.123Z") and stamp[10] == "T" and stamp[-1] == "Z"
    assert event_time(1_767_225_900_000) == "2026-01-01T00:05:00.000Z"
    assert event_time(None) == "none"


def test_run_logs_status_lines_as_json_while_the_broker_is_away(tmp_path: Path) -> None:
    """The real process: every stderr line is JSON, status lines come at the interval even
    before a broker answers (so silence means stuck), SIGTERM exits 0."""
    with socket.socket() as sock:  # a port nothing listens on: the broker is away
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            [*RUN, "--bootstrap-servers", f"127.0.0.1:{port}", "--status-interval", "200ms"],
            cwd=ROOT,
            # the broker never answers, so shutdown ends at this timeout: keep it short
            env={**os.environ, "PYTHONUNBUFFERED": "1", "EVALD_DAEMON__SHUTDOWN_TIMEOUT_S": "2"},
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=die_with_parent,
        )
    try:
        deadline = time.monotonic() + 60
        statuses: list[dict[str, object]] = []
        while time.monotonic() < deadline and len(statuses) < 2:
            lines = [line for line in err_path.read_text().splitlines() if line.strip()]
            statuses = [doc for doc in map(json.loads, lines) if "status" in doc]
            time.sleep(0.1)
        assert len(statuses) >= 2, err_path.read_text()
        first = statuses[0]
        assert str(first["message"]).startswith("status (not ready: "), first
        assert "consumed 0/s" in str(first["message"])
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        status_code = proc.wait(60)
    assert status_code == 0, err_path.read_text()
    for line in err_path.read_text().splitlines():
        if line.strip():
            json.loads(line)  # nothing but JSON lines, tracebacks included


@pytest.mark.kafka
def test_a_running_daemon_logs_its_progress_and_evald_top_reads_it(
    broker: Broker, kafka_tools: KafkaTools, unique: str, tmp_path: Path
) -> None:
    """Real broker, real `evald produce`, `evald run` and `evald top --once`."""
    imp, fb = f"simp-{unique}", f"sfb-{unique}"
    kafka_tools.create({imp: 2, fb: 2})
    traffic = ["--feedback-topic", fb, "--events", "20000", "--speed", "600", "--clean"]
    # 66 event minutes at 600x: started two hours back, so that the broker takes them all at
    # once (it refuses timestamps more than an hour ahead of its clock; produce would wait)
    traffic += ["--start", str(int(time.time() * 1000) - 2 * 3_600_000)]
    produced = subprocess.run(
        [*PRODUCE, "--bootstrap-servers", broker.bootstrap, "--impressions-topic", imp, *traffic],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert produced.returncode == 0, produced.stderr
    log_path = tmp_path / "run.log"
    flags = ["--impressions-topic", imp, "--feedback-topic", fb, "--group-id", f"g-{unique}"]
    flags += ["--results-topic", f"sres-{unique}", "--dlq-topic", f"sdlq-{unique}"]
    flags += ["--set", "engine.window=5m", "--set", "engine.lateness=1m"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*RUN, "--bootstrap-servers", broker.bootstrap, "--status-interval", "300ms", *flags],
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if not k.startswith("EVALD_")},
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent,
        )
    try:
        found = _wait(
            lambda: re.search(r"on (http://127\.0\.0\.1:\d+)", log_path.read_text()), "URL"
        )
        url = found.group(1)  # type: ignore[attr-defined]

        def scored() -> bool:
            top = subprocess.run(
                [sys.executable, "-m", "evald", "top", str(url), "--once", "--interval", "0.5"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            lines = top.stdout.splitlines()
            return top.returncode == 0 and any(
                line.startswith("nDCG@10") and "±" in line for line in lines
            )

        _wait(scored, "evald top to show intervals")
        top = subprocess.run(
            [sys.executable, "-m", "evald", "top", str(url), "--once", "--interval", "0.5"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        screen = top.stdout
        assert "treatment−control" in screen and "results " in screen, screen
        assert "consumer lag" in screen and "· ready ·" in screen, screen
        assert max(len(line) for line in screen.splitlines()) <= 80
        _wait(lambda: "status: consumed" in log_path.read_text(), "a ready status line")
        statuses = [line for line in log_path.read_text().splitlines() if "status" in line]
        assert any(json.loads(line)["status"]["consumed_per_s"] > 0 for line in statuses)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]


def _wait(check: Callable[[], object], what: str, timeout: float = 120) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
