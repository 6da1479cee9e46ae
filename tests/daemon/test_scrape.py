"""/healthz and /readyz keep answering while the poll loop holds the engine (a restore reading
from a slow broker), however many scrapes arrive meanwhile; and a scrape that gives up waiting
for the engine gets the last complete page, not a page without the engine's series."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import make_settings, names, running, settled
from prometheus_client.parser import text_string_to_metric_families as parse_text

from evald.config import EngineConfig
from evald.daemon.main.engine_lock import EngineLock
from evald.daemon.scrape import SCRAPE_WAIT_S, EngineBusy, ScrapeLock
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


def families(text: str) -> set[str]:
    return {family.name for family in parse_text(text)}


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in parse_text(text)
        for sample in family.samples
    }


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
        assert all("evald_ready" in families(text) for _, text in answered)
        # never a complete page before: nothing to serve instead of the engine's series
        assert all("evald_events" not in families(text) for _, text in answered)
    finally:
        release.set()
        loop.join()
    status, text = get(server, "/metrics")
    assert status == 200 and "evald_events" in families(text)
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


class FeedGate:
    """Holds the loop's next engine feed (inside its lock, as a large poll holds it) after
    ``armed`` is set, until ``release`` is."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()


@pytest.fixture
def feed_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[FeedGate]:
    gate = FeedGate()
    original = Engine.feed_batch

    def gated(self: Engine, *args: Any, **kwargs: Any) -> Any:
        if gate.armed.is_set():
            gate.armed.clear()
            gate.entered.set()
            gate.release.wait(120)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "feed_batch", gated)
    yield gate
    gate.release.set()


AGE = "evald_engine_series_age_seconds"


@pytest.mark.kafka
def test_a_scrape_while_a_poll_holds_the_engine_gets_the_last_complete_page(
    broker: Broker, kafka_tools: KafkaTools, unique: str, feed_gate: FeedGate
) -> None:
    """During a 2M-record flood 8 of 20 scrapes came back without the engine's series (the
    scrape's 1 s wait for the engine ran out): dashboards and rate() saw gaps. The daemon on
    Apache Kafka, wired to its registry and server as `evald run` wires them."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=1500, seed=3)
    settings = make_settings(broker.bootstrap, unique)
    registry, collector = build_registry(None, process=False)
    server = MetricsServer("127.0.0.1:0", registry=registry)

    def on_engine(engine: Engine) -> None:
        collector.engine = engine

    with running(settings, on_engine=on_engine) as daemon, server:
        collector.lock = ScrapeLock(daemon.lock)  # evald run's: gives up after 1 s
        server.ready = daemon.ready
        wait_until(lambda: settled(daemon, kafka_tools, unique), 90, "the daemon to settle")
        status, complete = get(server, "/metrics")
        assert status == 200 and samples(complete)[(AGE, frozenset())] == 0
        feed_gate.armed.set()
        kafka_tools.produce_sim(
            topics["impressions"], topics["feedback"], events=1500, seed=3, skip=1500
        )
        assert feed_gate.entered.wait(60), "the loop fed nothing new"
        try:  # the loop holds the engine, inside a feed
            status, stale = get(server, "/metrics")
            assert get(server, "/healthz")[0] == 200
        finally:
            feed_gate.release.set()
        assert status == 200
        page = samples(stale)
        assert page.pop((AGE, frozenset())) >= SCRAPE_WAIT_S
        engine_series = {key for key in samples(complete) if key[0].startswith("evald_")}
        assert {k: v for k, v in page.items() if k in engine_series} == {
            k: v for k, v in samples(complete).items() if k in engine_series and k[0] != AGE
        }
        wait_until(lambda: settled(daemon, kafka_tools, unique), 90, "the feed to finish")
        fresh = samples(get(server, "/metrics")[1])
        assert fresh[(AGE, frozenset())] == 0
        events = "evald_events_total"
        assert sum(v for k, v in fresh.items() if k[0] == events) > sum(
            v for k, v in page.items() if k[0] == events
        )
