"""The test brokers start even when another process takes their port first: the start-up
retries with new ports (a free port is chosen before the process binds it)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import kafka_harness
import pytest
from kafka_harness import Broker, KafkaTools, Tansu, TcpProxy, listens

pytestmark = pytest.mark.kafka


@pytest.fixture
def taken() -> Iterator[socket.socket]:
    """A port another process could have taken: a socket listening on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock


def first_taken(taken: socket.socket, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the harness's first free port the taken one; the ports it chose, in order."""
    real: Callable[[], int] = kafka_harness.free_port
    chosen: list[int] = []

    def free_port() -> int:
        chosen.append(taken.getsockname()[1] if not chosen else real())
        return chosen[-1]

    monkeypatch.setattr(kafka_harness, "free_port", free_port)
    return chosen


# a second JVM start after the failed bind (~30 s): in the slow tier, beside the broker faults
@pytest.mark.chaos
def test_a_broker_whose_port_was_taken_starts_on_another(
    taken: socket.socket, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, unique: str
) -> None:
    chosen = first_taken(taken, monkeypatch)
    broker = Broker(tmp_path / "kafka")
    try:
        assert broker.port == chosen[2] != chosen[0]  # chosen: client, controller, client ...
        assert broker.pid is not None and listens(broker.pid, broker.port)
        tools = KafkaTools(broker.bootstrap)
        tools.create({f"t-{unique}": 1})  # and it works
        tools.produce_raw(f"t-{unique}", [b"x"])
        assert tools.end_offsets(f"t-{unique}") == {0: 1}
    finally:
        broker.stop()


def test_tansu_and_the_proxy_whose_port_was_taken_start_on_another(
    taken: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = first_taken(taken, monkeypatch)
    tansu = Tansu()
    try:
        assert tansu.port == chosen[-1] != chosen[0]
        assert listens(tansu.pid, tansu.port)
    finally:
        tansu.stop()
    chosen.clear()
    proxy = TcpProxy(0)
    try:
        assert proxy.port == chosen[-1] != chosen[0]
        assert listens(os.getpid(), proxy.port)
    finally:
        proxy.stop()
