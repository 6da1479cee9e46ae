"""TLS and basic auth for the metrics endpoint, from a web config file in the format of the
Prometheus exporter toolkit (``--web.config.file`` of node_exporter and friends).

The file is read once at start; any problem raises :class:`WebConfigError` whose message names
the field (``tls_server_config.cert_file: ...``) so ``evald run``/``check-config`` exit 2 with it.
A certificate outside its validity dates is not refused (the daemon's work does not depend on
it) but warned about, and its expiry is exported (:class:`CertificateCollector`).
What Python's ``ssl`` cannot do (client certificates requested but not verified, curve lists)
is refused by name rather than silently weakened. See docs/security.md.
"""

from __future__ import annotations

import datetime
import hmac
import os
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evald.certificate_dates import CertificateDateError, read_validity
from evald.settings_file import SettingsFileError, read_settings_file

__all__ = [
    "BasicAuth",
    "CertificateCollector",
    "WebConfig",
    "WebConfigError",
    "load_web_config",
    "peer_allowed",
]


class WebConfigError(ValueError):
    """A web config file that cannot be used; the message names the file and the field."""


_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# Go's names (what exporter-toolkit accepts) -> OpenSSL's, for the TLS 1.2 suites Go offers.
# TLS 1.3 suites are not configurable, in Go or here.
_CIPHERS = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
}

# Response headers exporter-toolkit lets `http_server_config.headers` set.
_HEADERS = (
    "Content-Security-Policy",
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _TLS(_Strict):
    cert_file: str = Field(min_length=1)
    key_file: str = Field(min_length=1)
    client_auth_type: Literal[
        "NoClientCert",
        "RequestClientCert",
        "RequireAnyClientCert",
        "VerifyClientCertIfGiven",
        "RequireAndVerifyClientCert",
    ] = "NoClientCert"
    client_ca_file: str | None = None
    client_allowed_sans: list[str] | None = None
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"
    cipher_suites: list[str] | None = None
    prefer_server_cipher_suites: bool = True
    curve_preferences: list[str] | None = None

    @field_validator("client_auth_type")
    @classmethod
    def _verifiable(cls, value: str) -> str:
        if value in ("RequestClientCert", "RequireAnyClientCert"):
            raise ValueError(
                f"{value} (a client certificate that is not verified) is not supported: use "
                "VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file"
            )
        return value

    @field_validator("cipher_suites")
    @classmethod
    def _known_ciphers(cls, value: list[str] | None) -> list[str] | None:
        for name in value or ():
            if name not in _CIPHERS:
                raise ValueError(f"unknown cipher suite {name!r}; known: {', '.join(_CIPHERS)}")
        return value

    @field_validator("curve_preferences")
    @classmethod
    def _no_curves(cls, value: list[str] | None) -> list[str] | None:
        if value:
            raise ValueError("not supported (OpenSSL negotiates the curve); remove it")
        return value


class _HTTP(_Strict):
    http2: bool = (
        True  # accepted for compatibility: evald serves HTTP/1.1, which every scraper speaks
    )
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _allowed(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if name not in _HEADERS:
                raise ValueError(f"header {name!r} cannot be set; allowed: {', '.join(_HEADERS)}")
            if "\r" in text or "\n" in text:
                raise ValueError(f"header {name!r}: the value must be one line")
        return value


class _File(_Strict):
    tls_server_config: _TLS | None = None
    http_server_config: _HTTP = Field(default_factory=_HTTP)
    basic_auth_users: dict[str, str] | None = None

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for user, hashed in (value or {}).items():
            if not user or ":" in user:
                raise ValueError(f"user name {user!r} must be non-empty and without ':'")
            if not (len(hashed) == 60 and hashed[:4] in ("$2a$", "$2b$", "$2y$")):
                raise ValueError(
                    f"{user}: not a bcrypt hash (expected $2b$... of 60 characters, e.g. from "
                    "`htpasswd -nBC 10 USER`)"
                )
        return value


class BasicAuth:
    """Check ``user:password`` pairs against bcrypt hashes, remembering every outcome.

    bcrypt costs ~0.1-0.3 s by design; a scraper sends the same credentials every scrape, so
    an outcome is remembered (keyed by a salted digest, never the password): :meth:`lookup`
    answers from memory in microseconds, :meth:`verify` pays for bcrypt. Passes and failures
    are kept apart, so a flood of wrong passwords can evict only failures, never a scraper's
    pass. An unknown user costs one bcrypt check too, so timing does not reveal users.
    ``verify`` replaces ``bcrypt.checkpw`` (tests hold it to see what waits on it).
    """

    _PASSED = 256
    _FAILED = 4096

    def __init__(
        self, users: Mapping[str, str], *, verify: Callable[[bytes, bytes], bool] | None = None
    ) -> None:
        import bcrypt

        self._checkpw = verify if verify is not None else bcrypt.checkpw
        self._users = {user: hashed.encode() for user, hashed in users.items()}
        self._dummy = bcrypt.hashpw(b"evald", bcrypt.gensalt(10))
        self._salt = os.urandom(16)
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._failed: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def _key(self, user: str, password: str) -> bytes:
        hashed = self._users.get(user, b"")
        text = user.encode() + b"\0" + password.encode() + b"\0" + hashed
        return hmac.digest(self._salt, text, "sha256")

    def lookup(self, user: str, password: str) -> bool | None:
        """The remembered outcome for these credentials, or None if they were never checked."""
        key = self._key(user, password)
        with self._lock:
            for seen, outcome in ((self._passed, True), (self._failed, False)):
                if key in seen:
                    seen.move_to_end(key)
                    return outcome
        return None

    def verify(self, user: str, password: str) -> bool:
        """Check with bcrypt (slow by design) and remember the outcome."""
        hashed = self._users.get(user)
        try:
            ok = self._checkpw(password.encode(), hashed or self._dummy) and hashed is not None
        except ValueError:  # over bcrypt's 72 bytes: no stored hash can match it
            ok = False
        seen, size = (self._passed, self._PASSED) if ok else (self._failed, self._FAILED)
        with self._lock:
            seen[self._key(user, password)] = None
            while len(seen) > size:
                seen.popitem(last=False)
        return ok

    def check(self, user: str, password: str) -> bool:
        """True if ``password`` matches ``user``'s hash (remembered, or checked now)."""
        known = self.lookup(user, password)
        return self.verify(user, password) if known is None else known


@dataclass(frozen=True)
class WebConfig:
    """What the server needs: a TLS context (or None), the basic-auth checker (or None), and
    extra response headers; and what the file's certificate says about itself."""

    ssl_context: ssl.SSLContext | None = None
    auth: BasicAuth | None = None
    headers: tuple[tuple[str, str], ...] = ()
    allowed_sans: frozenset[str] = field(default_factory=frozenset)
    certificate_expiry: float | None = None
    """The earliest notAfter of ``cert_file``'s chain, epoch seconds (None without TLS)."""
    warnings: tuple[str, ...] = ()
    """Problems that do not stop the start (an expired certificate), each naming the file."""


class CertificateCollector:
    """``evald_tls_certificate_expiry_timestamp_seconds``, so an alert fires before scrapers
    start refusing the certificate (it is read once, at start: evald must be restarted)."""

    def __init__(self, web: WebConfig) -> None:
        self.expiry = web.certificate_expiry

    def describe(self) -> list[Metric]:
        return [Metric(_EXPIRY, _EXPIRY, "gauge")]

    def collect(self) -> Iterator[Metric]:
        if self.expiry is not None:
            yield GaugeMetricFamily(
                _EXPIRY,
                "When the metrics endpoint's TLS certificate (the earliest of its chain) expires, "
                "in seconds since the epoch.",
                value=self.expiry,
            )


_EXPIRY = "evald_tls_certificate_expiry_timestamp_seconds"


def load_web_config(
    path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
) -> WebConfig:
    """Read and check the file, loading certificates and keys now so a bad one fails at start;
    a certificate not valid at ``clock()`` is a warning (docs/security.md says why)."""
    where = os.fspath(path)
    try:
        data = read_settings_file(where)
    except SettingsFileError as exc:
        raise WebConfigError(str(exc)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise WebConfigError(f"{where}: the top level must be a mapping")
    try:
        parsed = _File.model_validate(data)
    except ValidationError as exc:
        raise WebConfigError(f"{where}: {_describe(exc)}") from None
    base = os.path.dirname(os.path.abspath(where))
    context = (
        _ssl_context(parsed.tls_server_config, base, where) if parsed.tls_server_config else None
    )
    tls = parsed.tls_server_config
    expiry: float | None = None
    warnings: tuple[str, ...] = ()
    if tls is not None:
        cert_file = (
            tls.cert_file if os.path.isabs(tls.cert_file) else os.path.join(base, tls.cert_file)
        )
        expiry, warnings = _certificate_dates(cert_file, where, clock())
    return WebConfig(
        ssl_context=context,
        auth=BasicAuth(parsed.basic_auth_users) if parsed.basic_auth_users else None,
        headers=tuple(parsed.http_server_config.headers.items()),
        allowed_sans=frozenset(tls.client_allowed_sans or ()) if tls else frozenset(),
        certificate_expiry=expiry,
        warnings=warnings,
    )


def _certificate_dates(
    cert_file: str, where: str, now: float
) -> tuple[float | None, tuple[str, ...]]:
    """The earliest expiry of the chain, and a warning if a certificate of it is not valid now."""
    field_name = f"{where}: tls_server_config.cert_file: {cert_file}"
    try:
        with open(cert_file, "rb") as handle:
            chain = read_validity(handle.read())
    except (OSError, CertificateDateError) as exc:  # OpenSSL loaded it: only our reading failed
        return None, (f"{field_name}: its validity dates cannot be read ({exc}); not exported",)
    expiry = min(cert.not_after for cert in chain)
    start = max(cert.not_before for cert in chain)
    if now > expiry:
        return expiry, (
            f"{field_name}: expired on {_utc(expiry)}: scrapers that verify it (Prometheus does) "
            "fail; renew it and restart evald",
        )
    if now < start:
        return expiry, (
            f"{field_name}: not valid before {_utc(start)} (is this clock right?): scrapers "
            "that verify it fail until then",
        )
    return expiry, ()


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        loc = ".".join(str(part) for part in item["loc"]) or "web config"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        lines.append(f"{loc}: {message}")
    return "; ".join(lines)


def _ssl_context(tls: _TLS, base: str, where: str) -> ssl.SSLContext:
    """A server context; relative paths are relative to the web config file, as in the toolkit."""

    def resolve(name: str) -> str:
        return name if os.path.isabs(name) else os.path.join(base, name)

    def fail(fieldname: str, why: Any) -> WebConfigError:
        return WebConfigError(f"{where}: tls_server_config.{fieldname}: {why}")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if _VERSIONS[tls.min_version] > _VERSIONS[tls.max_version]:
        raise fail("min_version", f"{tls.min_version} is above max_version {tls.max_version}")
    try:
        context.minimum_version = _VERSIONS[tls.min_version]
        context.maximum_version = _VERSIONS[tls.max_version]
    except (ValueError, ssl.SSLError) as exc:
        raise fail("min_version", f"not available in this OpenSSL: {exc}") from None
    for fieldname in ("cert_file", "key_file"):
        if not os.path.isfile(resolve(getattr(tls, fieldname))):
            raise fail(fieldname, f"{resolve(getattr(tls, fieldname))}: no such file")
    try:
        context.load_cert_chain(resolve(tls.cert_file), resolve(tls.key_file))
    except (ssl.SSLError, OSError) as exc:
        raise fail("cert_file", f"certificate and key do not load as a pair: {exc}") from None
    if tls.client_auth_type != "NoClientCert":
        if not tls.client_ca_file:
            raise fail("client_ca_file", f"required with client_auth_type {tls.client_auth_type}")
        try:
            context.load_verify_locations(cafile=resolve(tls.client_ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise fail("client_ca_file", exc) from None
        required = tls.client_auth_type == "RequireAndVerifyClientCert"
        context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    elif tls.client_ca_file or tls.client_allowed_sans:
        raise fail(
            "client_auth_type", "client_ca_file/client_allowed_sans need client verification"
        )
    if tls.cipher_suites:
        try:
            context.set_ciphers(":".join(_CIPHERS[name] for name in tls.cipher_suites))
        except ssl.SSLError as exc:
            raise fail("cipher_suites", exc) from None
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


def peer_allowed(peercert: Mapping[str, Any] | None, allowed: frozenset[str]) -> bool:
    """``client_allowed_sans``: the verified client certificate names one of them."""
    if not allowed:
        return True
    if not peercert:
        return False
    names = {
        value
        for kind, value in peercert.get("subjectAltName", ())
        if kind in ("DNS", "IP Address", "email", "URI")
    }
    return bool(names & allowed)
