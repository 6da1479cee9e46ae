"""Fixtures for the daemon tests (the machinery lives in kafka_harness.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kafka_harness import Broker, KafkaTools, TcpProxy, free_port


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """One broker for the session; tests keep apart by using their own topics and groups."""
    instance = Broker()
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def proxied_broker() -> Iterator[tuple[Broker, TcpProxy]]:
    """A private broker reachable only through a proxy, whose address it advertises."""
    proxy_port = free_port()
    instance = Broker(advertised_port=proxy_port)
    proxy = TcpProxy(instance.port, port=proxy_port)
    try:
        yield instance, proxy
    finally:
        proxy.stop()
        instance.stop()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic and group names."""
    return f"{time.monotonic_ns() % 10**12:x}"


@pytest.fixture
def kafka_tools(broker: Broker) -> KafkaTools:
    return KafkaTools(broker.bootstrap)
