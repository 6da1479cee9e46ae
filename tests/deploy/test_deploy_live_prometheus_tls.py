"""A real Prometheus scrapes `evald demo` over TLS with basic auth, from a web config file in
the exporter-toolkit format: the target with the right password is up, a wrong password and
plain HTTP are down."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from deploy_support import free_port
from live_support import Process, http_get, query, wait_until
from tls_support import PASSWORD, USER, make_ca, write_web_config

pytestmark = pytest.mark.prometheus


def _announced_https(log: Path) -> str | None:
    match = re.search(r"serving (https://\S+)/metrics", log.read_text(errors="replace"))
    return match[1] if match else None


@pytest.fixture(scope="module")
def prometheus(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("prometheus-tls")
    ca = make_ca(tmp / "ca")
    web = write_web_config(tmp / "web.yml", ca)
    demo = Process(
        [sys.executable, "-m", "evald", "demo", "--no-live", "--duration", "300",
         "--metrics-address", "127.0.0.1:0", "--web-config-file", str(web)],
        tmp / "demo.log",
    )  # fmt: skip
    procs = [demo]
    try:
        base = wait_until(lambda: _announced_https(tmp / "demo.log"), 30, "evald demo https URL")
        target = base.removeprefix("https://")
        tls = {"ca_file": str(ca.ca_cert)}
        jobs = [
            ("tls-auth", "https", {"username": USER, "password": PASSWORD}),
            ("tls-wrong-password", "https", {"username": USER, "password": "wrong"}),
            ("plain-http", "http", {"username": USER, "password": PASSWORD}),
        ]
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": name,
                    "scheme": scheme,
                    "tls_config": tls,
                    "basic_auth": auth,
                    "static_configs": [{"targets": [target]}],
                }
                for name, scheme, auth in jobs
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        prom = Process(
            [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"],
            tmp / "prometheus.log",
        )  # fmt: skip
        procs.append(prom)
        prom_base = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_get(f"{prom_base}/-/ready")[0] == 200, 30, "prometheus ready")
        yield prom_base
    finally:
        for proc in reversed(procs):
            proc.stop()


def _up(base: str) -> dict[str, float] | None:
    got = {r["metric"]["job"]: float(r["value"][1]) for r in query(base, "up")}
    return got if len(got) == 3 else None


def test_prometheus_scrapes_evald_over_tls_with_basic_auth(prometheus: str) -> None:
    wait_until(lambda: _up(prometheus), 60, "three targets scraped")
    # the wrong-password and plain-HTTP jobs stay down; the right one comes up
    up = wait_until(
        lambda: (u := _up(prometheus)) and u["tls-auth"] == 1 and u, 60, "tls-auth target up"
    )
    assert up["tls-wrong-password"] == 0
    assert up["plain-http"] == 0
    samples = wait_until(
        lambda: query(prometheus, 'evald_events_total{job="tls-auth"}'), 60, "evald series"
    )
    assert samples


def test_the_failing_targets_say_why(prometheus: str) -> None:
    def errors() -> dict[str, str] | None:
        _, body = http_get(f"{prometheus}/api/v1/targets")
        active = json.loads(body)["data"]["activeTargets"]
        got = {t["labels"]["job"]: t.get("lastError", "") for t in active}
        return got if all(got.get(j) for j in ("tls-wrong-password", "plain-http")) else None

    got = wait_until(errors, 60, "scrape errors reported")
    assert "401" in got["tls-wrong-password"]
