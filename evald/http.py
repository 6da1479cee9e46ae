"""The `/metrics`, `/healthz` and `/readyz` endpoints, served from a daemon thread.

One small ``ThreadingHTTPServer`` per process: scrapes must never wait on the event loop, and the
loop must never wait on a slow scraper. Health and readiness are plain callables supplied by the
command that owns the loop (``evald demo``, ``evald run``), so this module knows nothing about
Kafka or the engine.
"""

from __future__ import annotations

import gzip
import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import gzip_accepted
from prometheus_client.registry import CollectorRegistry

from evald.exposition import Encoder

__all__ = [
    "DEFAULT_ADDRESS",
    "AddressError",
    "Check",
    "CheckResult",
    "Heartbeat",
    "MetricsServer",
    "parse_address",
]

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1:9464"

CheckResult = bool | tuple[bool, str]
"""A check returns ``True``/``False``, or ``(ok, reason)`` to explain a failure in the body."""
Check = Callable[[], CheckResult]

_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:\[\]]*)):(?P<port>[^:]*)$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


class AddressError(ValueError):
    """A listen address that cannot be used; the message says what is wrong and what works."""


def parse_address(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` into ``(host, port)``.

    Accepted: ``:9464`` (all IPv4 interfaces), ``0.0.0.0:9464``, ``127.0.0.1:0`` (any free port),
    ``[::1]:9464``, ``[::]:9464``, ``localhost:9464``. IPv6 literals need brackets so the port is
    never ambiguous.
    """
    hint = "expected HOST:PORT such as 127.0.0.1:9464, :9464, 0.0.0.0:9464 or [::1]:9464"
    if not isinstance(text, str) or not text.strip():
        raise AddressError(f"empty listen address: {hint}")
    text = text.strip()
    match = _HOST_PORT.match(text)
    if match is None and text.count(":") > 1 and "[" not in text:
        raise AddressError(f"bad listen address {text!r}: IPv6 needs brackets, e.g. [::1]:9464")
    if match is None:
        raise AddressError(f"bad listen address {text!r}: {hint}")
    port_text = match["port"]
    if not port_text.isdigit() or not port_text.isascii():
        raise AddressError(f"bad port in listen address {text!r}: {port_text!r} is not a number")
    port = int(port_text)
    if port > 65535:
        raise AddressError(f"bad port in listen address {text!r}: {port} is above 65535")
    if match["v6"] is not None:
        try:
            host = str(ipaddress.IPv6Address(match["v6"]))
        except ValueError:
            raise AddressError(
                f"bad IPv6 address in listen address {text!r}: {match['v6']!r}"
            ) from None
        return host, port
    host = match["host"]
    if host == "":
        return "0.0.0.0", port
    try:
        return str(ipaddress.IPv4Address(host)), port
    except ValueError:
        pass
    if not _HOSTNAME.match(host) or host.replace(".", "").isdigit():
        raise AddressError(f"bad host in listen address {text!r}: {host!r}")
    return host, port


def _outcome(check: Check, what: str) -> tuple[bool, str]:
    """Run a health/readiness check; a check that raises counts as failing, never as a crash."""
    try:
        result = check()
        if isinstance(result, tuple):
            ok, reason = result
            return bool(ok), str(reason) if reason else ("ok" if ok else f"not {what}")
        return bool(result), "ok" if result else f"not {what}"
    except Exception as exc:  # a broken check must not take the endpoint down
        log.warning("%s check raised", what, exc_info=True)
        return False, f"{what} check failed: {type(exc).__name__}: {exc}"


class Heartbeat:
    """Liveness of a processing loop: the loop calls :meth:`beat`; ``/healthz`` calls the object.

    Healthy while the last beat is at most ``max_age`` seconds old (by the injected clock), so a
    loop that is stuck or dead turns ``/healthz`` red even though the HTTP thread still answers.
    """

    def __init__(self, max_age: float = 60.0, *, clock: Callable[[], float] = time.monotonic):
        if not max_age > 0:
            raise ValueError(f"max_age must be > 0 seconds, got {max_age!r}")
        self.max_age = float(max_age)
        self._clock = clock
        self._last = clock()
        self._stopped = False

    def beat(self) -> None:
        """Record that the loop is making progress."""
        self._last = self._clock()

    def stop(self) -> None:
        """The loop has ended on purpose: report unhealthy from now on."""
        self._stopped = True

    def __call__(self) -> tuple[bool, str]:
        if self._stopped:
            return False, "processing loop stopped"
        age = self._clock() - self._last
        if age > self.max_age:
            return False, f"processing loop silent for {age:.0f}s (limit {self.max_age:.0f}s)"
        return True, "ok"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Restarting the daemon must not fail on a port lingering in TIME_WAIT.
    allow_reuse_address = True
    # The default backlog of 5 makes a burst of scrapers wait a full SYN retransmit (1 s).
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type, owner: MetricsServer) -> None:
        self.owner = owner
        super().__init__(address, handler)

    def handle_error(self, request: object, client_address: object) -> None:
        # A scraper hanging up mid-response is routine; socketserver would print a traceback.
        log.debug("connection from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # A client that connects and never sends must not pin a thread forever.
    timeout = 30
    server_version = "evald"

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_POST(self) -> None:
        # The request body is never read: close the connection so it is not taken for the
        # next request on a kept-alive connection.
        self.close_connection = True
        self._reply(
            HTTPStatus.METHOD_NOT_ALLOWED,
            b"only GET and HEAD\n",
            head=False,
            extra=[("Allow", "GET, HEAD"), ("Connection", "close")],
        )

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _route(self, *, head: bool) -> None:
        owner = self.server.owner
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        if path == "/metrics":
            self._metrics(owner, url.query, head=head)
        elif path in ("/healthz", "/readyz"):
            what = "healthy" if path == "/healthz" else "ready"
            ok, reason = _outcome(owner.healthy if what == "healthy" else owner.ready, what)
            status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
            self._reply(status, reason.encode("utf-8", "replace") + b"\n", head=head)
        elif path == "/":
            body = b"evald: /metrics /healthz /readyz\n"
            self._reply(HTTPStatus.OK, body, head=head)
        else:
            self._reply(
                HTTPStatus.NOT_FOUND, b"not found: try /metrics /healthz /readyz\n", head=head
            )

    def _metrics(self, owner: MetricsServer, query: str, *, head: bool) -> None:
        names = parse_qs(query).get("name[]")
        try:
            body, content_type = owner.encoder.encode(
                owner.registry, self.headers.get("Accept"), names=names
            )
        except Exception:  # a failing collector is a 500 for this scrape, not a dead server
            log.exception("rendering /metrics failed")
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, b"metrics rendering failed\n", head=head)
            return
        extra: list[tuple[str, str]] = []
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body, compresslevel=1)
            extra.append(("Content-Encoding", "gzip"))
        self._reply(HTTPStatus.OK, body, head=head, content_type=content_type, extra=extra)

    def _reply(
        self,
        status: HTTPStatus,
        body: bytes,
        *,
        head: bool,
        content_type: str = "text/plain; charset=utf-8",
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in extra or ():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class MetricsServer:
    """Serve a private registry plus health and readiness checks on one address.

    ``start()`` binds (so a taken port fails loudly, in the caller's thread) and serves from a
    daemon thread; ``stop()`` shuts it down and joins the thread. Port 0 picks a free port,
    readable afterwards as :attr:`port`. Usable as a context manager.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        registry: CollectorRegistry | None = None,
        ready: Check = lambda: True,
        healthy: Check = lambda: True,
        *,
        encoder: Encoder | None = None,
    ) -> None:
        self.host, self._requested_port = parse_address(address)
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.ready = ready
        self.healthy = healthy
        self.encoder = encoder if encoder is not None else Encoder()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for); only valid after start()."""
        if self._httpd is None:
            raise RuntimeError("MetricsServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Base URL a local client can reach, e.g. ``http://127.0.0.1:9464``."""
        host = self.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> MetricsServer:
        with self._lock:
            if self._httpd is not None:
                return self
            server_cls = _Server
            try:
                family = _address_family(self.host, self._requested_port)
            except OSError as exc:
                raise AddressError(f"cannot resolve listen host {self.host!r}: {exc}") from exc
            if family == socket.AF_INET6:
                server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
            try:
                httpd = server_cls((self.host, self._requested_port), _Handler, self)
            except OSError as exc:
                where = f"{self.host}:{self._requested_port}"
                raise OSError(exc.errno, f"cannot listen on {where}: {exc.strerror}") from exc
            thread = threading.Thread(
                target=httpd.serve_forever,
                kwargs={"poll_interval": 0.1},
                name=f"evald-http-{httpd.server_address[1]}",
                daemon=True,
            )
            thread.start()
            self._httpd, self._thread = httpd, thread
            log.info("serving /metrics /healthz /readyz on %s", self.url)
            return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and release the port; safe to call twice."""
        with self._lock:
            httpd, thread = self._httpd, self._thread
            self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout)

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _address_family(host: str, port: int) -> socket.AddressFamily:
    """IPv4 or IPv6 for a literal or a resolvable host name."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        return infos[0][0]
