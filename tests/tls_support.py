"""A throw-away certificate authority for TLS tests, made with the `openssl` command line, and
a bcrypt-protected web config file in the Prometheus exporter format."""

from __future__ import annotations

import base64
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import yaml

USER = "prometheus"
PASSWORD = "s3cret-scrape"


@dataclass(frozen=True)
class Authority:
    """Paths of a CA and two leaf certificates it signed (server: localhost/127.0.0.1)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(
        ["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True, timeout=60
    )


def _leaf(directory: Path, name: str, subject: str, ext: str, days: int = 2) -> tuple[Path, Path]:
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.crt"
    extfile = directory / f"{name}.ext"
    extfile.write_text(ext + "\n")
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key, cwd=directory)
    _openssl("req", "-new", "-key", key, "-out", csr, "-subj", subject, cwd=directory)
    _openssl(
        "x509", "-req", "-in", csr, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", str(days), "-out", cert, "-extfile", extfile, cwd=directory,
    )  # fmt: skip
    return cert, key


def make_ca(directory: Path) -> Authority:
    """A fresh CA, a server certificate for localhost and 127.0.0.1, a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is needed to make test certificates")
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=directory)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=evald test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    server_cert, server_key = _leaf(
        directory,
        "server",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth",
    )
    client_cert, client_key = _leaf(
        directory,
        "client",
        "/CN=scraper",
        "subjectAltName=DNS:scraper.example\nextendedKeyUsage=clientAuth",
    )
    return Authority(directory / "ca.crt", server_cert, server_key, client_cert, client_key)


def expired_server_cert(ca: Authority) -> tuple[Path, Path]:
    """A server certificate the CA signed that expired a day ago (OpenSSL 3.0 can only write
    one whose notBefore is now, after its notAfter: -days -1)."""
    return _leaf(
        ca.ca_cert.parent,
        "expired",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth",
        days=-1,
    )


def server_cert_for(ca: Authority, name: str, san: str) -> tuple[Path, Path]:
    """Another server certificate the CA signed, naming only ``san`` (e.g. "DNS:evald.example")."""
    return _leaf(
        ca.ca_cert.parent, name, "/CN=evald", f"subjectAltName={san}\nextendedKeyUsage=serverAuth"
    )


def openssl_dates(cert: Path) -> tuple[str, str]:
    """notBefore and notAfter as the openssl command prints them ("Nov 26 15:49:46 2026 GMT")."""
    done = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-dates"],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    fields = dict(line.split("=", 1) for line in done.stdout.splitlines())
    return fields["notBefore"], fields["notAfter"]


def write_web_config(path: Path, ca: Authority, **tls: object) -> Path:
    """A web config with TLS (plus ``tls`` fields) and basic auth for USER/PASSWORD."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    config = {
        "tls_server_config": {
            "cert_file": str(ca.server_cert),
            "key_file": str(ca.server_key),
            **tls,
        },
        "basic_auth_users": {USER: hashed},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def basic(user: str, password: str) -> dict[str, str]:
    """An Authorization header."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}
