"""How `evald top` talks to an evald's endpoint: the basic auth and TLS of its options on every
request (``/metrics`` and ``/queries``), and each failure turned into a message that says what
to do.

The password never comes from the command line (it would land in shell history and ``ps``):
it is read from the first line of ``--password-file``, from ``EVALD_TOP_PASSWORD`` or, on a
terminal, prompted for. Redirects are not followed, so the credentials go only to the URL given;
sending them over plain http:// to another host than this one is warned about. See
docs/security.md.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import http.client
import ipaddress
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["PASSWORD_ENV", "Client", "Refused", "Unreachable", "add_arguments", "from_args"]

PASSWORD_ENV = "EVALD_TOP_PASSWORD"


class Unreachable(OSError):
    """Nothing answered at the URL (refused, unknown host, timeout), as opposed to an answer
    that was not the metrics."""


class Refused(OSError):
    """An answer no retry changes (credentials refused or missing, a certificate not trusted, a
    client certificate wanted): `evald top` stops on it instead of retrying forever."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--user",
        metavar="NAME",
        help=f"basic auth user; the password is read from --password-file, ${PASSWORD_ENV} "
        "or, on a terminal, prompted for (never an option: it would show in ps and the shell's "
        "history)",
    )
    parser.add_argument(
        "--password-file",
        metavar="PATH",
        help=f"--user's password: the file's first line (a mounted secret; before ${PASSWORD_ENV})",
    )
    parser.add_argument(
        "--ca-file",
        metavar="PATH",
        help="CA certificate(s), PEM, that signed the endpoint's TLS certificate (a private CA); "
        "a URL without a scheme is then https (default: the system's CAs, for https:// URLs)",
    )
    parser.add_argument(
        "--cert-file",
        metavar="PATH",
        help="client certificate, PEM, for an endpoint whose web config verifies clients "
        "(client_auth_type); with --key-file",
    )
    parser.add_argument("--key-file", metavar="PATH", help="the client certificate's key, PEM")


def wants_tls(args: argparse.Namespace) -> bool:
    """Whether the options only make sense over TLS (a URL without a scheme is then https)."""
    return bool(args.ca_file or args.cert_file)


def from_args(
    args: argparse.Namespace,
    url: str,
    *,
    environ: Mapping[str, str] = os.environ,
    tty: Callable[[], bool] | None = None,
    prompt: Callable[[str], str] | None = None,
    warn: Callable[[str], None] | None = None,
    timeout: float = 5.0,
) -> Client:
    """The client for ``url``; ``ValueError`` (exit 2) names the option or variable at fault.
    ``tty`` (default: whether stdin is a terminal) says whether a prompt can be answered;
    ``warn`` (default: a line on stderr) gets what is allowed but unsafe."""
    say = warn if warn is not None else _warn
    if url.startswith("http://") and wants_tls(args):
        option = "--ca-file" if args.ca_file else "--cert-file"
        raise ValueError(f"{option} is for TLS: use an https:// URL (or HOST:PORT)")
    if bool(args.cert_file) != bool(args.key_file):
        raise ValueError("--cert-file and --key-file go together")
    if args.password_file is not None and args.user is None:
        raise ValueError("--password-file is --user's password: pass --user NAME too")
    auth = None
    if args.user is not None:
        if not args.user or ":" in args.user:
            raise ValueError("--user: a name, non-empty and without ':'")
        host = urllib.parse.urlsplit(url).hostname or ""
        if url.startswith("http://") and not _loopback(host):
            # warned before the password is typed, so that it need not be
            say(
                f"warning: --user {args.user}'s password goes to {host} over plain http://, "
                "readable on the way: serve TLS and use https:// (docs/security.md)"
            )
        is_tty = tty if tty is not None else (lambda: sys.stdin is not None and sys.stdin.isatty())
        ask = prompt if prompt is not None else getpass.getpass
        if args.password_file is not None:
            auth = (args.user, _password_file(args.password_file, say))
        else:
            auth = (args.user, _password(args.user, url, environ, is_tty, ask))
    context = _context(args) if url.startswith("https://") else None
    return Client(
        auth=auth, context=context, ca_file=args.ca_file, cert_file=args.cert_file, timeout=timeout
    )


def _warn(text: str) -> None:
    print(f"evald top: {text}", file=sys.stderr)


def _loopback(host: str) -> bool:
    """Whether ``host`` is this machine by its address or by the name ``localhost`` (other names
    are not resolved: a name that is loopback here is warned about, harmlessly)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _password_file(path: str, warn: Callable[[str], None]) -> str:
    """The first line of ``path``, its line ending removed (a secret written with or without a
    final newline reads the same). Readable by everyone is warned about, not refused: Docker's
    secrets are mounted 0444 and Kubernetes' 0644 by default."""
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            first = fh.readline()
    except OSError as exc:
        raise ValueError(f"--password-file {path}: {exc.strerror or exc}") from None
    try:
        password = first.decode("utf-8").removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError:
        raise ValueError(f"--password-file {path}: its first line is not UTF-8 text") from None
    if not password:
        raise ValueError(f"--password-file {path}: its first line is empty")
    if mode & 0o004:
        warn(f"warning: --password-file {path} is readable by every user (chmod 600 it)")
    return password


def _password(
    user: str,
    url: str,
    environ: Mapping[str, str],
    tty: Callable[[], bool],
    prompt: Callable[[str], str],
) -> str:
    if PASSWORD_ENV in environ:
        return environ[PASSWORD_ENV]
    if not tty():
        raise ValueError(
            f"--user {user} needs a password: set {PASSWORD_ENV} (no terminal to prompt on)"
        )
    try:
        return prompt(f"password for {user} at {url.split('://', 1)[1].split('/', 1)[0]}: ")
    except (EOFError, KeyboardInterrupt):
        raise ValueError(f"no password typed for --user {user}") from None


def _context(args: argparse.Namespace) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=args.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"--ca-file {args.ca_file}: not a readable PEM certificate ({exc})"
        ) from None
    if args.cert_file:
        try:  # an encrypted key would make OpenSSL prompt; refuse it instead
            context.load_cert_chain(args.cert_file, args.key_file, password=lambda: b"")
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"--cert-file {args.cert_file} / --key-file {args.key_file}: not a PEM "
                f"certificate and its matching, unencrypted key ({exc})"
            ) from None
    return context


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect would carry the Authorization header to wherever it points."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@dataclass(frozen=True)
class Client:
    """GETs with the credentials and TLS context; errors are ``OSError`` fit for the screen
    (:class:`Refused` when retrying cannot help, :class:`Unreachable` when nothing answered)."""

    auth: tuple[str, str] | None = None
    context: ssl.SSLContext | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    timeout: float = 5.0

    def get(self, url: str, accept: str) -> bytes:
        headers = {"Accept": accept}
        if self.auth is not None:
            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=self.context), _NoRedirect
        )
        try:
            with opener.open(
                urllib.request.Request(url, headers=headers), timeout=self.timeout
            ) as r:
                return bytes(r.read())
        except urllib.error.HTTPError as exc:
            raise self._http_error(url, exc) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            # (an SSLError has a .reason too: a string, so only a URLError's is unwrapped)
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise self._transport_error(url, reason) from None

    def _http_error(self, url: str, exc: urllib.error.HTTPError) -> OSError:
        if exc.code == 401 and self.auth is not None:
            return Refused(
                f"{url} refused the credentials of user {self.auth[0]!r} (HTTP 401): check "
                f"--user and the password (${PASSWORD_ENV}, or the one typed at the prompt)"
            )
        if exc.code == 401:
            return Refused(
                f"{url} answered HTTP 401: it asks for basic auth (daemon.web_config_file, "
                f"docs/security.md): pass --user NAME, with the password in ${PASSWORD_ENV} "
                "or typed at the prompt"
            )
        detail = exc.read().decode("utf-8", "replace")[:200].strip()
        return OSError(f"{url} answered HTTP {exc.code}" + (f": {detail}" if detail else ""))

    def _transport_error(self, url: str, reason: object) -> OSError:
        if isinstance(reason, ssl.SSLCertVerificationError):
            return Refused(f"{url}: {self._untrusted(reason)}")
        text = str(reason)
        if isinstance(reason, ssl.SSLError) and "CERTIFICATE_REQUIRED" in text.upper():
            return Refused(
                f"{url}: the server asks for a client certificate ({text}): pass --cert-file "
                "and --key-file"
            )
        hung_up = isinstance(reason, ssl.SSLEOFError)
        if hung_up or (isinstance(reason, ssl.SSLError) and "ALERT" in text.upper()):
            # evald's server hangs up on a refused client certificate, often before its alert
            # arrives; a hang-up alone may also be a restart, so only an alert is Refused
            kind = OSError if hung_up else Refused
            if self.cert_file:
                return kind(
                    f"{url}: the server ended the TLS handshake ({text}): it may refuse the "
                    f"client certificate --cert-file {self.cert_file}: is it signed by the web "
                    "config's client_ca_file, and does it name one of client_allowed_sans?"
                )
            return kind(
                f"{url}: the server ended the TLS handshake ({text}): does it want a client "
                "certificate (--cert-file and --key-file)?"
            )
        if isinstance(reason, ssl.SSLError) and "WRONG_VERSION_NUMBER" in text.upper():
            return Refused(f"{url}: the server does not speak TLS ({text}): use http://")
        text = text or type(reason).__name__
        if url.startswith("https://") and "handshake operation timed out" in text:
            # evald's plain-HTTP server waits for a request line, never answering a TLS hello
            return OSError(
                f"{url}: the TLS handshake timed out: if it serves plain HTTP, use http://"
            )
        if url.startswith("http://") and isinstance(
            reason, (ConnectionResetError, http.client.HTTPException)
        ):  # something listens there, but hung up on plain HTTP
            return OSError(
                f"{url}: the connection was closed ({text}): if it serves TLS, use an https:// "
                "URL, or --ca-file with HOST:PORT"
            )
        return Unreachable(f"cannot reach {url}: {text}")

    def _untrusted(self, error: ssl.SSLCertVerificationError) -> str:
        why = error.verify_message or str(error)
        if error.verify_code in (62, 64):  # X509_V_ERR_HOSTNAME_MISMATCH, _IP_ADDRESS_MISMATCH
            return (
                f"the server's TLS certificate is not for this address ({why}): use a host "
                "name or IP address its subjectAltName holds"
            )
        if self.ca_file:
            return (
                f"the server's TLS certificate is not trusted ({why}): it is not signed by the "
                f"CA in --ca-file {self.ca_file} (pass the CA that signed the cert_file of the "
                "evald's web config)"
            )
        return (
            f"the server's TLS certificate is not trusted ({why}): if a private CA signed it, "
            "pass that CA's certificate with --ca-file PATH"
        )
