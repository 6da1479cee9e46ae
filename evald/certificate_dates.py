"""When the certificates of a PEM file are valid: each one's notBefore and notAfter.

Why here: Python's ``ssl`` loads a certificate chain without ever saying when it expires, and
evald depends on no crypto library. The two dates sit at a fixed place of every X.509
certificate (RFC 5280 §4.1: Certificate → TBSCertificate → [version], serialNumber, signature,
issuer, validity), so a few lines of DER reading find them.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import re
from dataclasses import dataclass

__all__ = ["CertificateDateError", "Validity", "read_validity"]

_PEM = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s*(?P<body>[A-Za-z0-9+/=\s]*?)\s*-----END CERTIFICATE-----"
)
_SEQUENCE, _VERSION, _UTC_TIME, _GENERALIZED_TIME = 0x30, 0xA0, 0x17, 0x18


class CertificateDateError(ValueError):
    """A certificate whose validity dates cannot be read."""


@dataclass(frozen=True)
class Validity:
    """One certificate's validity period, in seconds since the epoch (UTC)."""

    not_before: float
    not_after: float


def read_validity(pem: bytes) -> list[Validity]:
    """The validity of every certificate in ``pem`` (the leaf first, as in the file)."""
    found = []
    for match in _PEM.finditer(pem):
        try:
            der = base64.b64decode(b"".join(match["body"].split()), validate=True)
        except binascii.Error as exc:
            raise CertificateDateError(f"a certificate is not valid base64: {exc}") from None
        found.append(_validity(der))
    if not found:
        raise CertificateDateError("no PEM certificate (-----BEGIN CERTIFICATE-----) found")
    return found


def _validity(der: bytes) -> Validity:
    try:
        tag, start, _ = _element(der, 0)
        if tag != _SEQUENCE:
            raise CertificateDateError("not a DER certificate")
        tag, pos, _ = _element(der, start)  # TBSCertificate: read inside it
        if tag != _SEQUENCE:
            raise CertificateDateError("not a DER certificate")
        tag, _, end = _element(der, pos)
        if tag == _VERSION:  # [0] EXPLICIT version, absent in a v1 certificate
            pos = end
        for _field in ("serialNumber", "signature", "issuer"):
            _, _, pos = _element(der, pos)
        tag, pos, _ = _element(der, pos)
        if tag != _SEQUENCE:
            raise CertificateDateError("no validity where RFC 5280 puts it")
        not_before, pos = _time(der, pos)
        not_after, _ = _time(der, pos)
    except IndexError:
        raise CertificateDateError("a certificate is cut short") from None
    return Validity(not_before, not_after)


def _element(der: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of the content, end of the content) of the DER element at ``pos``."""
    tag, first = der[pos], der[pos + 1]
    if first < 0x80:
        return tag, pos + 2, pos + 2 + first
    size = first & 0x7F
    length = int.from_bytes(der[pos + 2 : pos + 2 + size], "big")
    start = pos + 2 + size
    if size == 0 or start + length > len(der):
        raise CertificateDateError("a certificate is cut short")
    return tag, start, start + length


def _time(der: bytes, pos: int) -> tuple[float, int]:
    """A UTCTime (two-digit year: 50-99 is 19xx, RFC 5280) or GeneralizedTime, both ``...Z``."""
    tag, start, end = _element(der, pos)
    text = der[start:end].decode("ascii", "replace")
    digits = {_UTC_TIME: 12, _GENERALIZED_TIME: 14}.get(tag)
    if digits is None or len(text) != digits + 1 or not text[:-1].isdigit() or text[-1] != "Z":
        raise CertificateDateError(f"a validity date is not a UTC time: {text!r}")
    if tag == _UTC_TIME:
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    fields = [int(text[i : i + 2]) for i in range(4, 14, 2)]
    return float(calendar.timegm((int(text[:4]), *fields, 0, 0, 0))), end
