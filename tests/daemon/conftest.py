"""Fixtures for the daemon tests (the machinery lives in kafka_harness.py and
kafka_instances.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka_harness import Broker, KafkaTools, Tansu, TcpProxy
from kafka_instances import Instance


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One Apache Kafka for the session; tests keep apart by using their own topics and groups.
    Tests that kill or pause a broker use ``private_broker`` instead."""
    instance = Broker(tmp_path_factory.mktemp("kafka"))
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def private_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """An Apache Kafka of the test's own, free to be killed, restarted and paused."""
    instance = Broker(tmp_path_factory.mktemp("kafka-private"))
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="session")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A second Apache Kafka for the session, set up as a default install is: it checks ACLs
    (everything allowed where no ACL names the resource) and creates a topic a client asks
    metadata for (``auto.create.topics.enable=true``, one partition). Tests keep apart by their
    own topics, groups and ACLs on those."""
    instance = Broker(
        tmp_path_factory.mktemp("kafka-acl"),
        settings={
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "true",
            "auto.create.topics.enable": "true",
        },
    )
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def proxied_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, TcpProxy]]:
    """A private broker reachable only through a proxy, whose address it advertises (the
    proxy listens first; it forwards to whichever port the broker starts on)."""
    proxy = TcpProxy(0)
    try:
        instance = Broker(
            tmp_path_factory.mktemp("kafka-proxied"),
            advertised_port=proxy.port,
            on_port=proxy.forward_to,
        )
        try:
            yield instance, proxy
        finally:
            instance.stop()
    finally:
        proxy.stop()


@pytest.fixture
def tansu() -> Iterator[Tansu]:
    """The in-memory tansu broker, for the behaviour only it shows (leaked aborted records)."""
    instance = Tansu()
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic and group names."""
    return f"{time.monotonic_ns() % 10**12:x}"


@pytest.fixture
def kafka_tools(broker: Broker) -> KafkaTools:
    return KafkaTools(broker.bootstrap)


@pytest.fixture
def instances(broker: Broker, unique: str, tmp_path: Path) -> Iterator[Callable[..., Instance]]:
    """Start `evald run` children on the session broker; every one is killed at the end."""
    started: list[Instance] = []

    def start(
        instance: str = "a",
        static: bool = False,
        extra: tuple[str, ...] = (),
        crash_at: str | None = None,
    ) -> Instance:
        started.append(
            Instance(broker.bootstrap, unique, instance, tmp_path, static, extra, crash_at)
        )
        return started[-1]

    try:
        yield start
    finally:
        for inst in started:
            inst.close()
