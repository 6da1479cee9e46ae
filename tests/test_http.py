"""The HTTP endpoints: address parsing, /metrics negotiation, health and readiness, lifecycle."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from evald.config import EngineConfig
from evald.engine import Engine
from evald.exposition import build_registry
from evald.http import AddressError, Heartbeat, Limits, MetricsServer, parse_address, raise_fd_limit

TIMEOUT = 10


def request(
    server: MetricsServer,
    path: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    host = server.url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
    conn = http.client.HTTPConnection(host, server.port, timeout=TIMEOUT)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        conn.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., MetricsServer]]:
    """Start servers on free loopback ports; every one is stopped at teardown."""
    started: list[MetricsServer] = []

    def start(address: str = "127.0.0.1:0", **kwargs: object) -> MetricsServer:
        server = MetricsServer(address, **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


# --- addresses -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":9464", ("0.0.0.0", 9464)),
        ("0.0.0.0:9464", ("0.0.0.0", 9464)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9464", ("::1", 9464)),
        ("[::]:80", ("::", 80)),
        ("[0:0:0:0:0:0:0:1]:65535", ("::1", 65535)),
        ("localhost:9464", ("localhost", 9464)),
        ("  metrics.internal:1 ", ("metrics.internal", 1)),
    ],
)
def test_parse_address_accepts_the_documented_forms(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "empty"),
        ("9464", "expected HOST:PORT"),
        ("127.0.0.1", "expected HOST:PORT"),
        ("::1:9464", "IPv6 needs brackets"),
        ("[::1:9464", "expected HOST:PORT"),
        ("127.0.0.1:", "is not a number"),
        ("127.0.0.1:http", "is not a number"),
        (":-1", "is not a number"),
        ("127.0.0.1:65536", "above 65535"),
        ("[fe80::zz]:1", "bad IPv6 address"),
        ("256.1.1.1:9464", "bad host"),
        ("host name:9464", "bad host"),
        ("[::1]:٣", "is not a number"),
    ],
)
def test_parse_address_rejects_bad_forms_with_a_clear_message(text: str, complaint: str) -> None:
    with pytest.raises(AddressError) as info:
        parse_address(text)
    assert complaint in str(info.value)
    assert isinstance(info.value, ValueError)


def test_bad_address_fails_at_construction_not_at_first_scrape() -> None:
    with pytest.raises(AddressError):
        MetricsServer("no-port-here")


# --- health and readiness -------------------------------------------------------------------


def test_readyz_follows_the_ready_callable_and_explains_why_not(serve) -> None:
    state: dict[str, object] = {"ready": (False, "restoring partition 3")}
    server = serve(ready=lambda: state["ready"])
    status, headers, body = request(server, "/readyz")
    assert status == 503
    assert body == b"restoring partition 3\n"
    assert headers["content-type"].startswith("text/plain")
    state["ready"] = True
    assert request(server, "/readyz")[:3:2] == (200, b"ok\n")
    state["ready"] = False
    assert request(server, "/readyz")[:3:2] == (503, b"not ready\n")


def test_healthz_follows_the_healthy_callable(serve) -> None:
    alive = threading.Event()
    server = serve(healthy=alive.is_set)
    assert request(server, "/healthz")[0] == 503
    alive.set()
    assert request(server, "/healthz")[:3:2] == (200, b"ok\n")


def test_a_raising_check_reports_failure_and_the_server_keeps_serving(serve) -> None:
    def broken() -> bool:
        raise RuntimeError("consumer gone")

    server = serve(ready=broken)
    status, _, body = request(server, "/readyz")
    assert status == 503
    assert b"RuntimeError: consumer gone" in body
    assert request(server, "/healthz")[0] == 200


def test_a_malformed_check_result_reports_failure(serve) -> None:
    server = serve(ready=lambda: (True, "ok", "extra"))
    status, _, body = request(server, "/readyz")
    assert status == 503
    assert b"ready check failed: ValueError" in body


def test_heartbeat_goes_stale_by_the_injected_clock_and_reports_stop() -> None:
    now = [1000.0]
    beat = Heartbeat(max_age=30, clock=lambda: now[0])
    assert beat() == (True, "ok")
    now[0] += 30
    assert beat()[0] is True
    now[0] += 1
    ok, reason = beat()
    assert not ok
    assert "silent for 31s" in reason
    beat.beat()
    assert beat()[0] is True
    beat.stop()
    assert beat() == (False, "processing loop stopped")


def test_heartbeat_rejects_a_non_positive_age() -> None:
    with pytest.raises(ValueError, match="max_age"):
        Heartbeat(max_age=0)


def test_healthz_served_from_a_heartbeat(serve) -> None:
    now = [0.0]
    beat = Heartbeat(max_age=5, clock=lambda: now[0])
    server = serve(healthy=beat)
    assert request(server, "/healthz")[0] == 200
    now[0] = 6.0
    status, _, body = request(server, "/healthz")
    assert status == 503
    assert b"silent" in body


# --- routing ----------------------------------------------------------------------------------


def test_unknown_paths_are_404_and_writes_are_405(serve) -> None:
    server = serve()
    assert request(server, "/nope")[0] == 404
    assert request(server, "/metrics/extra")[0] == 404
    status, headers, _ = request(server, "/metrics", method="POST")
    assert status == 405
    assert headers["allow"] == "GET, HEAD"


def test_a_refused_post_body_is_not_read_as_the_next_request(serve) -> None:
    server = serve(ready=lambda: True)
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as conn:
        smuggled = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
        head = f"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: {len(smuggled)}\r\n\r\n"
        conn.sendall(head.encode() + smuggled)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    assert received.startswith(b"HTTP/1.1 405")
    assert b"404" not in received  # the connection closed after the 405


def test_trailing_slash_and_query_strings_are_tolerated(serve) -> None:
    server = serve(ready=lambda: True)
    assert request(server, "/readyz/")[0] == 200
    assert request(server, "/healthz?verbose=1")[0] == 200


# --- /metrics ---------------------------------------------------------------------------------


T0 = 1_763_683_200_000
RR_LABELS = (("arm", "control"), ("measure", "RR"), ("model", "__none__"), ("surface", "__none__"))


def engine_registry(
    lock: threading.Lock | None = None, ready: Callable[[], bool] | None = None
) -> CollectorRegistry:
    """A real Engine fed three impressions (RR = 1, 1/2 and 0 by where the click landed),
    drained, behind the registry the commands build."""
    engine = Engine(
        EngineConfig(measures=["RR"], window=60_000, lateness=0, max_event_lead=None),
        clock=lambda: 0.0,
    )
    clicked_rank = {"a": 1, "b": 2, "c": None}
    for i, (rid, rank) in enumerate(clicked_rank.items()):
        items = ["x", "y", "z"]
        doc = {"request_id": rid, "ts": T0 + i, "items": items, "labels": {"arm": "control"}}
        engine.feed(json.dumps(doc).encode())
        if rank is not None:
            click = {"request_id": rid, "ts": T0 + i + 5, "item": items[rank - 1]}
            engine.feed(json.dumps({**click, "action": "click"}).encode())
    engine.drain()
    registry, _ = build_registry(engine, lock=lock, ready=ready, process=False)
    return registry


def parsed(body: bytes, openmetrics: bool = False) -> dict[tuple[str, tuple], float]:
    parse = parse_om if openmetrics else parse_text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parse(body.decode())
        for s in family.samples
    }


def test_metrics_defaults_to_the_text_format(serve) -> None:
    server = serve(registry=engine_registry())
    status, headers, body = request(server, "/metrics")
    assert status == 200
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert int(headers["content-length"]) == len(body)
    assert parsed(body)[("evald_measure_count", RR_LABELS)] == 3


def test_metrics_honours_openmetrics_in_accept_as_prometheus_sends_it(serve) -> None:
    server = serve(registry=engine_registry())
    accept = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
        "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    status, headers, body = request(server, "/metrics", headers={"Accept": accept})
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    types = {f.name: f.type for f in parse_om(body.decode())}
    assert types["evald_events"] == "counter"
    assert types["evald_measure"] == "histogram"
    assert parsed(body, openmetrics=True)[("evald_measure_sum", RR_LABELS)] == 1.5


def test_metrics_gzip_when_asked(serve) -> None:
    server = serve(registry=engine_registry())
    _, _, plain = request(server, "/metrics")
    status, headers, body = request(server, "/metrics", headers={"Accept-Encoding": "gzip"})
    assert status == 200
    assert headers["content-encoding"] == "gzip"
    assert gzip.decompress(body) == plain


def test_metrics_head_sends_headers_only(serve) -> None:
    server = serve(registry=engine_registry())
    status, headers, body = request(server, "/metrics", method="HEAD")
    assert status == 200
    assert body == b""
    assert int(headers["content-length"]) > 0


def test_metrics_name_filter(serve) -> None:
    server = serve(registry=engine_registry())
    _, _, body = request(server, "/metrics?name[]=evald_measure_count")
    assert set(parsed(body)) == {("evald_measure_count", RR_LABELS)}


def test_a_failing_collector_is_a_500_for_that_scrape_only(serve) -> None:
    registry = engine_registry()

    class Exploding:
        armed = False

        def collect(self):
            if self.armed:
                raise RuntimeError("boom")
            return iter(())

    exploding = Exploding()
    registry.register(exploding)
    exploding.armed = True
    server = serve(registry=registry)
    assert request(server, "/metrics")[0] == 500
    exploding.armed = False
    assert request(server, "/metrics")[0] == 200


def test_concurrent_scrapes_all_succeed(serve) -> None:
    server = serve(registry=engine_registry())
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: request(server, "/metrics"), range(32)))
    assert {status for status, _, _ in results} == {200}


# --- lifecycle ----------------------------------------------------------------------------------


def test_port_zero_binds_a_free_port_and_stop_releases_it() -> None:
    server = MetricsServer("127.0.0.1:0")
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.port
    server.start()
    try:
        port = server.port
        assert port > 0
        assert server.url == f"http://127.0.0.1:{port}"
        assert request(server, "/healthz")[0] == 200
    finally:
        server.stop()
    server.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT).close()
    again = MetricsServer(f"127.0.0.1:{port}")
    again.start()
    try:
        assert again.port == port
    finally:
        again.stop()


def test_a_taken_port_fails_loudly_at_start(serve) -> None:
    first = serve()
    second = MetricsServer(f"127.0.0.1:{first.port}")
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{first.port}"):
        second.start()


def test_context_manager_starts_and_stops() -> None:
    with MetricsServer("127.0.0.1:0") as server:
        port = server.port
        assert request(server, "/healthz")[0] == 200
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT).close()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host")
def test_ipv6_loopback(serve) -> None:
    server = serve("[::1]:0")
    assert server.url == f"http://[::1]:{server.port}"
    assert request(server, "/healthz")[0] == 200


# --- end to end with a real engine ------------------------------------------------------------


def test_metrics_serves_a_real_engine_over_http(serve) -> None:
    lock = threading.Lock()
    server = serve(registry=engine_registry(lock, ready=lambda: True), ready=lambda: True)
    accept = "application/openmetrics-text;version=1.0.0"
    for headers in ({}, {"Accept": accept}):
        status, got_headers, body = request(server, "/metrics", headers=headers)
        assert status == 200
        openmetrics = got_headers["content-type"].startswith("application/openmetrics-text")
        assert openmetrics == ("Accept" in headers)
        values = parsed(body, openmetrics)
        assert values[("evald_measure_count", RR_LABELS)] == 3
        assert values[("evald_measure_sum", RR_LABELS)] == 1.5
        assert values[("evald_measure_bucket", tuple(sorted((*RR_LABELS, ("le", "0.4")))))] == 1
        assert values[("evald_measure_bucket", tuple(sorted((*RR_LABELS, ("le", "0.5")))))] == 2
        assert values[("evald_ready", ())] == 1
        abandoned = (RR_LABELS[0], *RR_LABELS[2:])
        assert values[("evald_impressions_abandoned_total", abandoned)] == 1


# --- hostile clients: limits and timeouts -------------------------------------------------------


def read_until_closed(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    received = b""
    try:
        while chunk := conn.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def test_a_silent_client_is_closed_after_the_header_timeout(serve) -> None:
    server = serve(limits=Limits(header_timeout_s=0.2))
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        assert read_until_closed(conn) == b""


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout(serve) -> None:
    server = serve(limits=Limits(idle_timeout_s=0.2))
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_until_closed(conn).startswith(b"HTTP/1.1 200 OK\r\n")


def test_keep_alive_serves_several_requests_and_http10_closes(serve) -> None:
    server = serve()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    try:
        for _ in range(3):
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            assert response.status == 200 and response.read() == b"ok\n"
    finally:
        conn.close()
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as raw:
        raw.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        answer = read_until_closed(raw)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok\n")


def test_past_the_cap_the_longest_waiting_connections_are_dropped(serve) -> None:
    server = serve(limits=Limits(max_connections=4))
    slow = [socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) for _ in range(8)]
    try:
        for conn in slow:
            conn.sendall(b"GET /metrics HTTP/1.1\r\n")
        # the four oldest are closed; a fresh request still gets its answer
        for conn in slow[:4]:
            assert read_until_closed(conn) == b""
        assert request(server, "/healthz")[0] == 200
        assert server.dropped >= 5  # four slow ones plus one for the request just made
    finally:
        for conn in slow:
            conn.close()


def test_a_connection_being_answered_is_never_the_one_dropped(serve) -> None:
    release = threading.Event()
    entered = threading.Event()

    def slow_ready() -> bool:
        entered.set()
        release.wait(TIMEOUT)
        return True

    server = serve(ready=slow_ready, limits=Limits(max_connections=2))
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(request, server, "/readyz")
        assert entered.wait(TIMEOUT)
        others = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
        try:
            for conn in others[:2]:
                assert read_until_closed(conn) == b""  # dropped: they were only waiting
            release.set()
            assert pending.result(TIMEOUT)[0] == 200
        finally:
            for conn in others:
                conn.close()


def test_an_oversized_request_head_is_431(serve) -> None:
    server = serve(limits=Limits(max_head_bytes=1024))
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")
        assert read_until_closed(conn).startswith(b"HTTP/1.1 431 ")


@pytest.mark.parametrize(
    "head",
    [b"NONSENSE\r\n\r\n", b"GET /metrics HTTP/2.0\r\n\r\n", b"GET / HTTP/1.1\r\nno colon\r\n\r\n"],
)
def test_a_malformed_request_is_400_and_closed(serve, head: bytes) -> None:
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as conn:
        conn.sendall(head)
        assert read_until_closed(conn).startswith(b"HTTP/1.1 400 ")
    assert request(server, "/healthz")[0] == 200


def test_start_raises_the_soft_file_limit_to_the_hard_one(serve) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip("needs a finite hard limit above 256")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        serve()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
        assert raise_fd_limit() == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("framing", ["Transfer-Encoding: chunked", "Content-Length: 34"])
def test_a_body_on_any_request_closes_the_connection_after_the_answer(serve, framing: str) -> None:
    import bcrypt

    from evald.webconfig import BasicAuth, WebConfig

    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    for server in (serve(), serve(web=WebConfig(auth=BasicAuth({"u": hashed})))):
        smuggled = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"  # 34 bytes
        body = b"22\r\n" + smuggled + b"\r\n0\r\n\r\n" if "chunked" in framing else smuggled
        with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as conn:
            conn.sendall(f"GET /healthz HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode() + body)
            received = read_until_closed(conn)
        assert received.startswith(b"HTTP/1.1 200 OK")
        assert received.count(b"HTTP/1.1") == 1, received
        with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as conn:
            conn.sendall(f"POST /metrics HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode() + body)
            received = read_until_closed(conn)
        assert received.count(b"HTTP/1.1") == 1, received


def test_responses_carry_date_and_server_headers(serve) -> None:
    from email.utils import parsedate_to_datetime

    _, headers, _ = request(serve(), "/healthz")
    assert headers["server"] == "evald"
    assert parsedate_to_datetime(headers["date"]).tzinfo is not None
