"""`evald run` set up wrong in the ways a first hour gets it wrong, on the test broker: what no
retry can fix exits 2 saying which setting to change, what may fix itself is retried with
evald's own line, and data that cannot be written is dead-lettered, never looped on."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import Instance, names, run_argv, run_to_exit
from test_hostile_input import log_text

pytestmark = pytest.mark.kafka


def test_a_transaction_timeout_above_the_brokers_maximum_exits_2_naming_both_settings(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """The broker refuses the producer's InitProducerId (INVALID_TRANSACTION_TIMEOUT) the same
    way every time; before, evald retried it forever with a session a second."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    # the test broker keeps Kafka's default transaction.max.timeout.ms, 900000
    argv = [
        *run_argv(broker.bootstrap, unique, "127.0.0.1:0"),
        "--set",
        "kafka.transaction_timeout_ms=900001",
    ]
    proc = run_to_exit(argv)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "kafka.transaction_timeout_ms" in proc.stderr
    assert "transaction.max.timeout.ms" in proc.stderr


def test_a_result_larger_than_the_results_topic_accepts_is_dead_lettered_once(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """A results topic whose max.message.bytes is under what evald's input limits allow (20
    labels of 300 characters make a 6.5 KB result): before, the broker refused the batch, the
    transaction failed, and every session replayed the same impression into the same refusal,
    forever. Now that result goes to the DLQ whole, in the same transaction, counted once."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic
    from kafka_instances import make_settings
    from kafka_oracle import assert_exactly_once, results_by_id

    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        limit = {"max.message.bytes": "4096"}
        admin.create_topics([NewTopic(topics["results"], 1, 1, topic_configs=limit)])
    finally:
        admin.close()
    imp, fb = topics["impressions"], topics["feedback"]
    kafka_tools.produce_sim(imp, fb, events=1500, seed=15, clean=True)
    ts = kafka_tools.read(imp)[-1].timestamp  # in the traffic's event time
    big = [f"big-{i}" for i in range(3)]
    labels = {f"l{j:02d}": "v" * 300 for j in range(20)}
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        for rid in big:
            doc = {"request_id": rid, "ts": ts, "items": ["a", "b"], "labels": labels}
            producer.send(imp, key=rid.encode(), value=json.dumps(doc).encode(), timestamp_ms=ts)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)
    kafka_tools.produce_sim(imp, fb, events=1500, seed=15, skip=1500, clean=True)
    inst = instances()
    wait_until(lambda: inst.lag_zero(1), 120, "the daemon to catch up")
    # clean traffic: these are the only dead letters
    wait_until(lambda: inst.metric("evald_dlq_records_total") == 3, 60, "three letters counted")
    assert inst.terminate() == 0
    config = make_settings(broker.bootstrap, unique).engine_config()
    expected, _ = kafka_tools.expected(config, imp, fb)
    assert set(big) <= set(expected)  # the reference scored them: they were finalized
    fitting = {rid: doc for rid, doc in expected.items() if rid not in big}
    assert_exactly_once(results_by_id(kafka_tools, topics["results"]), fitting)
    letters = [
        letter
        for letter in kafka_tools.read(topics["dlq"], committed=True)
        if ("evald-reason", b"result_too_large") in letter.headers
    ]
    assert sorted(letter.key.decode() for letter in letters) == big  # each once
    for letter in letters:
        headers = {name: value.decode() for name, value in letter.headers}
        assert headers["evald-kind"] == "result"
        assert headers["evald-source-topic"] == topics["results"]
        assert headers["evald-source-partition"] == "0"
        assert json.loads(letter.value) == expected[letter.key.decode()]  # the whole result
    assert "raise the topic's max.message.bytes" in log_text(inst)


def _not_ready(inst: Instance, said: str) -> bool:
    """/readyz is red and says ``said``; so does a WARNING of evald's own."""
    status, reason = inst.get("/readyz")
    return status == 503 and said in reason and said in _evald_lines(inst)


def _evald_lines(inst: Instance) -> str:
    return "\n".join(x for x in log_text(inst).splitlines() if " evald.daemon: " in x)


@pytest.mark.parametrize(
    ("bootstrap", "said"),
    [
        ("evald-no-such-broker.invalid:9092", "does not resolve"),
        ("away", "accepts no connection"),
    ],
    ids=["name-does-not-resolve", "nothing-listens"],
)
def test_a_broker_not_reachable_is_retried_with_evalds_own_reason(
    bootstrap: str, said: str, unique: str, tmp_path: Path
) -> None:
    """Both can fix themselves (a Kubernetes Service's name resolves once the Service exists; a
    broker starting refuses connections): retried, with /readyz red and evald's own line
    saying what is wrong with which address. Before, only kafka-python's lines said it, and
    evald's said "Unable to bootstrap" once kafka-python gave up (kafka.request_timeout_ms)."""
    if bootstrap == "away":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            bootstrap = f"127.0.0.1:{sock.getsockname()[1]}"
    inst = Instance(
        bootstrap, unique, "a", tmp_path, extra=("--set", "kafka.request_timeout_ms=2000")
    )
    try:
        wait_until(lambda: _not_ready(inst, said), 30, f"evald to say {said!r}")
        assert bootstrap in _evald_lines(inst)
        assert inst.proc.poll() is None  # retrying, not exiting
        assert inst.terminate() == 0
    finally:
        inst.close()


def test_a_bootstrap_address_that_answers_http_is_named_and_a_stop_exits_0(
    unique: str, tmp_path: Path
) -> None:
    """Another service on the port: named at the first failed bootstrap in evald's line and on
    /readyz (before, kafka-python's "Request timed out" every kafka.request_timeout_ms). The
    exit 2 comes only after three such bootstraps over a minute (test_reach.py): an address
    answering HTTP for a while is also what a proxy does while a broker restarts. A stop while
    it retries (and diagnoses) exits 0."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    inst = Instance(
        address, unique, "a", tmp_path, extra=("--set", "kafka.request_timeout_ms=2000")
    )
    try:
        said = "every address answers as another service"
        wait_until(lambda: _not_ready(inst, said), 30, f"evald to say {said!r}")
        assert f"{address} answers HTTP, not Kafka" in _evald_lines(inst)
        assert inst.proc.poll() is None  # retrying, not exiting
        assert inst.terminate() == 0
    finally:
        inst.close()
        server.shutdown()
        server.server_close()


def test_the_test_broker_answers_the_bootstrap_probe_as_kafka(broker: Broker) -> None:
    """The other side of the check above: a real broker is never taken for another service."""
    from evald.daemon.reach import probe

    assert probe(broker.bootstrap, "PLAINTEXT", 5.0).kind == "kafka"


def test_dead_letters_onto_a_dlq_topic_with_a_small_limit_are_each_written_once(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """A DLQ topic accepting 6 KiB (evald refuses less, record_limits.DLQ_NEED): a 20 KB
    rejected record's letter is truncated to fit (as before), and the letters of small
    rejected records, which the producer batched up to 512 KiB, no longer make batches the
    topic refuses (the commit waited on them forever)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka_oracle import assert_dead_letters_once

    topics = names(unique)
    imp, fb = topics["impressions"], topics["feedback"]
    kafka_tools.create({imp: 1, fb: 1})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        limit = {"max.message.bytes": "6144"}
        admin.create_topics([NewTopic(topics["dlq"], 1, 1, topic_configs=limit)])
    finally:
        admin.close()
    kafka_tools.produce_sim(imp, fb, events=1500, seed=16)
    ts = kafka_tools.read(imp)[-1].timestamp  # in the traffic's event time
    for topic in (imp, fb):
        garbage = [b"not json %d" % i + b" " * 200 for i in range(40)]
        kafka_tools.produce_raw(topic, garbage, timestamp_ms=ts)
    kafka_tools.produce_raw(imp, [b"{" + b"x" * 20_000], key=b"big-key", timestamp_ms=ts)
    kafka_tools.produce_sim(imp, fb, events=1500, seed=16, skip=1500)
    inst = instances()
    wait_until(lambda: inst.lag_zero(1), 120, "the daemon to catch up")
    assert inst.terminate() == 0
    assert assert_dead_letters_once(kafka_tools, unique) == 81
    (big,) = [r for r in kafka_tools.read(topics["dlq"], committed=True) if r.key == b"big-key"]
    assert dict(big.headers)["evald-original-size"] == b"20001"
    assert 0 < len(big.value) < 6144


def test_two_processes_with_one_instance_id_are_named_in_the_log_and_on_readyz(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """Two `evald run` on one host without --instance-id (the host name by default) share a
    transactional id: each session's producer fences the other's, forever, neither making
    progress. Before, each said only "kafka session failed (ProducerFencedError)"; now, after
    three fenced sessions in a row with no commit between (or within 10 minutes), what is
    wrong and what to do, in the log and on /readyz. (A takeover's single fence, followed by
    a commit, is not a twin: test_health.py.)"""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=1000, seed=17)
    first, second = instances("twin"), instances("twin")
    said = "another evald runs with daemon.group_id"

    def told() -> bool:
        return any(said in log_text(inst) for inst in (first, second))

    def on_readyz() -> bool:
        return any(said in inst.get("/readyz")[1] for inst in (first, second))

    wait_until(told, 90, "a twin to be named")
    (inst,) = [inst for inst in (first, second) if said in log_text(inst)][:1]
    assert "give every instance its own --instance-id" in log_text(inst)
    wait_until(on_readyz, 60, "/readyz to name the twin")
    assert first.terminate() == 0 and second.terminate() == 0


def _topic_limit(admin: Any, topic: str, configs: dict[str, str] | None = None) -> str | None:
    """The topic's max.message.bytes set on the topic itself (None: the broker's default);
    ``configs`` are set first."""
    from kafka.admin import ConfigResource, ConfigResourceType

    resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)
    if configs:
        admin.alter_configs([resource])
    described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    entry = described["topic"][topic].get("max.message.bytes")
    return None if entry is None else str(entry["value"])


def test_an_output_topic_below_evalds_largest_record_exits_2_and_check_config_fails_it(
    broker: Broker, kafka_tools: KafkaTools, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint topic accepting 64 KiB: the first snapshot's 256 KiB chunk was refused with
    its transaction in every session, forever (a DLQ below a headers-only letter the same).
    Now `evald run` exits 2 at start naming the topic, its limit and what evald needs, and
    check-config --connect fails it; a checkpoint topic evald creates gets Kafka's default
    limit whatever the broker's."""
    import argparse

    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    from evald.daemon import check_config
    from evald.daemon.record_limits import CHECKPOINT_NEED, DLQ_NEED

    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    checkpoints, dlq = f"{topics['results']}.checkpoints", topics["dlq"]
    argv = run_argv(broker.bootstrap, unique, "127.0.0.1:0")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        small = {"max.message.bytes": "4096"}
        admin.create_topics([NewTopic(dlq, 1, 1, topic_configs=small)])
        proc = run_to_exit(argv, timeout=45)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert f"topics.dlq {dlq} accepts records of at most 4096 bytes" in proc.stderr
        assert f"max.message.bytes={DLQ_NEED}" in proc.stderr
        assert _topic_limit(admin, checkpoints) == "1048588"  # created by evald, set explicitly
        _topic_limit(admin, dlq, {"max.message.bytes": "1048588"})
        assert _topic_limit(admin, checkpoints, {"max.message.bytes": "65536"}) == "65536"
    finally:
        admin.close()
    proc = run_to_exit(argv, timeout=45)
    assert proc.returncode == 2, proc.stderr[-3000:]
    named, said = f"topics.checkpoints {checkpoints}", "accepts records of at most 65536 bytes"
    assert f"{named} {said}" in proc.stderr
    assert f"--entity-name {checkpoints} --add-config max.message.bytes={CHECKPOINT_NEED}" in (
        proc.stderr
    )
    parser = argparse.ArgumentParser()
    check_config.configure(parser)
    assert check_config.run(parser.parse_args([*argv[4:-2], "--connect"])) == 1  # no metrics
    out = capsys.readouterr().out
    assert f"# FAIL  {named}: {said}" in out
    assert f"# ok    topics.dlq {dlq}: max.message.bytes 1048588, at least " in out


def test_the_repartition_stage_keeps_its_batches_under_its_internal_topics_limit(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """Internal topics accepting 16 KiB: before, the stage's 512 KiB batches of small copies
    were refused, and its transaction waited on them forever (nothing reached the topic)."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic
    from kafka_instances import make_settings

    from evald.daemon.dead_letters import DEFAULT_MAX_MESSAGE_BYTES, max_message_bytes
    from evald.daemon.names import internal_topic
    from evald.daemon.repartition.stage import Repartitioner
    from evald.daemon.topics import dlq_limit

    topics = names(unique)
    imp, fb = topics["impressions"], topics["feedback"]
    kafka_tools.create({imp: 1, fb: 1})
    group = f"g-{unique}"
    internal = [internal_topic(group, name) for name in (imp, fb)]
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        limit = {"max.message.bytes": "16384", "message.timestamp.type": "CreateTime"}
        admin.create_topics([NewTopic(name, 1, 1, topic_configs=limit) for name in internal])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=50)
    try:
        for n in range(2000):
            doc = {"request_id": f"r{n}", "ts": 1_700_000_000_000 + n, "items": ["a", "b"]}
            producer.send(imp, key=b"client", value=json.dumps(doc).encode())
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)
    settings = make_settings(broker.bootstrap, unique)
    settings = settings.model_copy(
        update={"input": settings.input.model_copy(update={"repartition": True})}
    )
    stage = Repartitioner(settings)
    stage.start()
    try:
        wait_until(
            lambda: len(kafka_tools.read(internal[0], committed=True)) == 2000,
            60,
            "every impression copied into the internal topic",
        )
    finally:
        stage.stop(timeout=15)
    assert stage.status is None
    # the DLQ this stage created has room for a result the results topic refuses
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert max_message_bytes(admin, topics["dlq"]) == dlq_limit(DEFAULT_MAX_MESSAGE_BYTES)
    finally:
        admin.close()


def test_a_result_the_default_results_topic_refuses_is_dead_lettered_whole(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """Both topics as evald creates them, at Kafka's default: before, the DLQ got the same
    1048588 bytes as the results topic, so every result over the results topic's limit was
    truncated to fit it (only its SHA-256 kept). The DLQ's larger topic-level limit is above
    the broker's message.max.bytes: the broker takes the letter and a consumer reads it back."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka_instances import make_settings
    from settable_clock import SettableClock

    from evald.daemon.dead_letters import (
        DEFAULT_MAX_MESSAGE_BYTES,
        SLACK_BYTES,
        DeadLetters,
        record_size,
    )
    from evald.daemon.topics import TopicGuard

    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        limits = TopicGuard(make_settings(broker.bootstrap, unique), SettableClock()).start(admin)
    finally:
        admin.close()
    assert limits.results == DEFAULT_MAX_MESSAGE_BYTES < limits.dlq
    letters = DeadLetters(topics["dlq"])
    letters.limit, letters.results_limit = limits.dlq, limits.results
    # the smallest result the results topic refuses
    key, value = b"r" * 16, b"v" * (DEFAULT_MAX_MESSAGE_BYTES - 64 - 16)
    while record_size(key, value, []) + SLACK_BYTES <= limits.results:
        value += b"v"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=2 * limits.dlq)
    try:
        assert letters.divert_result(producer, topics["results"], 0, key, value)
        producer.flush(timeout=30)
        letters.check()
    finally:
        producer.close(timeout=5)
    (letter,) = kafka_tools.read(topics["dlq"])
    headers = dict(letter.headers)
    assert headers["evald-reason"] == b"result_too_large"
    assert "evald-truncated" not in headers
    assert letter.value == value


def test_share_records_batch_under_a_statistics_topic_at_the_smallest_limit_evald_accepts(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """A statistics topic at the need record_limits.statistics_bytes gives takes evald's share
    records batched as the commit producer batches them. Before, its limit did not bound the
    batches: six shares of 100 KB went out in 512 KiB batches, which the broker refused: the
    flush never completed (as the commit's, in every session)."""
    import numpy as np
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic
    from kafka_instances import make_settings
    from settable_clock import SettableClock

    from evald.daemon.main.runner import PRODUCER_BATCH_BYTES
    from evald.daemon.names import statistics_topic
    from evald.daemon.record_limits import statistics_bytes
    from evald.daemon.topics import TopicGuard
    from evald.statistics.shares import Share

    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    settings = make_settings(broker.bootstrap, unique)
    stats = statistics_topic(settings.topics.checkpoint_topic)
    need = statistics_bytes(settings.engine_config())
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        configs = {"cleanup.policy": "compact", "max.message.bytes": str(need)}
        admin.create_topics([NewTopic(stats, 1, 1, topic_configs=configs)])
        limits = TopicGuard(settings, SettableClock(), stats).start(admin)
    finally:
        admin.close()
    sums = np.full((1400, 3), -1.2345678901234567e-300)
    shares = [Share(0, 60_000, 0, (((), sums),), chunk) for chunk in range(6)]
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        batch_size=limits.batch_bytes(PRODUCER_BATCH_BYTES),
        linger_ms=500,
        max_request_size=max(*limits, 1_048_576),
    )
    try:
        sent = [producer.send(stats, key=s.key, value=s.encode()) for s in shares]
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)
    assert 90_000 < len(shares[0].encode()) < need // 2
    assert [future.succeeded() for future in sent] == [True] * 6
    assert len(kafka_tools.read(stats)) == 6
