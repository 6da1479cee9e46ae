"""`evald run` against Apache Kafka 4.3.1 on loopback (deploy.local_kafka).

The reference for every comparison is one uninterrupted Engine fed the same records in the
daemon's documented per-partition order. The oracle: the results topic read with
``read_committed`` and **no de-duplication** holds every expected request_id exactly once with
the expected values, nothing else. One test runs on tansu, the in-memory broker that leaks
aborted records, to keep the window aggregates' protection against such copies covered
(docs/design.md, "What real Kafka changed").
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka_harness import ENGINE, Broker, CommittedReader, KafkaTools, Tansu, TcpProxy, wait_until
from kafka_instances import (
    KAFKA,
    Instance,
    make_settings,
    names,
    run_argv,
    run_to_exit,
    running,
    settled,
)
from kafka_oracle import (
    assert_exactly_once,
    assert_matches_an_uninterrupted_run,
    assert_seen_during_chaos_stands,
    assert_windows_equal,
    read_windows,
    results_by_id,
    wait_killed_transactions_aborted,
)

from evald.daemon.main import snapshots
from evald.daemon.main.checkpoint import Checkpoint

pytestmark = pytest.mark.kafka

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


@pytest.mark.chaos  # a broker fault: the chaos tier (make test-chaos)
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
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=4000, seed=5)
    first = instances("a", static)
    wait_until(
        lambda: first.metric("evald_results_produced_total") > 300, 90, "results before the kill"
    )
    first.kill()
    killed_at = time.monotonic()
    # the stream goes on: the first life may have consumed all of its first half, and the
    # watermark of the tail waits for later events (a block of them: docs/semantics.md §3)
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=4000, seed=5, skip=4000
    )
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
    wait_until(lambda: b.alone(4), 150, "the survivor alone in the group")
    assert b.terminate() == 0
    wait_killed_transactions_aborted(kafka_tools, unique, "a")
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
    # (not `alone`: tansu, which some callers run on, does not describe groups)
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


@pytest.mark.chaos  # a broker fault: the chaos tier (make test-chaos)
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
    # the zombie may have joined again before its stop: one more rebalance, or a member that
    # died unseen holding a partition until its session times out
    wait_until(lambda: heir.alone(2), 150, "the heir alone, owning everything again")
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


# -- restart cost ------------------------------------------------------------------------------

RESTORED = re.compile(
    r"partition (\d+) restored: .* snapshot of (\w+) bytes, (\d+) results absorbed, "
    r"(\d+) records \((\d+) bytes\) read"
)


def committed_checkpoint(tools: KafkaTools, unique: str, partition: int) -> Checkpoint:
    """The checkpoint a restart of ``partition`` reads: the record before the group's
    committed offset on the checkpoint topic (docs/design.md)."""
    from kafka import KafkaConsumer, TopicPartition

    topic = make_settings(tools.bootstrap, unique).topics.checkpoint_topic
    consumer = KafkaConsumer(bootstrap_servers=tools.bootstrap, group_id=f"g-{unique}")
    try:
        committed = consumer.committed(TopicPartition(topic, partition))
    finally:
        consumer.close()
    assert committed, "no committed checkpoint"
    (record,) = [
        r for r in tools.read(topic) if r.partition == partition and r.offset == committed - 1
    ]
    return Checkpoint.decode(record.value)


CLUSTERED = "evald_window_ci95_clustered_halfwidth"


def window_series(inst: Instance) -> list[str]:
    status, text = inst.get("/metrics")
    assert status == 200
    return sorted(line for line in text.splitlines() if line.startswith("evald_window_"))


def query_page(inst: Instance) -> dict[str, Any]:
    """GET /queries, with the report holding queries and summaries that purged (the check
    must not be vacuous)."""
    status, text = inst.get("/queries?k=1000")
    assert status == 200, text
    doc = json.loads(text)
    assert doc["queries"] and any(row["offset"] > 0 for row in doc["queries"])
    return doc


def assert_same_window_series(got: list[str], expected: list[str]) -> None:
    """Digit for digit, except the clustered interval: its replicate sums are added one batch
    at a time (a BLAS product per run of results), so how the results were batched moves its
    last digits (docs/statistics.md); it must agree to 1e-12."""
    assert [line for line in got if not line.startswith(CLUSTERED)] == [
        line for line in expected if not line.startswith(CLUSTERED)
    ]
    clustered = [line.rsplit(" ", 1) for line in got if line.startswith(CLUSTERED)]
    reference = [line.rsplit(" ", 1) for line in expected if line.startswith(CLUSTERED)]
    assert [name for name, _ in clustered] == [name for name, _ in reference]
    for (name, value), (_, ref) in zip(clustered, reference, strict=True):
        assert float(value) == pytest.approx(float(ref), rel=1e-12, nan_ok=True), name


def test_a_restart_reads_the_snapshot_and_only_the_results_after_it(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """After a long stream on one partition, kill -9 and restart: the restore reads the
    checkpoint, the snapshot's records and only the results written after the snapshot — a
    count, not a time — and the window aggregates equal the uninterrupted run's."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=30_000, seed=21)
    few = ("--set", "engine.drilldown.capacity=2")  # the query summaries purge: not vacuous
    first = instances("a", extra=few)
    wait_until(lambda: first.lag_zero(1), 180, "the first instance to consume everything")

    def quiet() -> float | None:  # results stopped moving: every commit is in
        before = first.metric("evald_results_produced_total")
        time.sleep(1.0)
        return before if first.metric("evald_results_produced_total") == before else None

    total = wait_until(quiet, 60, "the results to stop moving")
    before = window_series(first)
    queries_before = query_page(first)
    assert total > 3 * snapshots.MIN_RESULTS_BETWEEN, "too few results for a snapshot to matter"
    checkpoint = committed_checkpoint(kafka_tools, unique, 0)
    first.kill()

    second = instances("a", extra=few)
    wait_until(lambda: second.lag_zero(1), 120, "the restarted instance to catch up")
    restored = wait_until(
        lambda: RESTORED.search(second.log_path.read_text()), 30, "the restore log line"
    )
    _, size, absorbed, records, nbytes = restored.groups()
    assert checkpoint.snapshot is not None and size == str(checkpoint.snapshot.size)
    # exactly what the checkpoint names: itself, the snapshot's chunks, the later results (the
    # records inside its ranges: transaction markers take offsets there too)
    after = [
        r
        for r in kafka_tools.read(topics["results"])
        if any(x.start <= r.offset < x.end for x in checkpoint.results)
    ]
    assert int(absorbed) == len(after)
    assert int(records) == 1 + len(checkpoint.snapshot.offsets) + int(absorbed)
    # and not every result since the partition was first assigned (what the ranges alone read)
    assert int(absorbed) < total / 2
    time.sleep(1.0)
    assert_same_window_series(window_series(second), before)
    # the drill-down's query summaries ride in the same snapshot: equal with ==, purges and all
    assert query_page(second) == queries_before
    assert second.terminate() == 0
    assert_matches_an_uninterrupted_run(kafka_tools, unique, second.windows)
    print(
        f"restart after {total:.0f} results on one partition: read 1 checkpoint + "
        f"{len(checkpoint.snapshot.offsets)} snapshot record(s) ({size} bytes) + "
        f"{absorbed} results = {records} records, {nbytes} bytes"
    )
