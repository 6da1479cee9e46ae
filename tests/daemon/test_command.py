"""`evald run`'s start-up, short of a broker: what it sets up before the loop runs, and a stop
while it waits for one."""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from child_processes import die_with_parent
from kafka import KafkaAdminClient
from kafka.errors import KafkaTimeoutError

from evald import cli
from evald.config import EngineConfig
from evald.daemon import command, kafka_compat
from evald.daemon.kafka_compat import StopEvent
from evald.daemon.main.comparisons import ComparisonReader
from evald.daemon.main.runner import Daemon
from evald.daemon.repartition.stage import Repartitioner
from evald.daemon.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
RUN = [sys.executable, "-m", "evald", "run", "--metrics-address", "127.0.0.1:0"]


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_start_up_objects_are_frozen_before_the_loop(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a full collection walked the ~100k objects of modules and settings each time: 0.2 s of
    # CPU in kafka_bench's quick drain (docs/performance.md); frozen, it skips them
    frozen_at_loop: list[int] = []

    def loop(self: object, main: object, timeout: float, beat: object) -> int:
        frozen_at_loop.append(gc.get_freeze_count())
        return 0

    monkeypatch.setattr(command._Stages, "run", loop)
    status = cli.main(
        ["run", "--bootstrap-servers", "127.0.0.1:9", "--metrics-address", "127.0.0.1:0"]
    )
    assert status == 0
    assert frozen_at_loop and frozen_at_loop[0] > 10_000


def _away() -> str:
    """HOST:PORT of a loopback port nothing listens on: a broker that is away."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_sigterm_while_bootstrapping_against_an_away_broker_ends_the_process(
    tmp_path: Path,
) -> None:
    """kafka-python bootstraps in its clients' constructors, for up to request_timeout_ms (30 s)
    with backoff sleeps of ~20 s: a SIGTERM there was acted on only when the bootstrap gave up
    or the shutdown watchdog (shutdown_timeout_s, 30 s) fired, 20-30 s later. The stop now ends
    the bootstrap. 15 s is a generous bound on a shared machine, not a speed claim."""
    log_path = tmp_path / "stderr.txt"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*RUN, "--bootstrap-servers", _away()],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=die_with_parent,
        )
    try:
        deadline = time.monotonic() + 60
        # the first connection attempt was refused: the first session's bootstrap is under way
        while "ECONNREFUSED" not in log_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()
            time.sleep(0.05)
        assert "ECONNREFUSED" in log_path.read_text()
        os.kill(proc.pid, signal.SIGTERM)
        status = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log_path.read_text()
    assert status == 0, text
    assert "stopping: the session ended on" in text and "did not finish within" not in text, text


def test_the_stop_ends_a_bootstrap_under_way_and_leaves_other_clients_alone() -> None:
    """In-process: an admin client bootstrapping against an away broker raises as soon as the
    stop is set, and so does one made after the stop (its bootstrap would begin after it: a
    stop between two constructors was missed); a client of the running session, made after
    ``running``, is not touched (a restore's reader must finish so the session commits)."""
    stop = StopEvent()
    away = _away()
    raised: list[BaseException] = []

    def admin() -> None:
        try:
            KafkaAdminClient(bootstrap_servers=[away], kafka_client=stop.client)
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=admin, daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(_bootstrapping(c) for c in stop._clients):
        time.sleep(0.01)
    assert any(_bootstrapping(c) for c in stop._clients)
    stop.set()
    worker.join(timeout=15)
    assert not worker.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], KafkaTimeoutError), raised
    late = threading.Thread(target=admin, daemon=True)  # made after the stop, still connecting
    late.start()
    late.join(timeout=15)
    assert not late.is_alive(), "a client made after the stop bootstrapped on"
    assert len(raised) == 2 and isinstance(raised[1], KafkaTimeoutError), raised
    stop.close_clients()

    running = StopEvent()
    running.running()
    kept = running.client(bootstrap_servers=[away])  # a client of the running session
    running.set()
    assert not kept._manager.closed
    running.close_clients()
    assert kept._manager.closed


def test_a_client_whose_close_hangs_holds_the_teardown_only_for_a_bounded_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A client's close joins its I/O thread with no time limit; one stuck in a host name
    lookup held the session's teardown for as long as the lookup took. The teardown now waits
    a bounded time, warns naming the client, and goes on (the other clients are closed)."""

    class Client:
        def __init__(self, hangs: bool) -> None:
            self.hangs, self.closed = hangs, threading.Event()

        def close(self) -> None:
            if self.hangs:
                release.wait()
            self.closed.set()

    release = threading.Event()
    made = iter([Client(hangs=True), Client(hangs=False)])
    monkeypatch.setattr(kafka_compat, "net_client", lambda **_: next(made))
    monkeypatch.setattr(kafka_compat, "CLOSE_WAIT_S", 0.2)
    stop = StopEvent()
    stuck = stop.client(client_id="evald", bootstrap_servers=["stuck.invalid:9092"])
    fine = stop.client(client_id="evald", bootstrap_servers=["fine.invalid:9092"])
    teardown = threading.Thread(target=stop.close_clients, daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="evald.daemon"):
            teardown.start()
            teardown.join(timeout=10)
        assert not teardown.is_alive(), "the teardown waited for a client that never closes"
        assert fine.closed.is_set() and not stuck.closed.is_set()
        warnings = [r.getMessage() for r in _daemon_records(caplog, logging.WARNING)]
        assert len(warnings) == 1 and "stuck.invalid:9092" in warnings[0], warnings
    finally:
        release.set()
    assert stuck.closed.wait(10)  # left to finish on its own


def _bootstrapping(client: Any) -> bool:
    future = client._manager._bootstrap_future
    return future is not None and not future.is_done


def test_failed_sessions_against_an_away_broker_leave_no_thread_behind() -> None:
    """kafka-python's admin client and consumer start their client's I/O thread before they
    bootstrap; one whose constructor raised (the broker away) was closed by nobody, so every
    failed session left one more thread, for as long as the outage lasted. Each session's
    clients are now closed when it ends, on a retry and on a stop during a bootstrap alike."""
    settings = load_settings(
        environ={},
        flags={
            "kafka": {"bootstrap_servers": [_away()], "request_timeout_ms": 1_000},
            "daemon": {"retry_backoff_initial_ms": 1, "retry_backoff_max_ms": 10},
        },
    )
    before = set(threading.enumerate())

    def new_threads() -> list[str]:
        return sorted(t.name for t in set(threading.enumerate()) - before if t.is_alive())

    left: list[list[str]] = []  # the threads left after each failed session
    stopper = threading.Thread(target=lambda: _stop_while_bootstrapping(daemon.stop, before))

    def retrying() -> None:  # the daemon's heartbeat, called after each failed session
        left.append(new_threads())
        if len(left) == 3:
            stopper.start()  # the 4th session is stopped while it bootstraps

    daemon = Daemon(
        settings, lambda _cb: pytest.fail("no session gets that far"), heartbeat=retrying
    )
    status = daemon.run()
    stopper.join(timeout=30)
    assert status == 0
    assert left == [[], [], []], left
    assert new_threads() == []


def _stop_while_bootstrapping(stop: Callable[[], None], before: set[threading.Thread]) -> None:
    """Call ``stop`` once a client's I/O thread runs (it starts just before the bootstrap)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(t.name.startswith("kafka-io") for t in set(threading.enumerate()) - before):
            break
        time.sleep(0.01)
    stop()


def test_the_statistics_reader_retrying_an_away_broker_leaves_no_thread_behind() -> None:
    """The statistics topic's reader outlives the sessions and retries on its own: a consumer
    whose constructor raised (the broker away) kept its I/O thread, one more per attempt. Each
    attempt's clients are now closed when it ends, and a stop ends a bootstrap under way."""
    reader = ComparisonReader(_away_settings(), EngineConfig(), ["nDCG@10"], 1)
    _retries_leave_no_thread(reader.start, lambda: reader.stop(timeout=10), "evald-statistics")


def test_the_repartition_stage_retrying_an_away_broker_leaves_no_thread_behind() -> None:
    """The repartition stage retries its sessions on a thread of its own, as the main stage:
    its admin client's constructor raising kept that client's I/O thread, one per attempt."""
    stage = Repartitioner(_away_settings())
    _retries_leave_no_thread(stage.start, lambda: stage.stop(timeout=10), "evald-repartition")


@pytest.mark.parametrize("which", ["statistics-reader", "repartition-stage"])
def test_a_stop_during_their_first_bootstrap_ends_the_background_loops_without_a_retry(
    which: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The reader and the stage, stopped while their first client bootstraps (for up to
    30 s), end at once and say they stop: before, they logged a failed session "retrying"."""
    settings = _away_settings(request_timeout_ms=30_000)
    before = set(threading.enumerate())
    if which == "statistics-reader":
        reader = ComparisonReader(settings, EngineConfig(), ["nDCG@10"], 1)
        start, stop, name = reader.start, lambda: reader.stop(timeout=10), "evald-statistics"
    else:
        stage = Repartitioner(settings)
        start, stop, name = stage.start, lambda: stage.stop(timeout=10), "evald-repartition"
    with caplog.at_level(logging.INFO, logger="evald.daemon"):
        start()
        _stop_while_bootstrapping(stop, before)
    assert name not in [t.name for t in threading.enumerate()], "not stopped within 10 s"
    said = [(r.levelname, r.getMessage()) for r in _daemon_records(caplog, logging.DEBUG)]
    assert not [m for level, m in said if level == "WARNING"], said
    assert any(level == "INFO" and "stopping" in m for level, m in said), said


def _daemon_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    """The records of evald's daemon loggers at ``level`` or above (not kafka-python's)."""
    return [
        r
        for r in caplog.records
        if r.levelno >= level and (r.name == "evald.daemon" or r.name.startswith("evald.daemon."))
    ]


def _away_settings(request_timeout_ms: int = 1_000) -> Any:
    return load_settings(
        environ={},
        flags={
            "kafka": {"bootstrap_servers": [_away()], "request_timeout_ms": request_timeout_ms},
            "daemon": {"retry_backoff_initial_ms": 1, "retry_backoff_max_ms": 10},
        },
    )


def _retries_leave_no_thread(start: Any, stop: Any, thread: str) -> None:
    """Start a loop that retries against a broker that is away, count the kafka-python threads
    at each of its first three "retrying" warnings, stop it: the count must not grow (it is
    logged while the failed attempt's own client is still open: one thread then, not one more
    each time), and the loop's thread and every client's are gone after the stop."""
    before = set(threading.enumerate())

    def io_threads() -> list[str]:
        return [t.name for t in set(threading.enumerate()) - before if t.name.startswith("kafka")]

    failures: list[int] = []

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.WARNING and "retrying" in record.getMessage():
                failures.append(len(io_threads()))

    handler = Count()
    logging.getLogger("evald.daemon").addHandler(handler)
    try:
        start()
        deadline = time.monotonic() + 30
        while len(failures) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop()
    finally:
        logging.getLogger("evald.daemon").removeHandler(handler)
    assert len(failures) >= 3, failures
    assert len(set(failures[:3])) == 1, failures
    assert thread not in [t.name for t in threading.enumerate()], "not stopped within 10 s"
    assert io_threads() == []
