"""Slow clients (slowloris) against the real `evald demo` process: /metrics keeps answering
while as many half-sent requests are open as this test's file limit allows (about 20k), and
the server holds them with a bounded number of threads and sockets."""

from __future__ import annotations

import contextlib
import http.client
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from child_processes import announced_url, die_with_parent
from slow_clients import get, open_slow, proc_status, raise_own_fd_limit

from evald.http import Limits


def _wait(probe, what: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, http.client.HTTPException):
            value = probe()
            if value:
                return value
        time.sleep(0.1)
    raise TimeoutError(f"{what} not within {timeout}s")


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """`evald demo` on a free loopback port: (pid, port); stopped by PID at teardown."""
    log = (tmp_path / "demo.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "evald", "demo", "--no-live", "--metrics-address", "127.0.0.1:0",
         "--duration", "600", "--rate", "200"],
        stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
    )  # fmt: skip
    try:
        url = _wait(lambda: announced_url((tmp_path / "demo.log").read_text()), "demo URL")
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        _wait(lambda: get(port, "/healthz")[0] == 200, "demo /healthz")
        yield proc.pid, port
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_metrics_answers_under_many_slow_connections(demo: tuple[int, int]) -> None:
    pid, port = demo
    limit = raise_own_fd_limit()
    count = min(20_000, limit - 200)
    socks = open_slow(port, count)
    try:
        for path in ("/metrics", "/healthz", "/readyz"):
            status, body = get(port, path)
            assert status == 200, (path, body[:200])
        threads, files = proc_status(pid)
        # one loop thread, two workers, the demo's own threads: not one per connection
        assert threads < 32, threads
        assert files <= Limits().max_connections + 64, files
        # a second round of slow clients, then the endpoint is still there
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.send(b"x")
        assert get(port, "/metrics")[0] == 200
    finally:
        for sock in socks:
            sock.close()
