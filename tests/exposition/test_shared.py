"""Concurrent scrapes of the same output share one rendering; different outputs do not."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry, Gauge

from evald.exposition import (
    Encoder,
)

from .support import (
    OPENMETRICS,
)


class BlockingCollector:
    """Counts its collections; each one waits for ``release`` so scrapes can pile up on it."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.release = threading.Event()
        self.fail = fail
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Gauge]:
        with self._lock:
            self.calls += 1
        self.release.wait()
        if self.fail:
            raise RuntimeError("collector broke")
        gauge = Gauge("bench", "doc", registry=None)
        gauge.set(self.calls)
        return gauge.collect()


def wait_for(predicate, what: str) -> None:
    """Wait for a condition other threads bring about (no fixed sleeps; fails, never hangs)."""
    deadline = time.monotonic() + 60
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened within 60 s: {what}")
        time.sleep(0.005)


def test_concurrent_scrapes_share_one_rendering_and_later_ones_render_afresh() -> None:
    collector = BlockingCollector()
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    encoder = Encoder()
    bodies: list[bytes] = []
    scrapers = [
        threading.Thread(target=lambda: bodies.append(encoder.encode(registry)[0]), daemon=True)
        for _ in range(6)
    ]
    for thread in scrapers:
        thread.start()
    try:
        wait_for(
            lambda: collector.calls == 1 and encoder.shared.waiting() == 5, "5 waiting scrapers"
        )
    finally:
        collector.release.set()
    for thread in scrapers:
        thread.join(timeout=60)
    assert collector.calls == 1 and encoder.renders == 1
    assert len(bodies) == 6 and len(set(bodies)) == 1 and b"bench 1.0" in bodies[0]
    # nothing is kept after the rendering: the next scrape sees the state of its own time
    assert b"bench 2.0" in encoder.encode(registry)[0]
    assert collector.calls == 2
    assert encoder.shared.waiting() == 0


def test_scrapes_of_different_outputs_do_not_share() -> None:
    collector = BlockingCollector()
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    encoder = Encoder()
    kinds: list[str] = []
    threads = [
        threading.Thread(
            target=lambda a=accept: kinds.append(encoder.encode(registry, a)[1]), daemon=True
        )
        for accept in (None, OPENMETRICS)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: collector.calls == 2, "one rendering per format")
    finally:
        collector.release.set()
    for thread in threads:
        thread.join(timeout=60)
    assert encoder.shared.waiting() == 0
    assert sorted(kinds)[0].startswith("application/openmetrics-text")


def test_a_failed_shared_rendering_fails_every_scraper_that_waited_for_it() -> None:
    collector = BlockingCollector(fail=True)
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    encoder = Encoder()
    errors: list[BaseException] = []

    def scrape_once() -> None:
        try:
            encoder.encode(registry)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=scrape_once, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: collector.calls == 1 and encoder.shared.waiting() == 2, "2 waiting")
    finally:
        collector.release.set()
    for thread in threads:
        thread.join(timeout=60)
    assert len(errors) == 3 and collector.calls == 1
    collector.fail = False
    assert b"bench 2.0" in encoder.encode(registry)[0]  # the next scrape renders again
