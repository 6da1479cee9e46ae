"""`evald run` for the Kafka tests: the test settings and topic names, the daemon in-process
(:func:`running`) or as a child process (:class:`Instance`), stopped by PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from child_processes import die_with_parent
from kafka_harness import ENGINE, KafkaTools, served_port

from evald.daemon.crash import CRASH_ENV
from evald.daemon.main.runner import Daemon
from evald.daemon.settings import Settings, load_settings
from evald.engine import Engine

# a crashed owner's open transaction blocks read_committed readers and a new owner's offset fetch
# until the coordinator aborts it: ~10 s keeps the takeover tests short
KAFKA = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000, "transaction_timeout_ms": 10000}


def names(unique: str) -> dict[str, str]:
    return {
        "impressions": f"imp-{unique}",
        "feedback": f"fb-{unique}",
        "results": f"res-{unique}",
        "dlq": f"dlq-{unique}",
    }


def make_settings(
    bootstrap: str,
    unique: str,
    instance: str = "a",
    kafka: dict[str, Any] | None = None,
    **daemon: Any,
) -> Settings:
    return load_settings(
        environ={},
        flags={
            "kafka": {"bootstrap_servers": bootstrap, **KAFKA, **(kafka or {})},
            "topics": names(unique),
            "daemon": {
                "group_id": f"g-{unique}",
                "instance_id": instance,
                "commit_interval_ms": 300,
                "metrics_address": "127.0.0.1:0",
                "retry_backoff_initial_ms": 100,
                "retry_backoff_max_ms": 1000,
                **daemon,
            },
            "engine": ENGINE,
        },
    )


def run_argv(bootstrap: str, unique: str, metrics_address: str) -> list[str]:
    """`python -m evald run` on the test's topics and group."""
    topics = names(unique)
    return [
        sys.executable,
        "-m",
        "evald",
        "run",
        "--bootstrap-servers",
        bootstrap,
        "--impressions-topic",
        topics["impressions"],
        "--feedback-topic",
        topics["feedback"],
        "--results-topic",
        topics["results"],
        "--dlq-topic",
        topics["dlq"],
        "--group-id",
        f"g-{unique}",
        "--metrics-address",
        metrics_address,
    ]


def group_state(bootstrap: str, group: str) -> tuple[str, int]:
    """The group's state and how many members its coordinator lists."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described: dict[str, Any] = admin.describe_groups([group]).get(group) or {}
    finally:
        admin.close()
    return str(described.get("group_state")), len(described.get("members") or ())


def assignment(line: str) -> set[int] | None:
    """The partitions of an "assigned" line of the daemon's log; None for any other line."""
    if not line.rstrip().endswith("] assigned") or "partitions [" not in line:
        return None
    inside = line.split("partitions [", 1)[1].split("]", 1)[0]
    return {int(p) for p in inside.split(",") if p.strip()}


def run_to_exit(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`evald run` as a child; a daemon that keeps retrying instead of exiting fails the test."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("EVALD_")}
    try:
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"evald run kept retrying instead of exiting:\n{exc.stderr}")


@contextlib.contextmanager
def running(settings: Settings, **kwargs: Any) -> Iterator[Daemon]:
    """An in-process daemon on a thread, always stopped and joined."""
    config = settings.engine_config()
    daemon = Daemon(settings, lambda on_result: Engine(config, on_result=on_result), **kwargs)
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(daemon.run()), daemon=True)
    thread.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), "daemon did not stop within 60s"
    assert status == [0]


def settled(daemon: Daemon, tools: KafkaTools, unique: str) -> bool:
    """Every input record fed to the engine and everything finalized committed."""
    topics = names(unique)
    if not daemon.ready()[0]:
        return False
    ends = {
        kind: tools.end_offsets(topic)
        for kind, topic in (("impression", topics["impressions"]), ("feedback", topics["feedback"]))
    }
    with daemon.lock:  # a consistent view: not in the middle of a cycle or a rebalance
        for kind, offsets in ends.items():
            for p, end in offsets.items():
                part = daemon.inputs.parts.get(p)
                if part is None or not part.restored or part.fed_next.get(kind) != end:
                    return False
        return daemon.transaction.settled()


class Instance:
    """`python -m evald run` as a child process with its own /metrics port (bound to port 0,
    read from its log)."""

    def __init__(
        self,
        bootstrap: str,
        unique: str,
        instance: str,
        tmp_path: Path,
        static: bool = False,
        extra: tuple[str, ...] = (),
        crash_at: str | None = None,
    ) -> None:
        self._port: int | None = None
        self._bootstrap, self._group = bootstrap, f"g-{unique}"
        self.windows = tmp_path / f"windows-{instance}.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("EVALD_")}
        env.update(
            {
                "EVALD_KAFKA__SESSION_TIMEOUT_MS": str(KAFKA["session_timeout_ms"]),
                "EVALD_KAFKA__HEARTBEAT_INTERVAL_MS": str(KAFKA["heartbeat_interval_ms"]),
                "EVALD_KAFKA__TRANSACTION_TIMEOUT_MS": str(KAFKA["transaction_timeout_ms"]),
            }
        )
        env.pop(CRASH_ENV, None)
        if crash_at is not None:
            env[CRASH_ENV] = crash_at
        args = [
            *run_argv(bootstrap, unique, "127.0.0.1:0"),
            "--instance-id",
            instance,
            "--set",
            "daemon.commit_interval_ms=300",
            "--set",
            f"daemon.windows_file={self.windows}",
            "--set",
            "daemon.retry_backoff_max_ms=1000",
            "--set",
            "daemon.shutdown_timeout_s=20",
        ]
        if static:
            args += ["--set", "daemon.static_membership=true"]
        args += list(extra)
        for key, value in ENGINE.items():
            args += ["--set", f"engine.{key}={json.dumps(value)}"]
        self.log_path = tmp_path / f"{instance}.log"
        self.log = self.log_path.open("ab")
        self._log_start = self.log.tell()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            args, env=env, stdout=self.log, stderr=self.log, preexec_fn=die_with_parent
        )

    @property
    def port(self) -> int | None:
        """The bound /metrics port; None until the child has logged it."""
        if self._port is None:
            self.log.flush()
            self._port = served_port(self.log_path, self._log_start)
        return self._port

    def get(self, path: str, timeout: float = 2) -> tuple[int, str]:
        if self.port is None:
            return 0, ""
        try:
            url = f"http://127.0.0.1:{self.port}{path}"
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    def metric(self, name: str) -> float:
        """Sum of a series' samples on /metrics (0 when absent)."""
        status, text = self.get("/metrics")
        total = 0.0
        for line in text.splitlines() if status == 200 else []:
            if line.startswith(name) and line[len(name)] in " {":
                total += float(line.rsplit(" ", 1)[1])
        return total

    def lag_zero(self, partitions: int) -> bool:
        status, text = self.get("/metrics")
        if status != 200 or self.get("/readyz")[0] != 200:
            return False
        lags = [
            float(x.rsplit(" ", 1)[1])
            for x in text.splitlines()
            if x.startswith("evald_consumer_lag{")
        ]
        return len(lags) == 2 * partitions and sum(lags) == 0

    def owned(self) -> set[int] | None:
        """The input partitions this instance reports lag for while ready; None when not ready."""
        status, text = self.get("/metrics")
        if status != 200 or self.get("/readyz")[0] != 200:
            return None
        return {
            int(line.split('partition="', 1)[1].split('"', 1)[0])
            for line in text.splitlines()
            if line.startswith("evald_consumer_lag{")
        }

    def assigned(self) -> set[int]:
        """The partitions of the last assignment this process logged (its log survives a kill)."""
        self.log.flush()
        found: set[int] = set()
        for line in self.log_path.read_text(errors="replace").splitlines():
            partitions = assignment(line)
            if partitions is not None:
                found = partitions
        return found

    def alone(self, partitions: int) -> bool:
        """The only member of a settled group, its last rebalance gave it all ``partitions``,
        all restored since and caught up: what it holds now is everything. (Owning them all
        is not enough: a member that joined and died unseen, or one leaving, still moves them
        once more, and a process stopped in that rebalance holds only a part.)"""
        if group_state(self._bootstrap, self._group) != ("Stable", 1):
            return False
        self.log.flush()
        with self.log_path.open("rb") as f:
            f.seek(self._log_start)
            lines = f.read().decode(errors="replace").splitlines()
        marks = [i for i, x in enumerate(lines) if assignment(x) is not None]
        if not marks or assignment(lines[marks[-1]]) != set(range(partitions)):
            return False
        since = lines[marks[-1] + 1 :]
        if any(x.rstrip().endswith(("] revoked", "] lost")) for x in since):
            return False
        return any("partitions restored in" in x for x in since) and self.lag_zero(partitions)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 40) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()
