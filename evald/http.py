"""The `/metrics`, `/healthz` and `/readyz` endpoints, served from a daemon thread.

One selector loop in its own thread holds every connection, with a cap and timeouts
(:class:`Limits`), so thousands of slow clients cost neither threads nor CPU (nor garbage for
the collector to pause the process over). Three kinds of work leave that thread, each to its own
threads, so none waits behind another: probes (one thread), renderings of ``/metrics`` (a small
pool) and bcrypt password checks (a pool with a bounded backlog; past it, 503 at once). Scrapes
never wait on the processing loop, and it never waits on a slow scraper. TLS and basic auth come
from a web config file (:mod:`evald.webconfig`).

Health and readiness are plain callables supplied by the command that owns the processing loop
(``evald demo``, ``evald run``), so this module knows nothing about Kafka or the engine.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import ipaddress
import json
import logging
import math
import queue
import re
import selectors
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import gzip_accepted
from prometheus_client.registry import CollectorRegistry

from evald.exposition import Encoder
from evald.webconfig import CertificateCollector, WebConfig, peer_allowed

__all__ = [
    "DEFAULT_ADDRESS",
    "AddressError",
    "Check",
    "CheckResult",
    "Heartbeat",
    "Limits",
    "MetricsServer",
    "parse_address",
    "raise_fd_limit",
]

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1:9464"

CheckResult = bool | tuple[bool, str]
"""A check returns ``True``/``False``, or ``(ok, reason)`` to explain a failure in the body."""
Check = Callable[[], CheckResult]
#: a JSON page: the request's query parameters (``parse_qs``) -> (HTTP status, document)
Page = Callable[[dict[str, list[str]]], tuple[int, Any]]

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


@dataclass(frozen=True)
class Limits:
    """What one client may hold. The defaults keep ``/metrics`` answering while ~20k slow
    connections are open (``python -m benchmarks slowloris``)."""

    max_connections: int = 1024
    """Open connections at most; past it the one waiting longest for its request is dropped."""
    header_timeout_s: float = 10.0
    """From accept (or the first byte of a kept-alive request) to the end of the request head,
    TLS handshake included."""
    idle_timeout_s: float = 120.0
    """A kept-alive connection with no new request is closed after this long."""
    write_timeout_s: float = 30.0
    """A client that does not take its response within this long is cut off."""
    max_head_bytes: int = 16_384
    """Request line plus headers; longer is answered 431 and closed."""
    workers: int = 2
    """Threads that render ``/metrics``; probes and password checks have their own."""
    password_workers: int = 1
    """Threads that check new basic-auth credentials with bcrypt (~0.1 s of a core each)."""
    password_backlog: int = 16
    """New credentials checked or waiting at most; past it a request is answered 503 at once."""


_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
_RESERVED_FILES = 256  # kept for the rest of the process (Kafka sockets, files, logs)
_PUBLIC_PATHS = ("/healthz", "/readyz")  # probes answer without credentials (docs/security.md)


class _BadRequest(ValueError):
    """A request head that is not HTTP/1.x."""


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value


@dataclass
class _Response:
    status: HTTPStatus
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    close: bool = False

    def encode(self, *, head: bool, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status.value} {self.status.phrase}",
            "Server: evald",
            f"Date: {formatdate(usegmt=True)}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Cache-Control: no-store",
        ]
        lines += [f"{name}: {value}" for name, value in (*self.headers, *extra)]
        if self.close:
            lines.append("Connection: close")
        head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head_bytes if head else head_bytes + self.body


def _parse_head(head: bytes) -> _Request:
    """The request line and headers of one HTTP/1.x request (the bytes up to the blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(f"bad request line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadRequest(f"bad header line {line[:80]!r}")
        headers[name.lower()] = value.strip()
    return _Request(parts[0], parts[1], parts[2], headers)


def _keep_alive(request: _Request) -> bool:
    connection = request.headers.get("connection", "").lower()
    if request.version == "HTTP/1.0":
        return connection == "keep-alive"
    return connection != "close"


class _Conn:
    """One client connection and where it is in its request/response cycle."""

    __slots__ = ("buf", "close_after", "deadline", "out", "sent", "sock", "started", "state")

    def __init__(self, sock: socket.socket, state: str, deadline: float) -> None:
        self.sock = sock
        self.state = state  # handshake | read | busy | write
        self.deadline = deadline  # monotonic seconds; inf while a worker renders
        self.buf = b""
        self.out = b""
        self.sent = 0
        self.started = True  # a byte of the current request has arrived (read state)
        self.close_after = False


class _Connections:
    """The open connections, those waiting for a request (or a TLS handshake) oldest first.

    Past the cap the connection that has waited longest is dropped: a slow or idle client,
    never one whose response is being rendered or sent. Loop thread only.
    """

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._open: set[_Conn] = set()
        self._waiting: OrderedDict[_Conn, None] = OrderedDict()
        self.dropped = 0

    def add(self, conn: _Conn) -> list[_Conn]:
        """Admit ``conn`` as waiting; returns the connections to drop (maybe ``conn`` itself
        when every other one is busy)."""
        self._open.add(conn)
        self._waiting[conn] = None
        dropped = []
        while len(self._open) > self._cap:
            oldest, _ = self._waiting.popitem(last=False)
            self._open.discard(oldest)
            dropped.append(oldest)
        self.dropped += len(dropped)
        return dropped

    def waiting(self, conn: _Conn) -> None:
        self._waiting[conn] = None
        self._waiting.move_to_end(conn)

    def busy(self, conn: _Conn) -> None:
        self._waiting.pop(conn, None)

    def remove(self, conn: _Conn) -> None:
        self._open.discard(conn)
        self._waiting.pop(conn, None)

    def __iter__(self) -> Iterator[_Conn]:
        return iter(list(self._open))

    def __len__(self) -> int:
        return len(self._open)


class _Pools:
    """The threads work leaves the loop for, one pool per kind, so none waits behind another:
    renderings of /metrics, probes, bcrypt checks of new credentials."""

    def __init__(self, limits: Limits) -> None:
        self.render = ThreadPoolExecutor(limits.workers, thread_name_prefix="evald-http-worker")
        self.probes = ThreadPoolExecutor(1, thread_name_prefix="evald-http-probe")
        self.passwords = ThreadPoolExecutor(
            limits.password_workers, thread_name_prefix="evald-http-password"
        )

    def shutdown(self) -> None:
        for pool in (self.render, self.probes, self.passwords):
            pool.shutdown(wait=False, cancel_futures=True)


class _PasswordChecks:
    """Requests waiting for (or in) a bcrypt check, per credentials: at most ``backlog``
    distinct credentials; the same ones again join without counting (one check answers them
    all). Admitted by the loop thread, released by the checker."""

    def __init__(self, backlog: int) -> None:
        self._backlog = backlog
        self._waiting: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def admit(self, credentials: tuple[str, str]) -> bool:
        """Count one more request; False (nothing counted) if it would pass the backlog."""
        with self._lock:
            count = self._waiting.get(credentials, 0)
            if count == 0 and len(self._waiting) >= self._backlog:
                return False
            self._waiting[credentials] = count + 1
            return True

    def release(self, credentials: tuple[str, str]) -> None:
        with self._lock:
            count = self._waiting[credentials] - 1
            if count:
                self._waiting[credentials] = count
            else:
                del self._waiting[credentials]

    def distinct(self) -> int:
        with self._lock:
            return len(self._waiting)

    def requests(self) -> int:
        with self._lock:
            return sum(self._waiting.values())


_ACCEPT_BURST = 256  # accepts per readiness event, so a flood cannot starve the rest
_SWEEP_S = 0.25  # how often deadlines are checked
_RECV = 65_536
_AGAIN = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class MetricsServer:
    """Serve a private registry plus health and readiness checks on one address.

    One thread runs a selector loop over every connection (no thread per client, no per-client
    objects beyond a socket and a small record) under :class:`Limits`; responses are rendered
    by a small pool of worker threads. ``web`` adds TLS and basic auth (:mod:`evald.webconfig`).
    ``start()`` binds (so a taken port fails loudly, in the caller's thread) and serves from a
    daemon thread; ``stop()`` closes every connection and joins it. Port 0 picks a free port,
    readable afterwards as :attr:`port`. Usable as a context manager. With TLS, the server adds
    ``evald_tls_certificate_expiry_timestamp_seconds`` to the registry.
    """

    # made by the loop thread when it starts, used only by it (and by workers for the pools)
    _selector: selectors.BaseSelector
    _pools: _Pools

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        registry: CollectorRegistry | None = None,
        ready: Check = lambda: True,
        healthy: Check = lambda: True,
        *,
        encoder: Encoder | None = None,
        web: WebConfig | None = None,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
        pages: Mapping[str, Page] | None = None,
    ) -> None:
        self.host, self._requested_port = parse_address(address)
        #: more JSON pages (path -> Page: the request's query parameters -> status and
        #: document), answered like /metrics: a rendering worker, behind the same auth
        self.pages: dict[str, Page] = dict(pages or {})
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.ready = ready
        self.healthy = healthy
        self.encoder = encoder if encoder is not None else Encoder()
        self.web = web if web is not None else WebConfig()
        if self.web.certificate_expiry is not None:  # what only the endpoint knows
            self.registry.register(CertificateCollector(self.web))
        self.limits = limits if limits is not None else Limits()
        self._clock = clock
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake_w: socket.socket | None = None
        self._done: queue.SimpleQueue[tuple[_Conn, bytes, bool]] = queue.SimpleQueue()
        self._connections = _Connections(self.limits.max_connections)
        self._lock = threading.Lock()
        self._checks = _PasswordChecks(self.limits.password_backlog)

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for); only valid after start()."""
        if self._port is None:
            raise RuntimeError("MetricsServer is not started")
        return self._port

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
        scheme = "https" if self.web.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    @property
    def password_checks(self) -> int:
        """New credentials (distinct ones) being checked with bcrypt or waiting for a check."""
        return self._checks.distinct()

    @property
    def waiting_for_passwords(self) -> int:
        """Requests waiting for a password check, the same credentials counted each time."""
        return self._checks.requests()

    @property
    def dropped(self) -> int:
        """Connections dropped so far because the cap was reached."""
        return self._connections.dropped

    def start(self) -> MetricsServer:
        with self._lock:
            if self._thread is not None:
                return self
            files = raise_fd_limit()
            # never more connections than files left for them: at the limit accept() fails
            cap = self.limits.max_connections
            if files > 0:
                cap = min(cap, max(16, files - _RESERVED_FILES))
            self._connections = _Connections(cap)
            listener = self._listen()
            self._port = int(listener.getsockname()[1])
            wake_r, wake_w = socket.socketpair()
            wake_r.setblocking(False)
            wake_w.setblocking(False)
            self._wake_w = wake_w
            self._stopping.clear()
            thread = threading.Thread(
                target=self._serve,
                args=(listener, wake_r),
                name=f"evald-http-{self._port}",
                daemon=True,
            )
            thread.start()
            self._thread = thread
            log.info("serving /metrics /healthz /readyz on %s", self.url)
            return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, close every connection and release the port; safe to call twice."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._port = None
        if thread is None:
            return
        self._stopping.set()
        self._wake()
        thread.join(timeout)

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop thread ---------------------------------------------------------------------

    def _listen(self) -> socket.socket:
        try:
            family = _address_family(self.host, self._requested_port)
        except OSError as exc:
            raise AddressError(f"cannot resolve listen host {self.host!r}: {exc}") from exc
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # restarting the daemon must not fail on a port lingering in TIME_WAIT
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self._requested_port))
            sock.listen(_BACKLOG)
        except OSError as exc:
            sock.close()
            where = f"{self.host}:{self._requested_port}"
            raise OSError(exc.errno, f"cannot listen on {where}: {exc.strerror}") from exc
        sock.setblocking(False)
        return sock

    def _wake(self) -> None:
        """Interrupt the loop's select (from a worker or stop())."""
        wake = self._wake_w
        if wake is not None:
            with contextlib.suppress(OSError):  # full: already woken; closed: already stopped
                wake.send(b"x")

    def _serve(self, listener: socket.socket, wake_r: socket.socket) -> None:
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, "accept")
        self._selector.register(wake_r, selectors.EVENT_READ, "wake")
        self._pools = _Pools(self.limits)
        next_sweep = self._clock() + _SWEEP_S
        try:
            while not self._stopping.is_set():
                for key, _ in self._selector.select(_SWEEP_S):
                    if key.data == "accept":
                        self._accept(listener)
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            wake_r.recv(4096)
                    else:
                        self._ready(key.data)
                self._finish_rendered()
                if self._clock() >= next_sweep:
                    self._sweep()
                    next_sweep = self._clock() + _SWEEP_S
        except Exception:  # the loop itself failing is a bug: say so, keep the process up
            log.exception("the HTTP server loop failed; /metrics is no longer served")
        finally:
            for conn in self._connections:
                self._close(conn)
            self._selector.close()
            listener.close()
            wake_w, self._wake_w = self._wake_w, None
            wake_r.close()
            if wake_w is not None:
                wake_w.close()
            self._pools.shutdown()

    def _accept(self, listener: socket.socket) -> None:
        tls = self.web.ssl_context
        for _ in range(_ACCEPT_BURST):
            try:
                sock, _ = listener.accept()
            except _AGAIN:
                return
            except OSError as exc:  # EMFILE, ECONNABORTED: nothing to do for this one
                log.debug("accept failed: %s", exc)
                return
            try:
                sock.setblocking(False)
                if tls is not None:
                    sock = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except OSError as exc:  # the client reset before we got to it
                log.debug("accepted connection failed: %s", exc)
                sock.close()
                continue
            state = "handshake" if tls is not None else "read"
            conn = _Conn(sock, state, self._clock() + self.limits.header_timeout_s)
            self._selector.register(sock, selectors.EVENT_READ, conn)
            for old in self._connections.add(conn):
                self._close(old)

    def _ready(self, conn: _Conn) -> None:
        try:
            if conn.state == "handshake":
                self._handshake(conn)
            if conn.state == "read":
                self._read(conn)
            elif conn.state == "write":
                self._write(conn)
        except (OSError, ssl.SSLError) as exc:
            log.debug("connection closed: %s", exc)
            self._close(conn)
        except Exception:  # one broken connection must never end the loop
            log.warning("HTTP connection failed", exc_info=True)
            self._close(conn)

    def _handshake(self, conn: _Conn) -> None:
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(sock, selectors.EVENT_WRITE, conn)
            return
        if not peer_allowed(sock.getpeercert(), self.web.allowed_sans):
            log.info("client certificate names none of client_allowed_sans: closing")
            self._close(conn)
            return
        self._selector.modify(sock, selectors.EVENT_READ, conn)
        conn.state = "read"

    def _read(self, conn: _Conn) -> None:
        limit = self.limits.max_head_bytes
        while True:
            try:
                data = conn.sock.recv(_RECV)
            except _AGAIN:
                break
            if not data:
                self._close(conn)
                return
            if not conn.started:
                conn.started = True
                conn.deadline = self._clock() + self.limits.header_timeout_s
            conn.buf += data
            if b"\r\n\r\n" in conn.buf or len(conn.buf) > limit:
                break
        self._next_request(conn)

    def _next_request(self, conn: _Conn) -> None:
        """Start on a complete request head in the buffer, if there is one."""
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0 and len(conn.buf) <= self.limits.max_head_bytes:
            return
        self._connections.busy(conn)
        self._selector.unregister(conn.sock)
        conn.state, conn.deadline = "busy", math.inf
        if end < 0 or end + 4 > self.limits.max_head_bytes:
            status = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
            self._respond_now(conn, _Response(status, b"request head too large\n", close=True))
            return
        head, conn.buf = conn.buf[: end + 4], conn.buf[end + 4 :]
        try:
            request = _parse_head(head)
        except _BadRequest as exc:
            self._respond_now(
                conn, _Response(HTTPStatus.BAD_REQUEST, f"{exc}\n".encode(), close=True)
            )
            return
        self._dispatch(conn, request)

    def _dispatch(self, conn: _Conn, request: _Request) -> None:
        """Where a request is answered; the loop thread decides in microseconds, never waiting:

        1. ``/healthz``, ``/readyz``: the probe thread, behind nothing but other probes;
        2. no auth configured, or credentials that passed before: a rendering worker;
        3. no credentials, malformed ones, or ones that failed before: 401 now;
        4. new credentials: a password-check thread, unless ``password_backlog`` other new
           credentials are already checked or waiting: then 503 now (docs/security.md). The
           same credentials again (200 scrapers starting at once) join the queue without
           counting: the first check answers them all.
        """
        if _path(request.target) in _PUBLIC_PATHS:
            self._pools.probes.submit(self._render, conn, request)
            return
        auth = self.web.auth
        credentials = None if auth is None else _credentials(request)
        known = None if auth is None or credentials is None else auth.lookup(*credentials)
        if auth is None or known:
            self._pools.render.submit(self._render, conn, request)
        elif credentials is None or known is False:
            self._finish(conn, request, _unauthorized())
        elif self._checks.admit(credentials):
            self._pools.passwords.submit(self._check_password, conn, request, credentials)
        else:
            busy = b"too many new credentials being checked; retry\n"
            headers = [("Retry-After", "1")]
            self._finish(conn, request, _Response(_UNAVAILABLE, busy, headers=headers, close=True))

    def _check_password(self, conn: _Conn, request: _Request, credentials: tuple[str, str]) -> None:
        """Password thread: bcrypt (unless the same credentials were checked meanwhile), then
        the rendering worker or a 401."""
        auth = self.web.auth
        assert auth is not None  # dispatched here only with auth
        try:
            known = auth.lookup(*credentials)
            ok = auth.verify(*credentials) if known is None else known
        except Exception:  # a broken check is a refusal, never a dead thread
            log.exception("checking a password failed")
            ok = False
        finally:
            self._checks.release(credentials)
        if not ok:
            self._finish(conn, request, _unauthorized())
            return
        with contextlib.suppress(RuntimeError):  # the server stopped meanwhile
            self._pools.render.submit(self._render, conn, request)

    def _render(self, conn: _Conn, request: _Request) -> None:
        """Worker thread: build the response and hand it back to the loop."""
        try:
            response = self._route(request)
        except Exception:  # never leave a connection without an answer
            log.exception("answering %s %s failed", request.method, request.target[:80])
            response = _Response(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n", close=True)
        self._finish(conn, request, response)

    def _finish(self, conn: _Conn, request: _Request, response: _Response) -> None:
        """Any thread: the response's bytes to the loop, which sends them."""
        # A request body is never read: close after answering so it is not taken for the next
        # request on a kept-alive connection.
        has_body = "transfer-encoding" in request.headers or (
            request.headers.get("content-length", "0").strip() not in ("", "0")
        )
        if has_body or not _keep_alive(request):
            response.close = True
        data = response.encode(head=request.method == "HEAD", extra=self.web.headers)
        self._done.put((conn, data, response.close))
        self._wake()

    def _respond_now(self, conn: _Conn, response: _Response) -> None:
        self._done.put((conn, response.encode(head=False, extra=self.web.headers), response.close))

    def _finish_rendered(self) -> None:
        while True:
            try:
                conn, data, close = self._done.get_nowait()
            except queue.Empty:
                return
            if conn.state != "busy":  # closed meanwhile
                continue
            conn.out, conn.sent, conn.close_after = data, 0, close
            conn.state = "write"
            conn.deadline = self._clock() + self.limits.write_timeout_s
            self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
            try:
                self._write(conn)
            except (OSError, ssl.SSLError) as exc:
                log.debug("connection closed: %s", exc)
                self._close(conn)

    def _write(self, conn: _Conn) -> None:
        view = memoryview(conn.out)
        while conn.sent < len(view):
            try:
                conn.sent += conn.sock.send(view[conn.sent :])
            except _AGAIN:
                return
        conn.out = b""
        if conn.close_after:
            self._close(conn)
            return
        # kept alive: wait for the next request, which may already be in the buffer
        conn.state, conn.started = "read", bool(conn.buf)
        conn.deadline = self._clock() + (
            self.limits.header_timeout_s if conn.buf else self.limits.idle_timeout_s
        )
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        self._connections.waiting(conn)
        self._next_request(conn)

    def _sweep(self) -> None:
        now = self._clock()
        for conn in self._connections:
            if conn.deadline <= now:
                log.debug("closing a connection past its %s deadline", conn.state)
                self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.state == "closed":
            return
        if conn.state != "busy":
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        conn.state = "closed"
        self._connections.remove(conn)
        with contextlib.suppress(OSError):
            conn.sock.close()

    # -- the worker threads -------------------------------------------------------------------

    def _route(self, request: _Request) -> _Response:
        """Answer one authorized request (:meth:`_dispatch`); a worker or the probe thread."""
        url = urlsplit(request.target)
        path = url.path.rstrip("/") or "/"
        if request.method not in ("GET", "HEAD"):
            return _Response(
                HTTPStatus.METHOD_NOT_ALLOWED,
                b"only GET and HEAD\n",
                headers=[("Allow", "GET, HEAD")],
                close=True,
            )
        if path == "/metrics":
            return self._metrics(request, url.query)
        if path in _PUBLIC_PATHS:
            what = "healthy" if path == "/healthz" else "ready"
            ok, reason = _outcome(self.healthy if what == "healthy" else self.ready, what)
            status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
            return _Response(status, reason.encode("utf-8", "replace") + b"\n")
        page = self.pages.get(path)
        if page is not None:
            code, document = page(parse_qs(url.query))
            body = (json.dumps(document, ensure_ascii=False, indent=1) + "\n").encode()
            return _Response(HTTPStatus(code), body, content_type="application/json")
        if path == "/":
            return _Response(HTTPStatus.OK, b"evald: /metrics /healthz /readyz\n")
        return _Response(HTTPStatus.NOT_FOUND, b"not found: try /metrics /healthz /readyz\n")

    def _metrics(self, request: _Request, query: str) -> _Response:
        names = parse_qs(query).get("name[]")
        try:
            body, content_type = self.encoder.encode(
                self.registry, request.headers.get("accept"), names=names
            )
        except Exception:  # a failing collector is a 500 for this scrape, not a dead server
            log.exception("rendering /metrics failed")
            return _Response(HTTPStatus.INTERNAL_SERVER_ERROR, b"metrics rendering failed\n")
        headers: list[tuple[str, str]] = []
        if gzip_accepted(request.headers.get("accept-encoding", "")):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        return _Response(HTTPStatus.OK, body, content_type=content_type, headers=headers)


_UNAVAILABLE = HTTPStatus.SERVICE_UNAVAILABLE


def _path(target: str) -> str:
    return urlsplit(target).path.rstrip("/") or "/"


def _credentials(request: _Request) -> tuple[str, str] | None:
    """``(user, password)`` of a Basic ``Authorization`` header, or None if there is none."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def _unauthorized() -> _Response:
    return _Response(
        HTTPStatus.UNAUTHORIZED,
        b"unauthorized\n",
        headers=[("WWW-Authenticate", 'Basic realm="evald", charset="UTF-8"')],
    )


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard limit, so the server can hold many
    sockets (each is a file); returns the soft limit now in force."""
    try:
        import resource
    except ImportError:  # not on this platform
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            log.debug("could not raise RLIMIT_NOFILE from %d to %d", soft, hard)
    return soft


def _address_family(host: str, port: int) -> socket.AddressFamily:
    """IPv4 or IPv6 for a literal or a resolvable host name."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        return infos[0][0]
