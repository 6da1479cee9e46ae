"""Probes never queue behind scrapes or password checks, and password checks are bounded.

The kubelet restarts a pod whose /healthz takes longer than its timeout (3 s as shipped): with
bcrypt checks and renderings on the two threads that also answered the probes, 50 clients
sending wrong passwords made /healthz take 4.6-7.3 s. These tests hold the slow work still
(a verifier or a collector waiting on an event) and require the probes to be answered while it
is held: an assertion on order, not on time. The latencies are measured by
``python -m benchmarks probes``.
"""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Callable, Iterable, Iterator

import bcrypt
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from evald.http import Limits, MetricsServer
from evald.webconfig import BasicAuth, WebConfig

#: a bound for every wait, so the old behaviour fails these tests instead of hanging them
BOUND_S = 30.0
USER, PASSWORD = "prometheus", "right"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def send(port: int, path: str, password: str | None = None) -> socket.socket:
    """A connection that has sent one GET and not read its answer yet."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
    auth = "" if password is None else f"Authorization: {_basic(USER, password)}\r\n"
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: evald\r\n{auth}Connection: close\r\n\r\n".encode())
    return sock


def answer(sock: socket.socket) -> tuple[int, str]:
    """The status and head+body of the response (the server closes after it)."""
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    text = data.decode("latin-1")
    return int(text.split(" ", 2)[1]), text


def get(port: int, path: str, password: str | None = None) -> tuple[int, str]:
    return answer(send(port, path, password))


class HeldVerifier:
    """bcrypt's checkpw, held inside each call until :meth:`release` while ``holding``."""

    def __init__(self) -> None:
        self.holding = False
        self.entered = threading.Semaphore(0)
        self.calls = 0
        self._release = threading.Event()

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        self.calls += 1
        if self.holding:
            self.entered.release()
            self._release.wait(BOUND_S)
        return bcrypt.checkpw(password, hashed)

    def wait_entered(self, count: int) -> None:
        for _ in range(count):
            assert self.entered.acquire(timeout=BOUND_S), "no password check started"

    def release(self) -> None:
        self._release.set()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldVerifier]:
    verifier = HeldVerifier()
    # bcrypt.checkpw itself: what BasicAuth checks with unless given another verifier
    monkeypatch.setattr(bcrypt, "checkpw", verifier)
    yield verifier
    verifier.release()


def test_probes_are_answered_while_wrong_passwords_are_being_checked(
    held: HeldVerifier,
) -> None:
    """Six clients with wrong passwords, their checks held inside bcrypt: /healthz and /readyz
    are answered before any of them. They waited behind the checks on the two workers."""
    web = WebConfig(auth=BasicAuth({USER: HASH}))
    with MetricsServer("127.0.0.1:0", web=web) as server:
        held.holding = True
        wrong = [send(server.port, "/metrics", f"wrong-{i}") for i in range(6)]
        held.wait_entered(1)  # the checks have begun: every request above was read first
        assert get(server.port, "/healthz")[0] == 200
        assert get(server.port, "/readyz")[0] == 200
        held.release()
        assert [answer(sock)[0] for sock in wrong] == [401] * 6


class HeldCollector:
    """A collector whose collect() waits until released: a scrape stuck on the engine."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self._release = threading.Event()

    def describe(self) -> list[Metric]:
        return [Metric("held_gauge", "held_gauge", "gauge")]

    def collect(self) -> Iterable[Metric]:
        self.entered.release()
        self._release.wait(BOUND_S)
        yield GaugeMetricFamily("held_gauge", "a gauge behind a held lock", value=1.0)

    def release(self) -> None:
        self._release.set()


def test_probes_are_answered_while_every_rendering_worker_is_stuck() -> None:
    registry = CollectorRegistry(auto_describe=True)
    collector = HeldCollector()
    registry.register(collector)
    with MetricsServer("127.0.0.1:0", registry=registry) as server:
        try:
            # distinct name lists: each is its own rendering (identical ones share one)
            scrapes = [
                send(server.port, f"/metrics?name[]=held_gauge&name[]=x{i}") for i in range(5)
            ]
            for _ in range(Limits().workers):  # every rendering worker is inside collect()
                assert collector.entered.acquire(timeout=BOUND_S)
            assert get(server.port, "/healthz")[0] == 200
            assert get(server.port, "/readyz")[0] == 200
        finally:
            collector.release()
        assert [answer(sock)[0] for sock in scrapes] == [200] * 5


def test_password_checks_are_bounded_and_known_credentials_skip_them() -> None:
    """Past ``password_backlog`` new credentials are refused at once (503, Retry-After); a
    scraper whose credentials passed before, and a repeated wrong password, never wait for a
    check."""
    verifier = HeldVerifier()
    web = WebConfig(auth=BasicAuth({USER: HASH}, verify=verifier))
    limits = Limits(password_workers=2, password_backlog=4)
    with MetricsServer("127.0.0.1:0", web=web, limits=limits) as server:
        assert get(server.port, "/metrics", PASSWORD)[0] == 200
        assert get(server.port, "/metrics", "wrong-0")[0] == 401
        assert verifier.calls == 2
        verifier.holding = True
        held = []
        for i in range(1, 5):
            held.append(send(server.port, "/metrics", f"wrong-{i}"))
            if i <= limits.password_workers:
                verifier.wait_entered(1)
        wait_for(lambda: server.password_checks == limits.password_backlog)  # 2 held, 2 queued
        status, text = get(server.port, "/metrics", "wrong-5")
        assert status == 503 and "Retry-After: 1" in text
        # while four checks are stuck: the known scraper, the known wrong password, probes
        assert get(server.port, "/metrics", PASSWORD)[0] == 200
        assert get(server.port, "/metrics", "wrong-0")[0] == 401
        assert get(server.port, "/metrics")[0] == 401  # no credentials: nothing to check
        assert get(server.port, "/healthz")[0] == 200
        assert verifier.calls == 2 + limits.password_workers
        verifier.release()
        assert [answer(sock)[0] for sock in held] == [401] * 4
        assert server.password_checks == 0
        assert get(server.port, "/metrics", "wrong-5")[0] == 401  # room again: checked now


def wait_for(condition: Callable[[], bool]) -> None:
    """Until ``condition()`` holds (the loop thread has read what the test sent)."""
    for _ in range(int(BOUND_S * 100)):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError("the server never got there")


def test_the_same_new_credentials_at_once_cost_one_check_and_are_never_refused() -> None:
    """200 scrapers starting together with the same password: each used to take a place in
    the backlog, and those past it got 503 until the first check was remembered."""
    verifier = HeldVerifier()
    verifier.holding = True
    web = WebConfig(auth=BasicAuth({USER: HASH}, verify=verifier))
    with MetricsServer("127.0.0.1:0", web=web, limits=Limits(password_backlog=2)) as server:
        scrapers = [send(server.port, "/metrics", PASSWORD) for _ in range(10)]
        verifier.wait_entered(1)
        wait_for(lambda: server.waiting_for_passwords == 10)
        assert server.password_checks == 1
        verifier.release()
        assert [answer(sock)[0] for sock in scrapers] == [200] * 10
        assert verifier.calls == 1
        assert server.waiting_for_passwords == server.password_checks == 0
