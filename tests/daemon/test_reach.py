"""What a bootstrap address does, seen by evald.daemon.reach (loopback servers, no broker)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from kafka.errors import KafkaConnectionError, KafkaTimeoutError

from evald.daemon.reach import BrokerUnreachable, check_resolves, diagnose, probe


@pytest.fixture
def answering(request: pytest.FixtureRequest) -> Iterator[str]:
    """HOST:PORT of a server that sends ``request.param`` to whoever connects, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(100)
            conn.sendall(request.param)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("answering", "kind", "says"),
    [
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "other", "answers HTTP"),
        (b"\x15\x03\x03\x00\x02\x02\x46", "other", "kafka.security_protocol"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "other", "not Kafka"),
        (b"\x00\x00\x00\x0a\x65\x76\x61\x64\x00\x00", "kafka", "answered ApiVersions"),
        (b"", "kafka", "did not answer"),  # closed: left to the clients, which retry
    ],
    indirect=["answering"],
)
def test_what_an_address_answers_decides_what_it_is(answering: str, kind: str, says: str) -> None:
    found = probe(answering, "PLAINTEXT", 5.0)
    assert found.kind == kind and says in found.why


def test_a_failed_bootstrap_on_a_port_nothing_listens_on_is_retried_with_the_reason() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        away = f"127.0.0.1:{sock.getsockname()[1]}"
    failed = KafkaTimeoutError(f"Unable to bootstrap from ['{away}']")
    diagnosis = diagnose(failed, [away], "PLAINTEXT")
    assert diagnosis is not None and diagnosis.advice is None
    assert f"{away} accepts no connection" in diagnosis.hint
    # any other error is not the bootstrap's: nothing to add
    assert diagnose(KafkaConnectionError("reset"), [away], "PLAINTEXT") is None


def test_a_name_that_resolves_nowhere_fails_at_once_and_one_that_resolves_passes() -> None:
    with pytest.raises(BrokerUnreachable, match=r"no-such\.invalid:9092 does not resolve"):
        check_resolves(["no-such.invalid:9092"])
    check_resolves(["no-such.invalid:9092", "127.0.0.1:9092"])  # one is enough
