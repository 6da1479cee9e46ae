"""The validity dates read from PEM certificates equal those the openssl command prints."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from tls_support import Authority, _openssl, expired_server_cert, make_ca, openssl_dates

from evald.certificate_dates import CertificateDateError, read_validity


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_ca(tmp_path_factory.mktemp("ca"))


def _seconds(openssl_date: str) -> float:
    return float(ssl.cert_time_to_seconds(openssl_date))


def test_dates_equal_openssl_s(ca: Authority, tmp_path: Path) -> None:
    expired, _ = expired_server_cert(ca)
    # past 2049 a certificate writes its dates as GeneralizedTime, before as UTCTime
    _openssl(
        "req", "-x509", "-new", "-key", ca.server_key, "-out", tmp_path / "far.crt",
        "-days", "12000", "-subj", "/CN=far", cwd=tmp_path,
    )  # fmt: skip
    for cert in (ca.ca_cert, ca.server_cert, expired, tmp_path / "far.crt"):
        (validity,) = read_validity(cert.read_bytes())
        not_before, not_after = openssl_dates(cert)
        assert (validity.not_before, validity.not_after) == (
            _seconds(not_before),
            _seconds(not_after),
        ), cert
    assert (
        read_validity(expired.read_bytes())[0].not_after
        < read_validity(ca.server_cert.read_bytes())[0].not_before
    )


def test_a_chain_gives_every_certificate_in_file_order(ca: Authority) -> None:
    chain = ca.server_cert.read_bytes() + b"\n" + ca.ca_cert.read_bytes()
    leaf, root = read_validity(chain)
    assert leaf == read_validity(ca.server_cert.read_bytes())[0]
    assert root == read_validity(ca.ca_cert.read_bytes())[0]


@pytest.mark.parametrize(
    ("pem", "words"),
    [
        (b"", "no PEM certificate"),
        (b"-----BEGIN CERTIFICATE-----\nMII!\n-----END CERTIFICATE-----\n", "no PEM"),
        (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "not a DER"),
        (b"-----BEGIN CERTIFICATE-----\nMIIBIjAN\n-----END CERTIFICATE-----\n", "cut short"),
    ],
)
def test_what_is_not_a_certificate_says_so(pem: bytes, words: str) -> None:
    with pytest.raises(CertificateDateError, match=words):
        read_validity(pem)
