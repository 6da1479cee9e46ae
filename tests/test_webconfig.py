"""The web config file (Prometheus exporter-toolkit format): every problem names its field;
bcrypt checks for basic auth."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import pytest
from prometheus_client.registry import CollectorRegistry
from tls_support import Authority, expired_server_cert, make_ca, openssl_dates, write_web_config

from evald.webconfig import BasicAuth, CertificateCollector, WebConfigError, load_web_config


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.mark.parametrize(
    ("tls", "field"),
    [
        ({"cert_file": "missing.crt"}, "tls_server_config.cert_file:"),
        ({"key_file": "missing.key"}, "tls_server_config.key_file:"),
        ({"client_auth_type": "Sometimes"}, "tls_server_config.client_auth_type:"),
        ({"client_auth_type": "RequireAnyClientCert"}, "tls_server_config.client_auth_type:"),
        ({"client_auth_type": "RequireAndVerifyClientCert"}, "tls_server_config.client_ca_file:"),
        ({"min_version": "TLS14"}, "tls_server_config.min_version:"),
        ({"min_version": "TLS13", "max_version": "TLS12"}, "tls_server_config.min_version:"),
        ({"cipher_suites": ["TLS_NOPE"]}, "tls_server_config.cipher_suites:"),
        ({"curve_preferences": ["X25519"]}, "tls_server_config.curve_preferences:"),
        ({"certfile": "x"}, "tls_server_config.certfile: unknown field"),
    ],
)
def test_a_bad_web_config_names_the_field(
    ca: Authority, tmp_path: Path, tls: dict[str, object], field: str
) -> None:
    path = write_web_config(tmp_path / "web.yml", ca, **tls)
    with pytest.raises(WebConfigError) as info:
        load_web_config(path)
    assert str(info.value).startswith(f"{path}: {field}"), str(info.value)


def test_a_key_that_does_not_match_the_certificate(ca: Authority, tmp_path: Path) -> None:
    path = write_web_config(tmp_path / "web.yml", ca, key_file=str(ca.client_key))
    with pytest.raises(WebConfigError, match=r"tls_server_config\.cert_file: .*pair"):
        load_web_config(path)


def test_users_need_bcrypt_hashes(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  alice: plaintext\n")
    with pytest.raises(WebConfigError, match=r"basic_auth_users: .*alice: not a bcrypt hash"):
        load_web_config(path)


def test_relative_paths_are_relative_to_the_file(ca: Authority) -> None:
    path = ca.ca_cert.parent / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    assert load_web_config(path).ssl_context is not None


def test_basic_auth_checks_hashes() -> None:
    import bcrypt

    auth = BasicAuth({"a": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()})
    assert auth.check("a", "pw") and auth.check("a", "pw")
    assert not auth.check("a", "PW")
    assert not auth.check("b", "pw")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        (b"tls_server_config: [\n", "not valid YAML"),
        (b"basic_auth_users:\n  caf\xe9: x\n", "not UTF-8 text"),
        (b"- a\n", "the top level must be a mapping"),
        (b"http_server_config:\n  headers:\n    Set-Cookie: a\n", "http_server_config.headers:"),
        (b"basic_auth_user: {}\n", "basic_auth_user: unknown field"),
    ],
)
def test_a_malformed_file_is_refused_with_the_reason(
    tmp_path: Path, text: bytes, complaint: str
) -> None:
    path = tmp_path / "web.yml"
    path.write_bytes(text)
    with pytest.raises(WebConfigError, match=complaint) as info:
        load_web_config(path)
    assert str(info.value).startswith(str(path))


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match="No such file"):
        load_web_config(tmp_path / "absent.yml")


def test_an_empty_file_means_plain_http_without_auth(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("")
    web = load_web_config(path)
    assert web.ssl_context is None and web.auth is None


def test_a_client_ca_without_client_verification_is_refused(ca: Authority, tmp_path: Path) -> None:
    path = write_web_config(tmp_path / "web.yml", ca, client_ca_file=str(ca.ca_cert))
    with pytest.raises(WebConfigError, match=r"tls_server_config\.client_auth_type:"):
        load_web_config(path)


def test_a_password_longer_than_bcrypt_takes_is_a_plain_mismatch() -> None:
    import bcrypt

    auth = BasicAuth({"a": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()})
    assert not auth.check("a", "x" * 100)


def test_an_expired_certificate_is_a_warning_naming_the_file_and_the_date(
    ca: Authority, tmp_path: Path
) -> None:
    cert, key = expired_server_cert(ca)
    path = write_web_config(tmp_path / "web.yml", ca, cert_file=str(cert), key_file=str(key))
    web = load_web_config(path)  # still loads: the daemon's work does not depend on it
    assert web.ssl_context is not None
    expiry = ssl.cert_time_to_seconds(openssl_dates(cert)[1])
    assert web.certificate_expiry == expiry
    (warning,) = web.warnings
    day = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expiry))
    assert warning.startswith(f"{path}: tls_server_config.cert_file: {cert}: expired on {day}")
    assert "renew it and restart evald" in warning


def test_validity_is_judged_by_the_injected_clock(ca: Authority, tmp_path: Path) -> None:
    path = write_web_config(tmp_path / "web.yml", ca)
    not_before, not_after = (ssl.cert_time_to_seconds(d) for d in openssl_dates(ca.server_cert))
    assert load_web_config(path, clock=lambda: not_before + 1).warnings == ()
    assert "expired on" in load_web_config(path, clock=lambda: not_after + 1).warnings[0]
    early = load_web_config(path, clock=lambda: not_before - 1).warnings[0]
    assert "not valid before" in early
    # the chain's earliest expiry: the CA's, when it ends first
    chain = tmp_path / "chain.crt"
    chain.write_bytes(ca.server_cert.read_bytes() + ca.ca_cert.read_bytes())
    with_chain = write_web_config(tmp_path / "chain.yml", ca, cert_file=str(chain))
    ca_expiry = ssl.cert_time_to_seconds(openssl_dates(ca.ca_cert)[1])
    assert load_web_config(with_chain).certificate_expiry == min(not_after, ca_expiry)


def test_the_expiry_is_exported_only_with_tls(ca: Authority, tmp_path: Path) -> None:
    web = load_web_config(write_web_config(tmp_path / "web.yml", ca))
    registry = CollectorRegistry()
    registry.register(CertificateCollector(web))
    name = "evald_tls_certificate_expiry_timestamp_seconds"
    assert web.certificate_expiry is not None
    assert registry.get_sample_value(name) == web.certificate_expiry
    plain = tmp_path / "plain.yml"
    plain.write_text("http_server_config: {headers: {X-Frame-Options: deny}}\n")
    registry = CollectorRegistry()
    registry.register(CertificateCollector(load_web_config(plain)))
    assert registry.get_sample_value(name) is None
