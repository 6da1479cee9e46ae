"""One Apache Kafka node (KRaft, broker and controller combined) on loopback, run as a JVM.

A node runs alone (its own single-voter quorum) or as one voter of a static quorum
(:mod:`deploy.local_kafka.cluster` starts three).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from deploy.local_kafka.fetch import INSTALL_HINT, LocalKafkaError, ensure_libs

LOG4J = Path(__file__).with_name("log4j2.properties")

SINGLE_NODE = {
    # internal topics default to replication factor 3: on one node group joins and
    # init_transactions would wait forever
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "3",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    # a dead producer's transaction is aborted within a second of its timeout, not a minute
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "num.partitions": "1",
    # keep every record: time-based retention goes by the records' own timestamps, and
    # simulated or replayed traffic is stamped in the past (the simulator starts on
    # 2026-01-01), so the default 7 days deletes it, active segment included, within minutes
    "log.retention.ms": "-1",
    # after a kill -9 the restarted node waits for its previous incarnation's registration to
    # expire before it unfences itself (default 9 s)
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "2000",
}
"""Settings every single-node broker gets; callers add or override (e.g. auto-creation)."""


#: Kafka's message when a listener's port is taken (the broker then exits)
BIND_FAILED = re.compile(r"failed to bind to [^\s:]+:(\d+): Address already in use")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def new_cluster_id() -> str:
    """16 random bytes, URL-safe base64 without padding: what ``kafka-storage format`` takes."""
    return base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def java_major(java: str) -> int:
    """The major version of ``java`` (``java -version`` prints e.g. ``"17.0.15"`` on stderr)."""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if match is None:
        raise LocalKafkaError(f"cannot tell the version of {java}: {out.strip()!r}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


class LocalKafka:
    """A single Apache Kafka node whose data lives in ``data_dir``.

    ``start()`` formats the directory on first use, then starts the JVM and waits until an
    admin client answers; ``stop()`` / ``kill()`` end it by PID; ``start()`` again restarts it on
    the same data and ports (a crashed broker's log survives, as in production). Clients
    bootstrap from ``bootstrap``; ``advertised_port`` lets a proxy stand in front of the broker.

    ``quorum`` (``controller.quorum.voters``, e.g. ``1@127.0.0.1:9095,2@...``) makes the node
    ``node_id`` one voter of a static quorum, formatted with the shared ``cluster_id``; without it
    the node is a quorum of its own (``--standalone``).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        advertised_port: int | None = None,
        settings: Mapping[str, str] | None = None,
        heap: str = "512m",
        node_id: int = 1,
        quorum: str | None = None,
        cluster_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.advertised_port = advertised_port or self.port
        self.settings = {**SINGLE_NODE, **(settings or {})}
        self.heap = heap
        self.node_id = node_id
        self.quorum = quorum
        self.cluster_id = cluster_id or new_cluster_id()
        self._clock = clock
        self._proc: subprocess.Popen[bytes] | None = None
        #: the size of each log file at the last launch: what this incarnation wrote follows
        self._log_marks: dict[Path, int] = {}

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.advertised_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running() else None

    @property
    def log_file(self) -> Path:
        """The broker's own log (log4j); the JVM's stdout/stderr go to ``jvm.log`` beside it."""
        return self.data_dir / "server.log"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 300.0) -> None:
        """Start the broker (formatting the data directory first if needed); return when ready."""
        if self.running():
            return
        self.launch()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def launch(self) -> None:
        """Start the JVM without waiting: the voters of a quorum must all be up before any of
        them answers, so a cluster launches every node and then waits for each."""
        if self.running():
            return
        java = shutil.which("java")
        if java is None or java_major(java) < 17:
            raise LocalKafkaError(f"Java >= 17 not found: {INSTALL_HINT}")
        libs = ensure_libs()
        classpath = f"{libs}/*"
        config = self._write_config()
        if not (self.data_dir / "logs" / "meta.properties").exists():
            self._format(java, classpath, config)
        self._log_marks = {path: _size(path) for path in self._logs()}
        jvm_log = (self.data_dir / "jvm.log").open("ab")
        try:
            self._proc = subprocess.Popen(
                [
                    java,
                    f"-Xmx{self.heap}",
                    "-XX:+UseG1GC",
                    "-XX:TieredStopAtLevel=1",  # starts markedly faster; a test broker is idle
                    "-Djava.awt.headless=true",
                    f"-Dlog4j2.configurationFile={LOG4J}",
                    f"-Dkafka.logs.dir={self.data_dir}",
                    "-cp",
                    classpath,
                    "kafka.Kafka",
                    str(config),
                ],
                stdin=subprocess.DEVNULL,
                stdout=jvm_log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        finally:
            jvm_log.close()

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until the broker answers an admin ``describe_cluster`` (its metadata is up)."""
        deadline = self._clock() + timeout
        while True:
            if not self.running():
                raise LocalKafkaError(
                    f"the Kafka broker exited during start-up:\n{self.log_tail()}"
                )
            if self._answers():
                return
            if self._clock() > deadline:
                raise LocalKafkaError(
                    f"the Kafka broker did not answer within {timeout:.0f}s:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown (SIGTERM); SIGKILL if it takes longer than ``timeout``."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGCONT)  # a paused broker cannot shut down
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._proc = None

    def kill(self) -> None:
        """kill -9: the broker dies mid-whatever; its data stays for a restart."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=30)
        self._proc = None

    def pause(self) -> None:
        """SIGSTOP: the broker hangs (connections stay open, nothing answers)."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the JVM output and broker log, for error messages."""
        out: list[str] = []
        for path in (self.data_dir / "jvm.log", self.log_file):
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out += [f"--- {path}", *tail]
        return "\n".join(out)

    def bind_failure(self) -> int | None:
        """The port this incarnation could not listen on ("Address already in use": another
        process took it between the choice of the port and the broker's bind), from its log."""
        for path in self._logs():
            with contextlib.suppress(OSError), path.open("rb") as log:
                log.seek(self._log_marks.get(path, 0))
                found = BIND_FAILED.search(log.read().decode(errors="replace"))
                if found:
                    return int(found.group(1))
        return None

    def formatted_cluster_id(self) -> str:
        """The cluster id the data directory was formatted with (``cluster_id`` before that)."""
        with contextlib.suppress(OSError):
            meta = (self.data_dir / "logs" / "meta.properties").read_text()
            for line in meta.splitlines():
                if line.startswith("cluster.id="):
                    return line.removeprefix("cluster.id=").strip()
        return self.cluster_id

    def _logs(self) -> tuple[Path, Path]:
        return (self.data_dir / "jvm.log", self.log_file)

    def _answers(self) -> bool:
        """An admin ``describe_cluster`` on this node lists at least one broker, and the node
        is this one: a process that took the port before this broker bound it may be another
        Kafka (its cluster id differs)."""
        cluster = self.describe_cluster()
        return bool(cluster.get("brokers")) and cluster.get("cluster_id") == (
            self.formatted_cluster_id()
        )

    def describe_cluster(self) -> dict:
        """This node's answer to an admin ``describe_cluster``; empty when it does not answer."""
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        try:
            admin = KafkaAdminClient(
                bootstrap_servers=f"127.0.0.1:{self.port}", request_timeout_ms=3000
            )
        except (KafkaError, OSError):
            return {}
        try:
            return dict(admin.describe_cluster())
        except (KafkaError, OSError):
            return {}
        finally:
            admin.close()

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        quorum = (
            {"controller.quorum.voters": self.quorum}
            if self.quorum
            else {"controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}"}
        )
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            **quorum,
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.advertised_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir / "logs"),
            **self.settings,
        }
        path = self.data_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _format(self, java: str, classpath: str, config: Path) -> None:
        # a static quorum's voters are listed in the config; a lone node formats itself as one
        standalone = [] if self.quorum else ["--standalone"]
        proc = subprocess.run(
            [
                java,
                f"-Dlog4j2.configurationFile={LOG4J}",
                f"-Dkafka.logs.dir={self.data_dir}",
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                *standalone,
                # one argument: an id starting with "-" (1 in 64) would read as an option
                f"--cluster-id={self.cluster_id}",
                "-c",
                str(config),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise LocalKafkaError(
                f"formatting {self.data_dir} failed:\n{proc.stdout}{proc.stderr}".rstrip()
            )


def _die_with_parent() -> None:
    """In the child: be killed when the parent dies, so no broker outlives its test run."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
