"""What a bootstrap address does, seen by evald.daemon.reach, and what `evald run` makes of it
(loopback servers, no broker)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka.errors import KafkaConnectionError, KafkaTimeoutError
from settable_clock import SettableClock

from evald.daemon.backoff import Backoff
from evald.daemon.main.runner import Daemon
from evald.daemon.reach import (
    MISDIRECTED_SPAN_S,
    MISDIRECTED_TIMES,
    BrokerUnreachable,
    Diagnosis,
    Misdirected,
    check_resolves,
    diagnose,
    probe,
)
from evald.daemon.repartition.stage import Repartitioner
from evald.daemon.settings import load_settings


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
    diagnosis = diagnose(failed, [away], "PLAINTEXT", threading.Event())
    assert diagnosis is not None and diagnosis.misdirected is None
    assert f"{away} accepts no connection" in diagnosis.hint
    # any other error is not the bootstrap's: nothing to add
    assert diagnose(KafkaConnectionError("reset"), [away], "PLAINTEXT", threading.Event()) is None


def test_a_name_that_resolves_nowhere_fails_at_once_and_one_that_resolves_passes() -> None:
    with pytest.raises(BrokerUnreachable, match=r"no-such\.invalid:9092 does not resolve"):
        check_resolves(["no-such.invalid:9092"])
    check_resolves(["no-such.invalid:9092", "127.0.0.1:9092"])  # one is enough


@contextlib.contextmanager
def http_server(on_connect: Callable[[], None] = lambda: None) -> Iterator[str]:
    """HOST:PORT of a server answering every connection ``HTTP/1.1 400`` (an HTTP listener,
    or a proxy in front of addresses it cannot reach); ``on_connect`` runs first."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    on_connect()
                    conn.recv(100)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def refused() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def failed(servers: list[str]) -> KafkaTimeoutError:
    return KafkaTimeoutError(f"Unable to bootstrap from {servers}")


def test_only_every_address_answering_as_another_service_is_a_verdict() -> None:
    """A stale entry answering HTTP while the brokers restart (refused) is retried: once they
    are up kafka-python bootstraps from them. Before, it was an exit 2."""
    with http_server() as http, http_server() as proxy:
        away = refused()
        stale = diagnose(failed([http, away]), [http, away], "PLAINTEXT", threading.Event())
        both = diagnose(failed([http, proxy]), [http, proxy], "PLAINTEXT", threading.Event())
    assert stale is not None and stale.misdirected is None
    assert f"{http} answers HTTP" in stale.hint and f"{away} accepts no connection" in stale.hint
    assert both is not None and both.misdirected == both.hint


def test_a_verdict_is_advice_only_on_three_failed_bootstraps_in_a_row_over_ten_minutes() -> None:
    """An address may answer HTTP for a while (an egress proxy in front of a broker that is
    down, a pod IP that another pod holds while the broker is rescheduled): one failed
    bootstrap, or three within minutes, is no reason to exit 2."""
    span = MISDIRECTED_SPAN_S
    assert span == 600.0
    judge = Misdirected()
    http = Diagnosis("x answers HTTP", "x answers HTTP")
    retried = [judge.judge(http, t)[0] for t in (0.0, 90.0, span - 1)]
    assert retried == [None, None, None]  # three, but within the span
    assert judge.judge(http, span)[0] is not None
    judge.reset()  # a session got past its bootstrap
    t0 = 2 * span
    assert judge.judge(http, t0)[0] is None
    assert judge.judge(Diagnosis(None, "x refused"), t0 + 30)[0] is None  # not in a row
    later = [t0 + 60, t0 + 80, t0 + 100]
    assert [judge.judge(http, t)[0] is None for t in later] == [True] * 3
    advice, _ = judge.judge(http, t0 + 60 + span)
    assert advice is not None and "point kafka.bootstrap_servers" in advice


@pytest.mark.parametrize("stage", ["main", "repartition"])
def test_evald_run_retries_a_misdirected_bootstrap_then_exits_2_saying_why(
    stage: str, caplog: Any
) -> None:
    """Before, the first failed bootstrap whose address answered HTTP was an exit 2."""
    clock = SettableClock()
    sessions = []
    with http_server() as http:
        loop = stage_for(stage, [http], clock)

        def session() -> None:
            clock.now += MISDIRECTED_SPAN_S * 5 / 12
            sessions.append(getattr(loop, "ready", lambda: (False, ""))()[1])
            raise failed([http])

        loop._session = session  # type: ignore[method-assign]
        with caplog.at_level(logging.INFO, logger="evald.daemon"):
            assert loop.run() == 2
    # the 4th failure: three 5/12 of the span apart span only 5/6 of it
    assert len(sessions) == 4
    if stage == "main":  # /readyz says it meanwhile
        assert "every address answers as another service" in sessions[-1]
    retried = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(retried) == 3 and "every address answers as another service" in retried[-1]
    assert f"{http} answers HTTP" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("stage", ["main", "repartition"])
def test_a_stop_during_the_diagnosis_exits_0(stage: str) -> None:
    """SIGTERM while the bootstrap addresses are probed: before, unseen, and an exit 2."""
    clock = SettableClock()
    loops: list[Any] = []
    armed = threading.Event()
    with http_server(on_connect=lambda: armed.is_set() and loops[0].stop()) as http:
        loop = stage_for(stage, [http], clock)
        loops.append(loop)

        def session() -> None:
            clock.now += MISDIRECTED_SPAN_S  # past the span: the verdict alone would exit 2
            raise failed([http])

        loop._session = session  # type: ignore[method-assign]
        judge = loop.health.misdirected if stage == "main" else loop._misdirected
        verdict = diagnose(failed([http]), [http], "PLAINTEXT", threading.Event())
        assert verdict is not None and verdict.misdirected is not None
        for _ in range(MISDIRECTED_TIMES - 1):  # the same verdicts before: the stop is left
            assert judge.judge(verdict, clock())[0] is None
        judge_alone = Misdirected()  # the control: these verdicts and one more would exit 2
        for t in range(MISDIRECTED_TIMES - 1):
            judge_alone.judge(verdict, clock() + t)
        assert judge_alone.judge(verdict, clock() + 2 * MISDIRECTED_SPAN_S)[0] is not None
        armed.set()  # stopped while probed
        assert loop.run() == 0


def test_a_diagnosis_a_stop_interrupts_returns_nothing() -> None:
    """A probe of a silent listener takes 2 * ANSWER_S; the stop ends the diagnosis first."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    silent = f"127.0.0.1:{listener.getsockname()[1]}"
    held = []  # the accepted connection, kept open and silent

    def accept() -> None:
        held.append(listener.accept()[0])
        stop.set()

    threading.Thread(target=accept, daemon=True).start()
    try:
        assert diagnose(failed([silent]), [silent], "PLAINTEXT", stop) is None
    finally:
        listener.close()
        for conn in held:
            conn.close()


def stage_for(stage: str, servers: list[str], clock: SettableClock) -> Any:
    """The main stage's loop or the repartition stage's, retrying at once."""
    settings = load_settings(
        environ={},
        flags={
            "topics": {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"},
            "kafka": {"bootstrap_servers": servers},
        },
    )
    if stage == "main":
        loop: Any = Daemon(settings, lambda _cb: None, clock=clock)  # type: ignore[arg-type,return-value]
    else:
        loop = Repartitioner(settings, clock=clock)
    loop._backoff = Backoff(0.001, 0.001)
    return loop
