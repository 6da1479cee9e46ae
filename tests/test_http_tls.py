"""TLS and basic auth on the metrics endpoint, with a real TLS client and a test CA."""

from __future__ import annotations

import contextlib
import http.client
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from child_processes import die_with_parent
from prometheus_client.parser import text_string_to_metric_families
from tls_support import (
    PASSWORD,
    USER,
    Authority,
    basic,
    expired_server_cert,
    make_ca,
    openssl_dates,
    write_web_config,
)

from evald.http import MetricsServer
from evald.webconfig import load_web_config

TIMEOUT = 10


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def tls_server(ca: Authority, tmp_path: Path) -> Iterator[MetricsServer]:
    web = load_web_config(write_web_config(tmp_path / "web.yml", ca))
    with MetricsServer("127.0.0.1:0", web=web) as server:
        yield server


def client_context(ca: Authority, *, cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.ca_cert))
    if cert:
        context.load_cert_chain(str(ca.client_cert), str(ca.client_key))
    return context


def get(
    port: int, path: str, context: ssl.SSLContext, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPSConnection("localhost", port, timeout=TIMEOUT, context=context)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_metrics_over_tls_with_the_right_password(tls_server: MetricsServer, ca: Authority) -> None:
    assert tls_server.url.startswith("https://127.0.0.1:")
    status, _, body = get(tls_server.port, "/metrics", client_context(ca), basic(USER, PASSWORD))
    assert status == 200
    assert body.startswith(b"# HELP") or body == b""


def test_wrong_or_missing_credentials_are_401(tls_server: MetricsServer, ca: Authority) -> None:
    context = client_context(ca)
    for headers in ({}, basic(USER, "wrong"), basic("nobody", PASSWORD), {"Authorization": "x"}):
        status, got, _ = get(tls_server.port, "/metrics", context, headers)
        assert status == 401, headers
        assert got["WWW-Authenticate"].startswith("Basic")
    # a wrong password right after a right one is still refused (only successes are cached)
    assert get(tls_server.port, "/metrics", context, basic(USER, PASSWORD))[0] == 200
    assert get(tls_server.port, "/metrics", context, basic(USER, PASSWORD + "x"))[0] == 401


def test_probes_answer_without_credentials(tls_server: MetricsServer, ca: Authority) -> None:
    for path in ("/healthz", "/readyz"):
        assert get(tls_server.port, path, client_context(ca))[0] == 200
    assert get(tls_server.port, "/", client_context(ca))[0] == 401


def test_plain_http_to_the_tls_port_gets_no_answer(
    tls_server: MetricsServer, ca: Authority
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", tls_server.port, timeout=TIMEOUT)
    try:
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            conn.request("GET", "/metrics")
            conn.getresponse()
    finally:
        conn.close()
    # and the server is still fine afterwards
    assert get(tls_server.port, "/healthz", client_context(ca))[0] == 200


def test_an_untrusting_client_refuses_the_server(tls_server: MetricsServer) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        get(tls_server.port, "/healthz", ssl.create_default_context())


def test_client_certificates_required_and_verified(ca: Authority, tmp_path: Path) -> None:
    path = write_web_config(
        tmp_path / "web.yml",
        ca,
        client_auth_type="RequireAndVerifyClientCert",
        client_ca_file=str(ca.ca_cert),
        client_allowed_sans=["scraper.example"],
    )
    with MetricsServer("127.0.0.1:0", web=load_web_config(path)) as server:
        ok = get(server.port, "/metrics", client_context(ca, cert=True), basic(USER, PASSWORD))
        assert ok[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(server.port, "/healthz", client_context(ca))


def test_client_allowed_sans_refuse_other_names(ca: Authority, tmp_path: Path) -> None:
    path = write_web_config(
        tmp_path / "web.yml",
        ca,
        client_auth_type="RequireAndVerifyClientCert",
        client_ca_file=str(ca.ca_cert),
        client_allowed_sans=["someone-else.example"],
    )
    with MetricsServer("127.0.0.1:0", web=load_web_config(path)) as server:  # noqa: SIM117
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            get(server.port, "/healthz", client_context(ca, cert=True))


def test_min_version_is_enforced(ca: Authority, tmp_path: Path) -> None:
    path = write_web_config(tmp_path / "web.yml", ca, min_version="TLS13")
    with MetricsServer("127.0.0.1:0", web=load_web_config(path)) as server:
        old = client_context(ca)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(server.port, "/healthz", old)
        assert get(server.port, "/healthz", client_context(ca))[0] == 200


def test_a_silent_client_does_not_block_the_handshake_of_others(
    tls_server: MetricsServer, ca: Authority
) -> None:
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=TIMEOUT):
        assert get(tls_server.port, "/healthz", client_context(ca))[0] == 200


def test_cipher_suites_and_headers(ca: Authority, tmp_path: Path) -> None:
    path = write_web_config(
        tmp_path / "web.yml",
        ca,
        max_version="TLS12",
        cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
    )
    text = path.read_text() + "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    path.write_text(text)
    with MetricsServer("127.0.0.1:0", web=load_web_config(path)) as server:
        conn = http.client.HTTPSConnection(
            "localhost", server.port, timeout=TIMEOUT, context=client_context(ca)
        )
        try:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            assert response.getheader("X-Frame-Options") == "deny"
            assert conn.sock.cipher()[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"
        finally:
            conn.close()


# --- through the real process -----------------------------------------------------------------


def test_demo_and_check_config_refuse_a_bad_web_config(ca: Authority, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n")
    done = subprocess.run(
        [sys.executable, "-m", "evald", "demo", "--metrics-address", "127.0.0.1:0",
         "--web-config-file", str(bad), "--duration", "5", "--no-live"],
        capture_output=True, text=True, timeout=60, preexec_fn=die_with_parent,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "tls_server_config.cert_file:" in done.stderr
    check = subprocess.run(
        [sys.executable, "-m", "evald", "check-config", "--web-config-file", str(bad)],
        capture_output=True, text=True, timeout=60, preexec_fn=die_with_parent,
    )  # fmt: skip
    assert check.returncode == 2
    assert "daemon.web_config_file:" in check.stderr and "cert_file:" in check.stderr


@contextlib.contextmanager
def tls_run(web: Path, log: Path) -> Iterator[tuple[int, Path]]:
    """`evald run --web-config-file web` (the broker is a closed port), its log in ``log``:
    yields the HTTPS port it announced and the log; stopped with SIGTERM (kill -9 past 60 s)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "evald", "run", "--bootstrap-servers", "127.0.0.1:1",
             "--metrics-address", "127.0.0.1:0", "--web-config-file", str(web),
             "--set", "daemon.shutdown_timeout_s=2"],
            stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        match = None
        while match is None and time.monotonic() < deadline and proc.poll() is None:
            match = re.search(r"on https://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
            time.sleep(0.1)
        assert match is not None, log.read_text(errors="replace")
        yield int(match[1]), log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_evald_run_serves_tls_with_basic_auth(ca: Authority, tmp_path: Path) -> None:
    """`evald run --web-config-file`: the endpoint is up (the broker is not: a closed port)."""
    web = write_web_config(tmp_path / "web.yml", ca)
    with tls_run(web, tmp_path / "run.log") as (port, _):
        assert get(port, "/metrics", client_context(ca), basic(USER, PASSWORD))[0] == 200
        assert get(port, "/metrics", client_context(ca), basic(USER, "nope"))[0] == 401
        assert get(port, "/healthz", client_context(ca))[0] == 200


def test_an_expired_certificate_is_warned_about_and_its_expiry_exported(
    ca: Authority, tmp_path: Path
) -> None:
    """It was accepted silently. `evald run` warns and serves (the results do not depend on
    the endpoint), exporting the expiry; `check-config` warns and exits 1."""
    cert, key = expired_server_cert(ca)
    web = write_web_config(tmp_path / "web.yml", ca, cert_file=str(cert), key_file=str(key))
    expiry = ssl.cert_time_to_seconds(openssl_dates(cert)[1])
    day = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expiry))
    warning = f"{web}: tls_server_config.cert_file: {cert}: expired on {day}"
    check = subprocess.run(
        [sys.executable, "-m", "evald", "check-config", "--web-config-file", str(web)],
        capture_output=True, text=True, timeout=60, preexec_fn=die_with_parent,
    )  # fmt: skip
    assert check.returncode == 1, check.stderr
    assert f"evald check-config: warning: daemon.web_config_file: {warning}" in check.stderr
    with tls_run(web, tmp_path / "run.log") as (port, log):
        assert f"daemon.web_config_file: {warning}" in log.read_text(errors="replace")
        trusting = ssl.create_default_context(cafile=str(ca.ca_cert))
        with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
            get(port, "/healthz", trusting)
        unverified = ssl._create_unverified_context()
        status, _, body = get(port, "/metrics", unverified, basic(USER, PASSWORD))
        assert status == 200
        samples = {
            sample.name: sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
        }
        assert samples.get("evald_tls_certificate_expiry_timestamp_seconds") == expiry, samples


def test_a_client_that_never_finishes_the_handshake_is_closed(
    ca: Authority, tmp_path: Path
) -> None:
    from evald.http import Limits

    web = load_web_config(write_web_config(tmp_path / "web.yml", ca))
    with (
        MetricsServer("127.0.0.1:0", web=web, limits=Limits(header_timeout_s=0.2)) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as conn,
    ):
        conn.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, then silence
        assert conn.recv(1024) == b""  # closed by the server, not by our timeout
