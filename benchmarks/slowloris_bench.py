"""Slow clients: `/metrics` latency of a real `evald demo` while ~20k slowloris connections
are open, against the same process with no load, in the same run.

The benchmark raises its own file limit and opens as many connections as it allows (up to
20k), each sending a request head it never finishes, then one more header byte to every socket
every few seconds from a drip thread while `/metrics` is scraped. Also reported: the server's
threads and open files under load, its CPU use while the slow clients are held, and the scrape
latency right after they leave. Issue 10 §6: the thread-per-connection server had 7,252 threads,
190% CPU and `/metrics` unanswered for ~6 minutes after the clients left.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks import _common as c

PARTIAL = b"GET /metrics HTTP/1.1\r\nHost: evald\r\nX-Slow: "
TICKS = os.sysconf("SC_CLK_TCK")


def scrape_times(url: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        status, _ = c.http_get(url, timeout=120)
        times.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
    return times


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def threads_and_files(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M)[1])  # type: ignore[index]
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def open_slow(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        socks.append(sock)
        if sock.connect_ex(("127.0.0.1", port)) == 0:
            with contextlib.suppress(OSError):
                sock.send(PARTIAL)
    return socks


def summary(times: Sequence[float]) -> str:
    return (
        f"median {c.fmt_s(statistics.median(times))}  p99 {c.fmt_s(c.percentile(times, 99))}"
        f"  max {c.fmt_s(max(times))}"
    )


def body(argv: Sequence[str] | None) -> int:
    """The demo under slow clients; returns how many it held."""
    args = c.parse_args(__doc__ or "", argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    count = min(2_000 if args.quick else 20_000, limit - 200)
    scrapes = 20 if args.quick else 50
    log = open(os.devnull, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        c.python_cmd("-m", "evald", "demo", "--no-live", "--rate", "500", "--duration", "900",
                     "--metrics-address", "127.0.0.1:0"),
        stdout=log, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    socks: list[socket.socket] = []
    try:
        assert proc.stderr is not None
        port = 0
        for row in proc.stderr:
            if match := re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics", row):
                port = int(match[1])
                break
        if not port:
            raise c.NotAvailable("evald demo did not say where it serves")
        # keep reading its log so a full pipe never blocks the demo
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        url = f"http://127.0.0.1:{port}/metrics"
        scrape_times(url, 5)  # warm the encoder's cache
        cpu0, w0 = cpu_seconds(proc.pid), time.perf_counter()
        idle = scrape_times(url, scrapes)
        idle_cpu = (cpu_seconds(proc.pid) - cpu0) / (time.perf_counter() - w0)
        c.line("baseline: GET /metrics, no other clients", summary(idle))
        c.line("baseline: CPU while scraped (1.0 = one core)", f"{idle_cpu:.2f}")

        t0 = time.perf_counter()
        socks = open_slow(port, count)
        c.line(f"opened {len(socks):,} slow connections", c.fmt_s(time.perf_counter() - t0))
        stop = threading.Event()

        def drip() -> None:
            while not stop.is_set():
                for sock in socks:
                    with contextlib.suppress(OSError):
                        sock.send(b"x")
                stop.wait(5)

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        cpu0, w0 = cpu_seconds(proc.pid), time.perf_counter()
        loaded = scrape_times(url, scrapes)
        threads, files = threads_and_files(proc.pid)
        cpu = (cpu_seconds(proc.pid) - cpu0) / (time.perf_counter() - w0)
        stop.set()
        dripper.join()
        c.line(f"evald: GET /metrics, {len(socks):,} slow connections open", summary(loaded))
        c.line("evald: threads / open files under load", f"{threads} / {files:,}")
        c.line("evald: CPU while held and scraped (1.0 = one core)", f"{cpu:.2f}")
        for sock in socks:
            sock.close()
        socks = []
        after = scrape_times(url, 5)
        c.line("evald: GET /metrics right after the clients left", summary(after))
        ratio = statistics.median(loaded) / statistics.median(idle)
        c.line("ratio loaded / no load (median)", f"{ratio:.2f}x")
        c.target(
            f"/metrics p99 with {len(socks) or count:,} slow connections",
            c.fmt_s(c.percentile(loaded, 99)),
            c.percentile(loaded, 99) < 1.0,
            "< 1 s",
        )
    finally:
        for sock in socks:
            sock.close()
        c.stop_process(proc)  # type: ignore[arg-type]
        log.close()
    return count


def worst_oversleep(stop: threading.Event, out: list[float]) -> None:
    """A stand-in for kafka-python's I/O thread: sleep 10 ms at a time and keep the worst
    lateness, i.e. how long another thread of the process kept it from running."""
    worst = 0.0
    while not stop.is_set():
        t0 = time.perf_counter()
        time.sleep(0.010)
        worst = max(worst, time.perf_counter() - t0 - 0.010)
    out.append(worst)


def stall_while(action: Callable[[], object]) -> float:
    stop, out = threading.Event(), []
    sleeper = threading.Thread(target=worst_oversleep, args=(stop, out))
    sleeper.start()
    try:
        action()
    finally:
        stop.set()
        sleeper.join()
    return out[0]


def stalls(count: int, quick: bool) -> None:
    """The server in this process, the slow clients in a child: how late a 10 ms sleeper
    thread runs, with and without them."""
    http_mod = c.require("evald.http", "MetricsServer", "Limits")
    server = http_mod.MetricsServer("127.0.0.1:0").start()  # type: ignore[attr-defined]
    try:
        hold = "3" if quick else "10"
        idle = stall_while(lambda: time.sleep(float(hold)))
        client = c.python_cmd("-m", "benchmarks.slowloris_bench", "client", str(server.port),
                              str(count), hold)  # fmt: skip
        loaded = stall_while(lambda: subprocess.run(client, check=True, timeout=600))
    finally:
        server.stop()
    c.line("baseline: worst lateness of a 10 ms sleeper thread", c.fmt_s(idle))
    c.line(f"evald: same, while {count:,} slow clients come and go", c.fmt_s(loaded))


def client(port: int, count: int, hold_s: float) -> None:
    """The slow clients, in their own process (and file limit): open, drip, hold, leave."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks = open_slow(port, count)
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.send(b"x")
        time.sleep(1)
    for sock in socks:
        sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["client"]:
        client(int(argv[1]), int(argv[2]), float(argv[3]))
        return 0

    def both() -> None:
        count = body(argv)
        stalls(count, "--quick" in argv)

    return c.run_main("Slow clients: /metrics under ~20k slowloris connections", both)


if __name__ == "__main__":
    sys.exit(main())
