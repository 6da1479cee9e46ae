"""Slow (slowloris) clients for the endpoint tests: many connections whose request head never
ends, and the /proc reading that shows the server holds them without a thread each."""

from __future__ import annotations

import contextlib
import http.client
import os
import resource
import socket
from pathlib import Path

TIMEOUT = 60  # a liveness bound: the old server left /metrics unanswered for minutes
PARTIAL = b"GET /metrics HTTP/1.1\r\nHost: evald\r\nX-Slow: "  # never finished


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def raise_own_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_slow(port: int, count: int) -> list[socket.socket]:
    """``count`` connections, each with a request head that never ends."""
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        socks.append(sock)
        if sock.connect_ex(("127.0.0.1", port)) == 0:
            with contextlib.suppress(OSError):
                sock.send(PARTIAL)
    return socks


def proc_status(pid: int) -> tuple[int, int]:
    """(threads, open files) of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(
        next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1]
    )
    return threads, len(os.listdir(f"/proc/{pid}/fd"))
