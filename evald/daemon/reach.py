"""What is wrong with ``kafka.bootstrap_servers`` when no broker can be reached, said by evald.

kafka-python retries a host that does not resolve or a port nothing listens on for its whole
bootstrap (``kafka.request_timeout_ms``, 30 s) and logs only its own connection errors; a port
where something else listens (an HTTP server) costs the same 30 s and says "Request timed out".
So:

* before a session makes its clients, :func:`check_resolves`: when no bootstrap host resolves,
  the session fails at once with :class:`BrokerUnreachable` (retried with backoff, its reason in
  the log and on ``/readyz``). Retried, not fatal: in Kubernetes a Service's DNS name (a
  StatefulSet pod's name behind a headless Service) resolves only once the Service exists or
  the pod is ready, and a resolver may be away for a while.
* after a session failed to bootstrap, :func:`diagnose` connects to every address at once
  (under one deadline that a stop ends) and, on plaintext listeners, sends Kafka's
  ApiVersions request. The retry's log line and ``/readyz`` say what each address did
  (refused, timed out, answered as another service). :class:`Misdirected` turns it into an
  exit 2 only when *every* address answered as another service (an HTTP response, a TLS
  record) on MISDIRECTED_TIMES failed bootstraps in a row spanning MISDIRECTED_SPAN_S: one
  address answering HTTP while the others refuse is a stale entry (kafka-python bootstraps
  from the others once they are up), and an address that answers HTTP for a while is also
  what an egress proxy or a pod IP handed to another pod during a broker's reschedule does.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kafka.errors import KafkaError, KafkaTimeoutError

from evald.daemon.fatal import causes
from evald.daemon.settings import host_port

__all__ = [
    "BrokerUnreachable",
    "Diagnosis",
    "Finding",
    "Misdirected",
    "check_resolves",
    "diagnose",
    "probe",
]

#: ApiVersions (key 18) version 0: every Kafka broker answers it, before any authentication
API_VERSIONS_V0 = 18, 0
CORRELATION_ID = 0x65766164  # "evad"
#: how long a listener gets to answer ApiVersions before it is asked to finish (a half-close:
#: an HTTP server answers a request it has read to the end, a broker closes)
ANSWER_S = 2.0
#: the longest wait for a connection of the diagnosis
CONNECT_S = 5.0
#: the longest a diagnosis takes: a connection and two reads, the addresses side by side (an
#: address whose probe is not done by then counts as not answering)
DIAGNOSIS_S = CONNECT_S + 2 * ANSWER_S + 1.0
#: how often a diagnosis looks at the stop while its probes run
STOP_CHECK_S = 0.05
#: failed bootstraps in a row on which every address answers as another service, over at
#: least MISDIRECTED_SPAN_S, before ``evald run`` exits 2. Ten minutes, not one: where a
#: transparent or egress proxy answers HTTP for an address it cannot reach, a broker that is
#: merely down (a restart recovering its logs after an unclean stop takes minutes) looks like
#: another service; a listener that is another service for ten minutes is a setting to change,
#: and a wrong exit costs a restart, nothing of the state
MISDIRECTED_TIMES = 3
MISDIRECTED_SPAN_S = 600.0
#: what to read of an answer
PEEK_BYTES = 8
#: why a name that does not resolve is retried
LATER = "a name that appears later, such as a Kubernetes Service's, is picked up"


class BrokerUnreachable(KafkaError):
    """No bootstrap host resolves (retried: the name may appear)."""

    retriable = True

    def __str__(self) -> str:  # KafkaError's repeats the class name, which the log line has
        return str(self.args[0])


@dataclass(frozen=True)
class Finding:
    """What one bootstrap address did: ``kafka`` (answered, or connected on a TLS listener,
    or accepted and stayed silent), ``unreachable`` (no name, no listener) or ``other`` (a
    service that is not Kafka); and what to tell the operator about it."""

    address: str
    kind: str
    why: str


@dataclass(frozen=True)
class Diagnosis:
    """After a failed bootstrap: what each address did (``hint``, for the retry's line) and,
    when every address answered as another service, that verdict (``misdirected``)."""

    misdirected: str | None
    hint: str


class Misdirected:
    """Decides when a verdict of :func:`diagnose` is no retry's to fix: the same one on
    MISDIRECTED_TIMES failed bootstraps in a row, spanning MISDIRECTED_SPAN_S."""

    def __init__(self) -> None:
        self._verdict: str | None = None
        self._times: list[float] = []

    def reset(self) -> None:
        """A session got past its bootstrap (or failed otherwise): start counting afresh."""
        self._verdict, self._times = None, []

    def judge(self, diagnosis: Diagnosis, now: float) -> tuple[str | None, str]:
        """The advice to exit 2 with (None: retry), and the retry's reason."""
        verdict = diagnosis.misdirected
        if verdict is None:
            self.reset()
            return None, diagnosis.hint
        if verdict != self._verdict:
            self.reset()
            self._verdict = verdict
        self._times.append(now)
        seen, span = len(self._times), now - self._times[0]
        if seen >= MISDIRECTED_TIMES and span >= MISDIRECTED_SPAN_S:
            return _advice(verdict), diagnosis.hint
        return None, (
            f"every address answers as another service: {verdict} (failed bootstrap {seen}; "
            f"evald run exits 2 after {MISDIRECTED_TIMES} in a row over "
            f"{MISDIRECTED_SPAN_S:.0f}s)"
        )


def _advice(verdict: str) -> str:
    return (
        f"kafka.bootstrap_servers: {verdict}: point kafka.bootstrap_servers "
        "(--bootstrap-servers, EVALD_KAFKA__BOOTSTRAP_SERVERS) at the brokers' Kafka listener "
        "(9092 by default), or set kafka.security_protocol to what that listener speaks"
    )


def check_resolves(servers: list[str]) -> None:
    """Raise :class:`BrokerUnreachable` when no host of ``servers`` resolves."""
    failures = []
    for server in servers:
        host, port = host_port(server)
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            return
        except (OSError, UnicodeError) as exc:
            failures.append(f"{server} does not resolve ({_why(exc)})")
    raise BrokerUnreachable("kafka.bootstrap_servers: " + "; ".join(failures) + f"; {LATER}")


def diagnose(
    exc: BaseException,
    servers: list[str],
    protocol: str,
    stop: threading.Event,
    clock: Callable[[], float] = time.monotonic,
) -> Diagnosis | None:
    """What each bootstrap address does, when ``exc`` is a failed bootstrap; else None, and
    None as soon as ``stop`` is set (nothing is left to retry)."""
    if stop.is_set() or not any(_bootstrap_failed(cause) for cause in causes(exc)):
        return None
    findings = _probe_all(servers, protocol, stop, clock)
    if findings is None:
        return None
    hint = "; ".join(f"{f.address} {f.why}" for f in findings)
    return Diagnosis(hint if all(f.kind == "other" for f in findings) else None, hint)


def _probe_all(
    servers: list[str], protocol: str, stop: threading.Event, clock: Callable[[], float]
) -> list[Finding] | None:
    """Probe ``servers`` side by side, each on a daemon thread (a probe's socket calls cannot
    be interrupted; one still running when this returns ends within its own timeouts).
    None when ``stop`` is set meanwhile."""
    done: queue.Queue[tuple[int, Finding]] = queue.Queue()
    for i, server in enumerate(servers):
        threading.Thread(
            target=lambda i=i, server=server: done.put((i, probe(server, protocol, CONNECT_S))),
            name=f"evald-probe-{server}",
            daemon=True,
        ).start()
    found: dict[int, Finding] = {}
    deadline = clock() + DIAGNOSIS_S
    while len(found) < len(servers) and clock() < deadline:
        if stop.is_set():
            return None
        with contextlib.suppress(queue.Empty):
            i, finding = done.get(timeout=STOP_CHECK_S)
            found[i] = finding
    late = f"did not answer within {DIAGNOSIS_S:.0f}s"
    return [found.get(i) or Finding(s, "unreachable", late) for i, s in enumerate(servers)]


def _bootstrap_failed(exc: BaseException) -> bool:
    """kafka-python's clients give up bootstrapping with "Unable to bootstrap from [...]"."""
    return isinstance(exc, KafkaTimeoutError) and "Unable to bootstrap" in str(exc)


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def probe(server: str, protocol: str, timeout_s: float) -> Finding:
    """Resolve, connect to and (plaintext listeners) ask ``server`` (HOST:PORT)."""
    host, port = host_port(server)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return Finding(server, "unreachable", f"does not resolve ({_why(exc)}; {LATER})")
    refused = "accepts no connection"
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout_s)
                sock.connect(address)
                if protocol in ("SSL", "SASL_SSL"):
                    return Finding(server, "kafka", "accepts connections")
                return _ask(sock, server)
        except OSError as exc:
            refused = f"accepts no connection ({_why(exc)}: no broker listens there yet)"
    return Finding(server, "unreachable", refused)


def _ask(sock: socket.socket, server: str) -> Finding:
    """Send ApiVersions and judge the first bytes of the answer."""
    client_id = b"evald"
    header = struct.pack(">hhih", *API_VERSIONS_V0, CORRELATION_ID, len(client_id)) + client_id
    sock.sendall(struct.pack(">i", len(header)) + header)
    answer = _read(sock, ANSWER_S)
    if not answer:
        with contextlib.suppress(OSError):  # the peer closed already: nothing more comes
            sock.shutdown(socket.SHUT_WR)
            answer = _read(sock, ANSWER_S)
    if len(answer) >= 8 and struct.unpack(">i", answer[4:8])[0] == CORRELATION_ID:
        return Finding(server, "kafka", "answered ApiVersions")
    if answer.startswith((b"HTTP/", b"<")):  # a status line, or an HTTP/0.9 error page
        why = "an HTTP server listens there, or a proxy answers for an address it cannot reach"
        return Finding(server, "other", f"answers HTTP, not Kafka ({why})")
    if answer[:1].isalpha():  # a text protocol's greeting or error (SSH, SMTP, Redis...)
        return Finding(server, "other", f"answers {answer!r}..., not Kafka")
    if answer[:1] in (b"\x15", b"\x16") and answer[1:2] == b"\x03":
        return Finding(
            server, "other", "answers TLS: set kafka.security_protocol to SSL or SASL_SSL"
        )
    # silent, closed, or bytes of no known kind: the clients find out (and retry)
    return Finding(server, "kafka", "accepts connections but did not answer ApiVersions")


def _read(sock: socket.socket, timeout_s: float) -> bytes:
    """Up to PEEK_BYTES of what the peer sends within ``timeout_s`` (b"" for nothing)."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while len(data) < PEEK_BYTES:
            chunk = sock.recv(PEEK_BYTES - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data
