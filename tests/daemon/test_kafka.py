"""`evald run` against Apache Kafka 4.3.1 on loopback (deploy.local_kafka).

The reference for every comparison is one uninterrupted Engine fed the same records in the
daemon's documented per-partition order. The oracle: the results topic read with
``read_committed`` and **no de-duplication** holds every expected request_id exactly once with
the expected values, nothing else. One test runs on tansu, the in-memory broker that leaks
aborted records, to keep the window aggregates' protection against such copies covered
(docs/design.md, "What real Kafka changed").
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from child_processes import die_with_parent
from kafka_harness import (
    ENGINE,
    Broker,
    CommittedReader,
    KafkaTools,
    Tansu,
    TcpProxy,
    free_port,
    wait_until,
)

from evald.daemon.crash import CRASH_ENV
from evald.daemon.runner import Daemon
from evald.daemon.settings import Settings, load_settings
from evald.engine import Engine

pytestmark = pytest.mark.kafka

# a crashed owner's open transaction blocks read_committed readers and a new owner's offset fetch
# until the coordinator aborts it: ~10 s keeps the takeover tests short
KAFKA = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000, "transaction_timeout_ms": 10000}


def names(unique: str) -> dict[str, str]:
    return {
        "impressions": f"imp-{unique}",
        "feedback": f"fb-{unique}",
        "results": f"res-{unique}",
        "dlq": f"dlq-{unique}",
    }


def make_settings(bootstrap: str, unique: str, instance: str = "a", **daemon: Any) -> Settings:
    return load_settings(
        environ={},
        flags={
            "kafka": {"bootstrap_servers": bootstrap, **KAFKA},
            "topics": names(unique),
            "daemon": {
                "group_id": f"g-{unique}",
                "instance_id": instance,
                "commit_interval_ms": 300,
                "metrics_address": "127.0.0.1:0",
                "retry_backoff_initial_ms": 100,
                "retry_backoff_max_ms": 1000,
                **daemon,
            },
            "engine": ENGINE,
        },
    )


def run_argv(bootstrap: str, unique: str, metrics_address: str) -> list[str]:
    """`python -m evald run` on the test's topics and group."""
    topics = names(unique)
    return [
        sys.executable,
        "-m",
        "evald",
        "run",
        "--bootstrap-servers",
        bootstrap,
        "--impressions-topic",
        topics["impressions"],
        "--feedback-topic",
        topics["feedback"],
        "--results-topic",
        topics["results"],
        "--dlq-topic",
        topics["dlq"],
        "--group-id",
        f"g-{unique}",
        "--metrics-address",
        metrics_address,
    ]


@contextlib.contextmanager
def running(settings: Settings, **kwargs: Any) -> Iterator[Daemon]:
    """An in-process daemon on a thread, always stopped and joined."""
    config = settings.engine_config()
    daemon = Daemon(settings, lambda on_result: Engine(config, on_result=on_result), **kwargs)
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(daemon.run()), daemon=True)
    thread.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), "daemon did not stop within 60s"
    assert status == [0]


def settled(daemon: Daemon, tools: KafkaTools, unique: str) -> bool:
    """Every input record fed to the engine and everything finalized committed."""
    topics = names(unique)
    if not daemon.ready()[0]:
        return False
    ends = {
        kind: tools.end_offsets(topic)
        for kind, topic in (("impression", topics["impressions"]), ("feedback", topics["feedback"]))
    }
    with daemon.lock:  # a consistent view: not in the middle of a cycle or a rebalance
        for kind, offsets in ends.items():
            for p, end in offsets.items():
                part = daemon.inputs.parts.get(p)
                if part is None or not part.restored or part.fed_next.get(kind) != end:
                    return False
        return not daemon.transaction.open and not any(
            p.dirty for p in daemon.inputs.parts.values()
        )


def results_by_id(
    tools: KafkaTools, topic: str, *, committed: bool = True
) -> dict[str, list[dict[str, Any]]]:
    """Every result on ``topic`` by request_id, read as a downstream consumer would
    (``read_committed``) unless told otherwise; copies are kept, not merged."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in tools.read(topic, committed=committed):
        doc = json.loads(record.value)
        assert record.key == doc["request_id"].encode()
        out[doc["request_id"]].append(doc)
    return out


def assert_exactly_once(
    got: dict[str, list[dict[str, Any]]],
    expected: dict[str, Any],
    *,
    allow_identical_copies: bool = False,
) -> int:
    """Each expected request_id present once with the expected values, nothing else; returns
    how many extra identical copies were seen (only tansu, which leaks aborted transactions,
    is allowed any)."""
    assert expected, "the reference finalized nothing: the test data is too short"
    assert set(got) == set(expected), (
        f"missing {len(set(expected) - set(got))}, unexpected {len(set(got) - set(expected))}"
    )
    copies = 0
    for request_id, docs in got.items():
        for doc in docs:
            assert doc == expected[request_id], request_id
        copies += len(docs) - 1
    if not allow_identical_copies:
        assert copies == 0
    return copies


def assert_seen_during_chaos_stands(
    records: list, expected: dict[str, Any], tools: KafkaTools, topic: str
) -> int:
    """What a read_committed consumer saw while things crashed: each result at most once,
    each equal to the uninterrupted run's (so none is later retracted or doubled). A failure
    says where each offending record sits now: still on the log with the same bytes (an
    aborted record shown as committed) or gone (the log lost a record it had served)."""
    seen: dict[str, list[Any]] = defaultdict(list)
    for record in records:
        seen[json.loads(record.value)["request_id"]].append(record)
    assert seen, "the concurrent reader saw nothing: the test is not effective"
    bad = [
        r
        for request_id, rs in seen.items()
        for r in rs
        if len(rs) > 1 or json.loads(r.value) != expected.get(request_id)
    ]
    if bad:
        log = {(r.partition, r.offset): r.value for r in tools.read(topic)}
        final = {(r.partition, r.offset) for r in tools.read(topic, committed=True)}
        where = [
            (
                r.partition,
                r.offset,
                "committed now" if (r.partition, r.offset) in final else "not committed now",
                "same bytes on the log" if log.get((r.partition, r.offset)) == r.value else "gone",
            )
            for r in bad[:5]
        ]
        pytest.fail(f"{len(bad)} results seen during the chaos do not stand, e.g. {where}")
    return len(seen)


def assert_windows_equal(rows: list[dict[str, Any]], reference: Engine) -> None:
    """Window aggregates equal the uninterrupted engine's (sums up to float re-association)."""

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return (
            row["window"],
            row["start_ms"],
            tuple(sorted(row["labels"].items())),
            row["measure"],
        )

    want = {key(r): r for r in (row.to_json() for row in reference.window_rows(last_only=False))}
    have = {key(r): r for r in rows}
    assert want, "no complete window in the reference: the test data is too short"
    assert set(have) == set(want)
    for k, row in want.items():
        assert have[k]["count"] == row["count"], k
        assert math.isclose(have[k]["sum"], row["sum"], rel_tol=1e-9, abs_tol=1e-9), k
        assert math.isclose(
            have[k]["sum_squares"], row["sum_squares"], rel_tol=1e-9, abs_tol=1e-9
        ), k


def read_windows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def assert_matches_an_uninterrupted_run(
    kafka_tools: KafkaTools, unique: str, windows: Path, *, leaky_broker: bool = False
) -> int:
    """Results read_committed exactly once (identical copies allowed only on a broker that
    leaks aborted records) and the window rows equal to one engine fed every record; returns
    the copies seen."""
    topics = names(unique)
    expected, reference = kafka_tools.expected(
        make_settings(kafka_tools.bootstrap, unique).engine_config(),
        topics["impressions"],
        topics["feedback"],
    )
    copies = assert_exactly_once(
        results_by_id(kafka_tools, topics["results"], committed=not leaky_broker),
        expected,
        allow_identical_copies=leaky_broker,
    )
    assert_windows_equal(read_windows(windows), reference)
    return copies


# -- in-process ----------------------------------------------------------------------------


def test_end_to_end_equals_uninterrupted_engine(
    broker: Broker, kafka_tools: KafkaTools, unique: str, tmp_path: Path
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 3, topics["feedback"]: 3})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=5000, seed=1)
    windows = tmp_path / "windows.jsonl"
    settings = make_settings(broker.bootstrap, unique, windows_file=str(windows))
    with running(settings) as daemon:
        wait_until(lambda: settled(daemon, kafka_tools, unique), 90, "the daemon to settle")
        # lag is refreshed once per commit interval, so it reaches 0 at the probe after the
        # last record was fed, which can come after the daemon has settled
        wait_until(
            lambda: daemon.stats.lag and all(v == 0 for v in daemon.stats.lag.values()),
            30,
            "the reported lag to reach 0",
        )
    expected, reference = kafka_tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    got = results_by_id(kafka_tools, topics["results"])
    assert_exactly_once(got, expected)
    assert daemon.stats.results_produced == len(expected)
    assert_windows_equal(read_windows(windows), reference)


def test_malformed_records_go_to_the_dlq_and_the_daemon_keeps_going(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    bad_impressions = [b"not json", b'{"request_id": 5}', b"[1,2]"]
    bad_feedback = [b'{"request_id":"x","ts":1,"item":"i","action":"teleport"}', b"\xff\xfe"]
    kafka_tools.produce_raw(topics["impressions"], bad_impressions, timestamp_ms=1)
    kafka_tools.produce_raw(topics["feedback"], bad_feedback, timestamp_ms=1)
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=1500, seed=2)
    settings = make_settings(broker.bootstrap, unique)
    with running(settings) as daemon:
        wait_until(
            lambda: settled(daemon, kafka_tools, unique) and daemon.stats.results_produced > 0,
            90,
            "results after the bad records",
        )
        dlq = wait_until(
            lambda: [
                r
                for r in kafka_tools.read(topics["dlq"])
                if dict(r.headers)["evald-source-offset"] in (b"0", b"1", b"2")
                and dict(r.headers)["evald-source-topic"].startswith(b"")
            ],
            30,
            "dead letters",
        )
        assert daemon.ready()[0]
    by_source = {
        (
            dict(r.headers)["evald-source-topic"].decode(),
            int(dict(r.headers)["evald-source-offset"]),
        ): r
        for r in dlq
    }
    for offset, raw in enumerate(bad_impressions):
        record = by_source[(topics["impressions"], offset)]
        assert record.value == raw
        headers = dict(record.headers)
        assert headers["evald-reason"] and headers["evald-detail"]
        assert headers["evald-source-partition"] == b"0"
    for offset, raw in enumerate(bad_feedback):
        assert by_source[(topics["feedback"], offset)].value == raw
    assert sum(daemon.stats.dlq.values()) >= len(bad_impressions) + len(bad_feedback)


def test_topics_not_copartitioned_are_refused(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 3})
    proc = subprocess.run(
        run_argv(broker.bootstrap, unique, "127.0.0.1:0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "not co-partitioned" in proc.stderr
    assert f"{topics['impressions']} has 2 partitions" in proc.stderr


def test_backpressure_pauses_impressions_and_bounds_pending(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """Dense traffic (more impressions per window than max_pending): the impressions partition
    is paused and resumed, pending stays bounded, nothing is finalized twice. Exactness against
    an uninterrupted run is not claimed here: a paused topic changes the feed order."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    # clean traffic: a duplicated impression arriving after its original was evicted by the
    # cap would legitimately be finalized a second time
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=4000, seed=3, rate=2000, clean=True
    )
    settings = make_settings(broker.bootstrap, unique, max_poll_records=50)
    settings = settings.model_copy(update={"engine": {**ENGINE, "max_pending": 200}})
    with running(settings) as daemon:
        wait_until(lambda: settled(daemon, kafka_tools, unique), 120, "the daemon to settle")
    assert daemon.stats.pauses > 0
    # pending after each tick: the engine's cap holds, backpressure kept it near the mark
    assert 0 < daemon.stats.peak_pending <= 200
    got = results_by_id(kafka_tools, topics["results"])
    assert got and all(len(docs) == 1 for docs in got.values())
    served = {json.loads(r.value)["request_id"] for r in kafka_tools.read(topics["impressions"])}
    assert set(got) <= served


def test_broker_outage_longer_than_the_session_timeout(
    proxied_broker: tuple[Broker, TcpProxy], unique: str, tmp_path: Path
) -> None:
    broker, proxy = proxied_broker
    tools = KafkaTools(broker.bootstrap)
    topics = names(unique)
    tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    tools.produce_sim(topics["impressions"], topics["feedback"], events=2500, seed=4)
    windows = tmp_path / "windows.jsonl"
    settings = make_settings(broker.bootstrap, unique, windows_file=str(windows))
    beats: list[float] = []
    with running(settings, heartbeat=lambda: beats.append(time.monotonic())) as daemon:
        wait_until(lambda: settled(daemon, tools, unique), 90, "the daemon to settle")
        proxy.cut()
        wait_until(lambda: not daemon.ready()[0], 30, "/readyz to turn red")
        cut_at = time.monotonic()
        time.sleep(KAFKA["session_timeout_ms"] / 1000 + 2)
        assert not daemon.ready()[0]
        # not ready, but alive: the loop keeps beating while it retries (/healthz stays green)
        assert sum(t > cut_at for t in beats) >= 2
        proxy.restore()
        tools.produce_sim(topics["impressions"], topics["feedback"], events=2500, seed=4, skip=2500)
        wait_until(lambda: settled(daemon, tools, unique), 120, "recovery after the outage")
    expected, reference = tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(tools, topics["results"]), expected)
    assert_windows_equal(read_windows(windows), reference)
    print(f"outage: {daemon.stats.sessions} sessions")


# -- subprocesses: kill -9 -----------------------------------------------------------------


class Instance:
    """`python -m evald run` as a child process with its own /metrics port."""

    def __init__(
        self,
        bootstrap: str,
        unique: str,
        instance: str,
        tmp_path: Path,
        static: bool = False,
        extra: tuple[str, ...] = (),
        crash_at: str | None = None,
    ) -> None:
        self.port = free_port()
        self.windows = tmp_path / f"windows-{instance}.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("EVALD_")}
        env.update(
            {
                "EVALD_KAFKA__SESSION_TIMEOUT_MS": str(KAFKA["session_timeout_ms"]),
                "EVALD_KAFKA__HEARTBEAT_INTERVAL_MS": str(KAFKA["heartbeat_interval_ms"]),
                "EVALD_KAFKA__TRANSACTION_TIMEOUT_MS": str(KAFKA["transaction_timeout_ms"]),
            }
        )
        env.pop(CRASH_ENV, None)
        if crash_at is not None:
            env[CRASH_ENV] = crash_at
        args = [
            *run_argv(bootstrap, unique, f"127.0.0.1:{self.port}"),
            "--instance-id",
            instance,
            "--set",
            "daemon.commit_interval_ms=300",
            "--set",
            f"daemon.windows_file={self.windows}",
            "--set",
            "daemon.retry_backoff_max_ms=1000",
            "--set",
            "daemon.shutdown_timeout_s=20",
        ]
        if static:
            args += ["--set", "daemon.static_membership=true"]
        args += list(extra)
        for key, value in ENGINE.items():
            args += ["--set", f"engine.{key}={json.dumps(value)}"]
        self.log_path = tmp_path / f"{instance}.log"
        self.log = self.log_path.open("ab")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            args, env=env, stdout=self.log, stderr=self.log, preexec_fn=die_with_parent
        )

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    def metric(self, name: str) -> float:
        """Sum of a series' samples on /metrics (0 when absent)."""
        status, text = self.get("/metrics")
        total = 0.0
        for line in text.splitlines() if status == 200 else []:
            if line.startswith(name) and line[len(name)] in " {":
                total += float(line.rsplit(" ", 1)[1])
        return total

    def lag_zero(self, partitions: int) -> bool:
        status, text = self.get("/metrics")
        if status != 200 or self.get("/readyz")[0] != 200:
            return False
        lags = [
            float(x.rsplit(" ", 1)[1])
            for x in text.splitlines()
            if x.startswith("evald_consumer_lag{")
        ]
        return len(lags) == 2 * partitions and sum(lags) == 0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 40) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def instances(broker: Broker, unique: str, tmp_path: Path) -> Iterator[Callable[..., Instance]]:
    started: list[Instance] = []

    def start(
        instance: str,
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


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static-member"])
def test_kill_9_mid_stream_then_restart_is_exact(
    static: bool,
    broker: Broker,
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 3, topics["feedback"]: 3})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=8000, seed=5)
    first = instances("a", static)
    wait_until(
        lambda: first.metric("evald_results_produced_total") > 300, 90, "results before the kill"
    )
    first.kill()
    killed_at = time.monotonic()
    second = instances("a", static)
    wait_until(lambda: second.get("/readyz")[0] == 200, 90, "readiness after restart")
    recovery = time.monotonic() - second.started
    flowing = wait_until(
        lambda: second.metric("evald_results_produced_total") > 0 and time.monotonic(),
        90,
        "results committed after the restart",
    )
    wait_until(lambda: second.lag_zero(3), 120, "the restarted daemon to catch up")
    time.sleep(1.0)  # one more commit interval
    assert second.terminate() == 0
    assert_matches_an_uninterrupted_run(kafka_tools, unique, second.windows)
    print(
        f"kill -9 ({'static' if static else 'dynamic'} membership): restart to ready "
        f"{recovery:.2f}s (process start included), kill -> results flowing "
        f"{flowing - killed_at:.2f}s"
    )


def test_two_instances_one_killed_partitions_move_exact(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 4, topics["feedback"]: 4})
    a, b = instances("a"), instances("b")
    # both own two partitions before any data is there: a joining alone first would work through
    # most of it before b got a share, and b would have too little to finalize
    wait_until(lambda: a.lag_zero(2) and b.lag_zero(2), 90, "two partitions for each instance")
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=8000, seed=6)
    wait_until(
        lambda: (
            a.metric("evald_results_produced_total") > 100
            and b.metric("evald_results_produced_total") > 100
        ),
        90,
        "both instances producing results",
    )
    a.kill()
    killed_at = time.monotonic()
    wait_until(lambda: b.lag_zero(4), 150, "the survivor to take over and catch up")
    takeover = time.monotonic() - killed_at
    time.sleep(1.0)
    assert b.terminate() == 0
    assert_matches_an_uninterrupted_run(kafka_tools, unique, b.windows)
    print(f"kill -9, takeover by a live instance: kill -> survivor caught up {takeover:.1f}s")


def kill_inside_an_open_transaction(
    tools: KafkaTools, unique: str, start: Callable[..., Instance]
) -> tuple[Instance, int]:
    """Slow commits, so the kill lands while results of an uncommitted transaction are already
    on the broker; then the same instance id restarts and catches up. Returns the restarted
    instance (stopped) and how many records the results topic holds, aborted ones included."""
    topics = names(unique)
    tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    tools.produce_sim(topics["impressions"], topics["feedback"], events=8000, seed=8)
    # one commit after 5000 fed records, then a transaction that stays open (the interval is
    # far away) while the remaining records are fed and their results written
    slow = (
        *("--set", "daemon.commit_interval_ms=120000"),
        *("--set", "daemon.commit_max_records=5000"),
        *("--set", "daemon.max_poll_records=500"),
    )
    first = start("a", extra=slow)
    wait_until(lambda: first.metric("evald_results_produced_total") > 0, 90, "a first commit")
    committed = first.metric("evald_results_produced_total")
    wait_until(
        lambda: len(tools.read(topics["results"])) > committed,
        60,
        "results of the open transaction on the broker",
    )
    first.kill()
    second = start("a")
    wait_until(lambda: second.lag_zero(2), 150, "the restarted daemon to catch up")
    time.sleep(1.0)
    assert second.terminate() == 0
    return second, len(tools.read(topics["results"]))


def test_kill_9_inside_an_open_transaction_its_results_never_become_visible(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    second, on_log = kill_inside_an_open_transaction(kafka_tools, unique, instances)
    copies = assert_matches_an_uninterrupted_run(kafka_tools, unique, second.windows)
    assert copies == 0
    visible = len(kafka_tools.read(names(unique)["results"], committed=True))
    # the aborted transaction's results are on the log, hidden from read_committed readers
    assert on_log > visible, "the kill did not leave an aborted transaction behind"


def test_kill_9_inside_an_open_transaction_leaked_results_are_not_counted(
    tansu: Tansu, unique: str, tmp_path: Path
) -> None:
    """tansu shows an aborted transaction's records even to read_committed readers: the copies
    must be identical to the re-finalized ones, and the rebuilt window aggregates must not
    count them (they lie outside the checkpoint's committed result ranges)."""
    tools = KafkaTools(tansu.bootstrap)
    started: list[Instance] = []

    def start(instance: str, extra: tuple[str, ...] = ()) -> Instance:
        started.append(Instance(tansu.bootstrap, unique, instance, tmp_path, extra=extra))
        return started[-1]

    try:
        second, _ = kill_inside_an_open_transaction(tools, unique, start)
    finally:
        for inst in started:
            inst.close()
    copies = assert_matches_an_uninterrupted_run(tools, unique, second.windows, leaky_broker=True)
    assert copies > 0, "the kill did not leave an aborted transaction behind: test not effective"
    print(f"tansu, kill -9 in a transaction: {copies} leaked identical copies, windows exact")


# -- compressed topics and errors no retry can fix -----------------------------------------


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_input_topics_are_read_exactly(
    codec: str, broker: Broker, kafka_tools: KafkaTools, unique: str, tmp_path: Path
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=2500, seed=11, compression=codec
    )
    windows = tmp_path / "windows.jsonl"
    settings = make_settings(broker.bootstrap, unique, windows_file=str(windows))
    with running(settings) as daemon:
        wait_until(lambda: settled(daemon, kafka_tools, unique), 90, "the daemon to settle")
    expected, reference = kafka_tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(kafka_tools, topics["results"]), expected)
    assert_windows_equal(read_windows(windows), reference)


def run_to_exit(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`evald run` as a child; a daemon that keeps retrying instead of exiting fails the test."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("EVALD_")}
    try:
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"evald run kept retrying instead of exiting:\n{exc.stderr}")


def test_a_missing_codec_exits_2_saying_what_to_install(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """An install without lz4 (the module hidden from the child) cannot read an lz4 topic, and
    no retry changes that."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=300, seed=12, compression="lz4"
    )
    argv = run_argv(broker.bootstrap, unique, "127.0.0.1:0")
    hide_lz4 = (
        "import runpy, sys; sys.modules['lz4'] = None; "
        "sys.argv = ['evald', *sys.argv[1:]]; runpy.run_module('evald', run_name='__main__')"
    )
    proc = run_to_exit([argv[0], "-c", hide_lz4, *argv[3:]])
    assert proc.returncode == 2, proc.stderr
    assert "cannot decompress" in proc.stderr and "lz4" in proc.stderr
    assert "pip install" in proc.stderr


@pytest.fixture
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A private broker that checks ACLs (everything allowed unless an ACL says otherwise)."""
    instance = Broker(
        tmp_path_factory.mktemp("kafka-acl"),
        settings={
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "true",
        },
    )
    try:
        yield instance
    finally:
        instance.stop()


def test_authorization_denied_exits_2_saying_what_to_grant(acl_broker: Broker, unique: str) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourceType,
    )

    tools = KafkaTools(acl_broker.bootstrap)
    topics = names(unique)
    tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    tools.produce_sim(topics["impressions"], topics["feedback"], events=300, seed=13)
    admin = KafkaAdminClient(bootstrap_servers=acl_broker.bootstrap)
    try:
        # every client here is User:ANONYMOUS (plaintext): evald may read and create topics
        # but not use its transactional id, as when an operator forgot that grant
        deny_txn = ACL(
            principal="User:ANONYMOUS",
            host="*",
            operation=ACLOperation.WRITE,
            permission_type=ACLPermissionType.DENY,
            resource_pattern=ResourcePattern(
                ResourceType.TRANSACTIONAL_ID, f"evald-g-{unique}-", ACLResourcePatternType.PREFIXED
            ),
        )
        created = admin.create_acls([deny_txn])
        assert not created["failed"], created
    finally:
        admin.close()
    proc = run_to_exit(run_argv(acl_broker.bootstrap, unique, "127.0.0.1:0"))
    assert proc.returncode == 2, proc.stderr
    assert "denied" in proc.stderr and "TransactionalIdAuthorizationFailedError" in proc.stderr
    assert "grant evald's principal Read" in proc.stderr


# -- the matrix: negative controls, zombie ---------------------------------------------------


def test_the_oracle_fails_on_a_planted_duplicate_and_a_planted_missing_result(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """The read_committed oracle is not vacuous: one extra committed copy of a result, or one
    result removed from the topic, makes it fail."""
    from kafka import KafkaAdminClient, TopicPartition

    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=2500, seed=15)
    settings = make_settings(broker.bootstrap, unique)
    with running(settings) as daemon:
        wait_until(lambda: settled(daemon, kafka_tools, unique), 90, "the daemon to settle")
    expected, _ = kafka_tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(kafka_tools, topics["results"]), expected)
    first, second = kafka_tools.read(topics["results"], committed=True)[:2]

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:  # the first result removed from the log
        admin.delete_records({TopicPartition(topics["results"], 0): first.offset + 1})
    finally:
        admin.close()
    got = results_by_id(kafka_tools, topics["results"])
    with pytest.raises(AssertionError, match="missing 1, unexpected 0"):
        assert_exactly_once(got, expected)

    # a committed duplicate of the second, checked against the reference without the first
    kafka_tools.produce_raw(topics["results"], [second.value], key=second.key)
    rest = {k: v for k, v in expected.items() if k != first.key.decode()}
    got = results_by_id(kafka_tools, topics["results"])
    assert len(got[second.key.decode()]) == 2
    with pytest.raises(AssertionError):
        assert_exactly_once(got, rest)


FENCING_ERRORS = (
    "ProducerFenced",
    "InvalidProducerEpoch",
    "IllegalGeneration",
    "UnknownMemberId",
    "RebalanceInProgress",
    "CommitFailed",
    "FencedInstanceId",
    "InvalidTxnState",
    "lost",
)


def test_a_zombie_past_its_session_timeout_is_fenced_and_its_results_never_show(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """SIGSTOP an instance with results of an open transaction on the log, past its session
    timeout; another instance takes its partitions over; SIGCONT: its late commit must be
    rejected and none of its in-flight results may ever become visible."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=8000, seed=14)
    slow = (
        *("--set", "daemon.commit_interval_ms=120000"),
        *("--set", "daemon.commit_max_records=5000"),
        *("--set", "daemon.max_poll_records=500"),
    )
    zombie = instances("a", extra=slow)
    wait_until(lambda: zombie.metric("evald_results_produced_total") > 0, 90, "a first commit")
    committed = zombie.metric("evald_results_produced_total")
    wait_until(
        lambda: len(kafka_tools.read(topics["results"])) > committed,
        60,
        "results of the open transaction on the broker",
    )
    reader = CommittedReader(kafka_tools.bootstrap, topics["results"])
    zombie.proc.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    heir = instances("b")
    wait_until(lambda: heir.lag_zero(2), 150, "the heir to take both partitions and catch up")
    takeover = time.monotonic() - stopped_at
    log_before = zombie.log_path.read_text(errors="replace")
    zombie.proc.send_signal(signal.SIGCONT)
    # the zombie wakes inside its old session, tries to go on, is refused, starts over
    wait_until(
        lambda: any(
            e in zombie.log_path.read_text(errors="replace")[len(log_before) :]
            for e in FENCING_ERRORS
        ),
        90,
        "the zombie to be fenced",
    )
    wait_until(
        lambda: zombie.metric("evald_transactions_fenced_total") >= 1, 30, "the fence counted"
    )
    assert heir.metric("evald_transactions_fenced_total") == 0
    assert zombie.terminate() == 0
    wait_until(lambda: heir.lag_zero(2), 150, "the heir to own everything again")
    time.sleep(1.0)
    assert heir.terminate() == 0
    seen = reader.stop()
    assert_matches_an_uninterrupted_run(kafka_tools, unique, heir.windows)
    expected, _ = kafka_tools.expected(
        make_settings(kafka_tools.bootstrap, unique).engine_config(),
        topics["impressions"],
        topics["feedback"],
    )
    assert_seen_during_chaos_stands(seen, expected, kafka_tools, topics["results"])
    woke = zombie.log_path.read_text(errors="replace")[len(log_before) :]
    print(
        f"zombie: takeover (SIGSTOP -> heir caught up) {takeover:.1f}s; fenced by "
        f"{sorted(e for e in FENCING_ERRORS if e in woke)}"
    )


@pytest.mark.chaos
def test_broker_killed_and_restarted_on_its_data_mid_stream_is_exact(
    private_broker: Broker, unique: str, tmp_path: Path
) -> None:
    """kill -9 of the broker three times while evald works (transactions open, results in
    flight), each time restarted on the same log directories."""
    tools = KafkaTools(private_broker.bootstrap)
    topics = names(unique)
    tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    chunk = 3000
    tools.produce_sim(topics["impressions"], topics["feedback"], events=chunk, seed=16)
    windows = tmp_path / "windows.jsonl"
    # small polls and commits keep a transaction open most of the time
    settings = make_settings(
        private_broker.bootstrap,
        unique,
        windows_file=str(windows),
        max_poll_records=100,
        commit_interval_ms=500,
    )
    downtimes: list[float] = []
    with running(settings) as daemon:
        wait_until(lambda: daemon.stats.results_produced > 0, 90, "the first results")
        reader = CommittedReader(private_broker.bootstrap, topics["results"])
        for i in range(1, 4):
            before = daemon.stats.results_produced
            wait_until(
                lambda before=before: daemon.stats.results_produced > before,
                120,
                "results committed since the last broker restart",
            )
            killed_at = time.monotonic()
            private_broker.kill()
            private_broker.restart()
            wait_until(lambda: daemon.ready()[0], 120, "evald ready after the broker restart")
            downtimes.append(time.monotonic() - killed_at)
            # more traffic, so the next kill lands while results flow
            tools.produce_sim(
                topics["impressions"], topics["feedback"], events=chunk, seed=16, skip=i * chunk
            )
        wait_until(lambda: settled(daemon, tools, unique), 180, "the daemon to settle")
        seen = reader.stop()
    stored = len(tools.read(topics["impressions"])) + len(tools.read(topics["feedback"]))
    assert stored == 4 * chunk, "the broker lost input records"
    expected, reference = tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(tools, topics["results"]), expected)
    assert_windows_equal(read_windows(windows), reference)
    during = assert_seen_during_chaos_stands(seen, expected, tools, topics["results"])
    print(
        f"broker kill -9: kill -> evald ready {', '.join(f'{d:.1f}s' for d in downtimes)}; "
        f"{during} results seen read_committed during the kills, all standing"
    )


# -- kill -9 at each step of the commit cycle (runner's test-only crash points) --------------


def crashed(inst: Instance) -> bool:
    return inst.proc.poll() is not None


@pytest.mark.chaos
@pytest.mark.parametrize("recovery", ["restart", "takeover"])
@pytest.mark.parametrize(
    "step", ["results_sent", "offsets_sent", "committed", "revoking", "restore"]
)
def test_kill_9_at_each_step_of_the_commit_cycle_is_exact(
    step: str,
    recovery: str,
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
) -> None:
    """The process kills itself (SIGKILL) at ``step``; the same instance id restarts, or a
    second live instance takes the partitions over. Oracle: read_committed, no dedup, equal
    to the uninterrupted run, window aggregates equal."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 4, topics["feedback"]: 4})
    half = 4000
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=half, seed=20)
    heir: Instance | None = None
    if step == "restore":  # commit some, die plainly, then die while restoring
        first = instances("a")
        wait_until(lambda: first.metric("evald_results_produced_total") > 0, 90, "results")
        first.kill()
        victim = instances("a", crash_at=step)
    elif step == "revoking":  # a second member joining makes the first commit on revocation
        victim = instances("a", crash_at=step)
        wait_until(lambda: victim.metric("evald_results_produced_total") > 0, 90, "results")
        heir = instances("b")
    else:
        victim = instances("a", crash_at=step)
    if recovery == "takeover" and heir is None:
        heir = instances("b")
    if heir is not None:  # both members in the group before the rest of the traffic arrives
        wait_until(
            lambda: crashed(victim) or (victim.lag_zero(2) and heir.lag_zero(2)),
            120,
            "two members sharing the partitions",
        )
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=half, seed=20, skip=half
    )
    wait_until(lambda: crashed(victim), 120, f"the crash at {step}")
    assert victim.proc.returncode == -signal.SIGKILL
    killed_at = time.monotonic()
    if recovery == "restart":
        again = instances("a")
        if heir is not None:  # let the restarted one in, then leave everything to the heir
            wait_until(lambda: again.get("/readyz")[0] == 200, 120, "the restart ready")
            assert again.terminate() == 0
        survivor = heir or again
    else:
        assert heir is not None
        survivor = heir
    wait_until(lambda: survivor.lag_zero(4), 180, "one instance owning everything, caught up")
    caught_up = time.monotonic() - killed_at
    time.sleep(1.0)
    assert survivor.terminate() == 0
    assert_matches_an_uninterrupted_run(kafka_tools, unique, survivor.windows)
    print(f"kill -9 at {step}, {recovery}: kill -> caught up {caught_up:.1f}s")


@pytest.mark.chaos
def test_broker_paused_past_the_request_timeout_is_exact(
    private_broker: Broker, unique: str, tmp_path: Path
) -> None:
    """SIGSTOP of the broker: connections stay open but nothing answers, until evald's requests
    time out and its session fails; SIGCONT, more traffic, and the output is exact."""
    tools = KafkaTools(private_broker.bootstrap)
    topics = names(unique)
    tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    tools.produce_sim(topics["impressions"], topics["feedback"], events=3000, seed=17)
    windows = tmp_path / "windows.jsonl"
    settings = make_settings(private_broker.bootstrap, unique, windows_file=str(windows))
    settings = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"request_timeout_ms": 7000})}
    )
    with running(settings) as daemon:
        wait_until(lambda: daemon.stats.results_produced > 0, 90, "the first results")
        private_broker.pause()
        try:
            wait_until(
                lambda: daemon.ready()[1].startswith("retrying after"),
                120,
                "the session to fail on the hung broker",
            )
        finally:
            private_broker.resume()
        tools.produce_sim(
            topics["impressions"], topics["feedback"], events=3000, seed=17, skip=3000
        )
        wait_until(lambda: settled(daemon, tools, unique), 180, "the daemon to settle")
    expected, reference = tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(tools, topics["results"]), expected)
    assert_windows_equal(read_windows(windows), reference)
