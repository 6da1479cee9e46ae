"""/healthz latency of a real `evald demo` with basic auth, under clients that keep it busy.

The demo serves with a web config whose user has a bcrypt hash of cost 10 (what
`htpasswd -nBC 10` writes, as in docs/security.md). A prober process GETs /healthz every 100 ms
and records each latency (a kubelet's liveness probe gives up after 3 s in deploy/); meanwhile
a load process keeps one of these going:

* ``idle``: nothing else (the baseline of this run);
* ``wrong``: 50 clients, each sending GET /metrics with the same wrong password, in a loop;
* ``guessing``: 50 clients sending a new wrong password every time (nothing to remember);
* ``scrapers``: 200 clients scraping /metrics with the right password, in a loop.

``--baseline-ref REF`` measures the same with evald/ of another git commit (the server before
the probes got their own thread), in the same run. The load generator and the prober are
separate processes, so the load's own threads do not delay the prober's clock.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import _common as c

USER, PASSWORD = "prometheus", "change-me"
LOADS = {"idle": 0, "wrong": 50, "guessing": 50, "scrapers": 200}
PROBE_TIMEOUT_S = 30.0
LIVENESS_TIMEOUT_S = 3.0


def get(port: int, path: str, password: str | None, timeout: float) -> int:
    """One GET on a fresh connection; the status (0 for no answer in time)."""
    auth = ""
    if password is not None:
        token = base64.b64encode(f"{USER}:{password}".encode()).decode()
        auth = f"Authorization: Basic {token}\r\n"
    head = f"GET {path} HTTP/1.1\r\nHost: evald\r\n{auth}Connection: close\r\n\r\n"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(head.encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return int(data.split(b" ", 2)[1]) if data else 0
    except (OSError, ValueError, IndexError):
        return 0


def load(port: int, kind: str, seconds: float) -> None:
    """The load process: LOADS[kind] client threads for ``seconds``."""
    stop = time.monotonic() + seconds
    counts: dict[int, int] = {}
    lock = threading.Lock()

    def client(number: int) -> None:
        attempt = 0
        while time.monotonic() < stop:
            attempt += 1
            password = {
                "wrong": "wrong-password",
                "guessing": f"guess-{number}-{attempt}",
                "scrapers": PASSWORD,
            }[kind]
            status = get(port, "/metrics", password, 60)
            with lock:
                counts[status] = counts.get(status, 0) + 1
            if status in (0, 503):
                time.sleep(0.05)  # a client backs off a little, as Prometheus' next scrape would

    threads = [threading.Thread(target=client, args=(i,)) for i in range(LOADS[kind])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({str(k): v for k, v in sorted(counts.items())}), flush=True)


def probe(port: int, seconds: float) -> list[float]:
    """/healthz every 100 ms for ``seconds``: each latency (PROBE_TIMEOUT_S when unanswered)."""
    times = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        status = get(port, "/healthz", None, PROBE_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        times.append(elapsed if status == 200 else PROBE_TIMEOUT_S)
        time.sleep(max(0.0, 0.1 - elapsed))
    return times


def web_config(directory: Path) -> Path:
    import bcrypt

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    path = directory / "web.yml"
    path.write_text(f"basic_auth_users:\n  {USER}: {hashed}\n")
    return path


def measure(source: str | None, web: Path, seconds: float) -> dict[str, list[float]]:
    """Every load against one demo (of this tree, or of ``source``): /healthz latencies."""
    port = c.free_port()
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = source
    demo = subprocess.Popen(
        [sys.executable, "-m", "evald", "demo", "--no-live", "--rate", "500", "--duration",
         "3600", "--metrics-address", f"127.0.0.1:{port}", "--web-config-file", str(web)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=source or c.REPO,
    )  # fmt: skip
    results = {}
    try:
        c.wait_port(port, 120)
        time.sleep(3)  # the demo's first windows
        for kind in LOADS:
            loader = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.probes_bench", "--load", kind, "--port",
                 str(port), "--seconds", str(seconds)],
                stdout=subprocess.PIPE, text=True, cwd=c.REPO,
            )  # fmt: skip
            time.sleep(1)  # the clients are connected and busy
            results[kind] = probe(port, seconds - 2)
            out, _ = loader.communicate(timeout=seconds + 120)
            results[kind + " answers"] = json.loads(out or "{}")
    finally:
        c.stop_process(demo)
    return results


def report(label: str, results: dict[str, object]) -> None:
    for kind, clients in LOADS.items():
        times = results[kind]
        assert isinstance(times, list)
        late = sum(1 for t in times if t > LIVENESS_TIMEOUT_S)
        c.line(
            f"{label}: /healthz, {kind} ({clients} clients)",
            f"p50 {c.fmt_s(statistics.median(times))}  p99 {c.fmt_s(c.percentile(times, 99))}"
            f"  max {c.fmt_s(max(times))}  over 3 s: {late}/{len(times)}",
        )
        if clients:
            c.line(f"{label}: answers to the {kind} clients", str(results[kind + " answers"]))


def body(argv: Sequence[str] | None) -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seconds", type=float, default=30.0, help="per load")
        parser.add_argument("--baseline-ref", help="git commit to measure as the baseline")
        parser.add_argument("--load", choices=sorted(LOADS), help=argparse.SUPPRESS)
        parser.add_argument("--port", type=int, help=argparse.SUPPRESS)

    args = c.parse_args(__doc__ or "", argv, extra)
    if args.load:
        load(args.port, args.load, args.seconds)
        return
    seconds = 10.0 if args.quick else args.seconds
    with tempfile.TemporaryDirectory() as tmp:
        web = web_config(Path(tmp))
        report("this tree", measure(None, web, seconds))
        if args.baseline_ref:
            older = c.evald_at(args.baseline_ref, Path(tmp))
            report(args.baseline_ref, measure(older, web, seconds))


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if "--load" in args:  # the load process: no header
        with contextlib.suppress(KeyboardInterrupt):
            body(args)
        return 0
    return c.run_main("/healthz under wrong passwords and many scrapers", lambda: body(args))


if __name__ == "__main__":
    sys.exit(main())
