"""/healthz and /readyz keep answering while the poll loop holds the engine (a restore reading
from a slow broker), however many scrapes arrive meanwhile."""

from __future__ import annotations

import http.client
import threading
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families as parse_text

from evald.config import EngineConfig
from evald.daemon.engine_lock import EngineLock
from evald.daemon.scrape import EngineBusy, ScrapeLock
from evald.engine import Engine
from evald.exposition import build_registry
from evald.http import MetricsServer

#: a bound for the client, so the old behaviour fails the test instead of hanging it
CLIENT_TIMEOUT_S = 60.0


def get(server: MetricsServer, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT_S)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def names(text: str) -> set[str]:
    return {family.name for family in parse_text(text)}


def test_probes_answer_while_the_loop_holds_the_engine() -> None:
    lock = EngineLock()
    engine = Engine(EngineConfig(measures=["RR"], window=60_000, lateness=0), clock=lambda: 0.0)
    registry, _ = build_registry(
        engine, lock=ScrapeLock(lock, wait_s=0.2), ready=lambda: True, process=False
    )
    server = MetricsServer(
        "127.0.0.1:0", registry=registry, ready=lambda: (True, "ok"), healthy=lambda: (True, "ok")
    )
    server.start()
    release, held = threading.Event(), threading.Event()

    def stuck_commit() -> None:
        with lock:
            held.set()
            release.wait()

    loop = threading.Thread(target=stuck_commit)
    loop.start()
    try:
        held.wait()
        # more scrapes than the server has workers, then the probes
        with ThreadPoolExecutor(6) as pool:
            scrapes = [pool.submit(get, server, "/metrics") for _ in range(4)]
            probes = [pool.submit(get, server, path) for path in ("/healthz", "/readyz")]
            assert [f.result()[0] for f in probes] == [200, 200]
            answered = [f.result() for f in scrapes]
        assert all(status == 200 for status, _ in answered)
        # served without the engine's series, with the rest
        assert all("evald_ready" in names(text) for _, text in answered)
        assert all("evald_events" not in names(text) for _, text in answered)
    finally:
        release.set()
        loop.join()
    status, text = get(server, "/metrics")
    assert status == 200 and "evald_events" in names(text)
    server.stop()


def test_the_lock_gives_up_and_says_why() -> None:
    lock = EngineLock()
    scrape = ScrapeLock(lock, wait_s=0.01)
    with scrape:
        pass  # free: taken and given back
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    try:
        try:
            with scrape:
                raise AssertionError("entered a lock another thread holds")
        except EngineBusy as exc:
            assert "held the engine for over 0.01s" in str(exc)
    finally:
        release.set()
        thread.join()
