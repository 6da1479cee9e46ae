"""Processes for the live deployment tests: `evald demo` and a Prometheus server, each started
on a free loopback port, waited for with a deadline, and always stopped."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from child_processes import announced_url, die_with_parent
from deploy_support import DEPLOY, REPO, free_port

T = TypeVar("T")

SCRAPE_INTERVAL_S = 2  # the live Prometheus scrapes and evaluates rules this often


def http_get(url: str, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def wait_until(probe: Callable[[], T | None], timeout: float, what: str, step: float = 0.25) -> T:
    """Poll ``probe`` until it returns something truthy; fail (never hang) after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except (OSError, ValueError, http.client.HTTPException) as exc:
            last_error = exc
        time.sleep(step)
    raise TimeoutError(f"{what} not within {timeout}s (last error: {last_error})")


class Process:
    """A child process with its output in a log file, stopped gently then forcibly."""

    def __init__(self, argv: list[str], log: Path, cwd: Path = REPO) -> None:
        self.log = log
        self._fh = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            env={**os.environ},
            preexec_fn=die_with_parent,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        self._fh.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self, timeout: float = 15) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._fh.close()


def start_demo(
    tmp: Path, *, speed: float = 300.0, duration: float = 180.0, regress_at: float = 6.0
) -> tuple[Process, str]:
    """`evald demo` serving /metrics on a free loopback port; returns (process, base URL).
    The treatment arm's ranker degrades ``regress_at`` wall seconds after the start."""
    argv = [
        sys.executable,
        "-m",
        "evald",
        "demo",
        "--no-live",
        "--seed",
        "3",
        "--speed",
        str(speed),
        "--duration",
        str(duration),
        "--regress-at",
        str(regress_at),
        "--rate",
        "1000",
        "--metrics-address",
        "127.0.0.1:0",  # the demo binds a free port itself and says which: no race for it
    ]
    proc = Process(argv, tmp / "demo.log")

    def served() -> str | None:
        url = announced_url(proc.log.read_text(errors="replace"))
        return None if url is None else url.removesuffix("/metrics")

    try:
        base = wait_until(served, 30, "evald demo to say where it serves")
        wait_until(lambda: http_get(f"{base}/healthz")[0] == 200, 30, "evald demo /healthz")
    except BaseException:
        proc.stop()
        raise
    return proc, base


def prometheus_config(target: str) -> dict[str, Any]:
    """The compose scrape config, pointed at ``target`` with absolute rule paths."""
    config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    interval = f"{SCRAPE_INTERVAL_S}s"
    config["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
    config["rule_files"] = [str(DEPLOY / "prometheus" / p) for p in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    return config


def start_prometheus(binary: str, tmp: Path, target: str) -> tuple[Process, str]:
    """A Prometheus server on a free loopback port with its own config and data directory."""
    port = free_port()
    config_path = tmp / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(prometheus_config(target)))
    argv = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    proc = Process(argv, tmp / "prometheus.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_get(f"{base}/-/ready")[0] == 200, 30, "prometheus /-/ready")
    except BaseException:
        proc.stop()
        raise
    return proc, base


def query(base: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """Instant query (now, or at the Unix time ``at``); raises on a PromQL error."""
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode(params)
    status, body = http_get(url)
    data = json.loads(body)
    if status != 200 or data.get("status") != "success":
        raise AssertionError(f"query failed ({status}): {expr}\n{body[:500]}")
    return data["data"]["result"]
