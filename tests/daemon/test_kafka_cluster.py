"""`evald run` on three Apache Kafka brokers (RF 3, min ISR 2) while brokers die: the leader of
a results partition, the transaction coordinator, the group coordinator, two brokers at once,
and a rolling restart. `make test-cluster` runs this tier (7-7½ minutes on two cores: one
cluster per module, one topic set per case).

The oracle of every case, on top of the single-broker one (tests/daemon/test_kafka.py): the
results read ``read_committed`` with no de-duplication equal one uninterrupted engine fed the
same records, the window aggregates equal its, the group's committed offsets reach the end of
both inputs, no transaction of evald's is left open (ListTransactions on every broker,
DescribeProducers on the output partitions), and what a ``read_committed`` consumer saw during
the chaos stands. Each case prints fault -> /readyz 200 and fault -> results flowing again
(docs/performance.md section 8).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka_cluster import PRODUCED, Cluster, Feeder, Sampler, results_produced
from kafka_harness import CommittedReader, KafkaTools, wait_until
from test_kafka import (
    Instance,
    assert_exactly_once,
    assert_seen_during_chaos_stands,
    assert_windows_equal,
    make_settings,
    names,
    read_windows,
    results_by_id,
)

from evald.daemon.main.checkpoint import Checkpoint

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]

PARTITIONS = 3
#: simulator events per case and the pace they are written at: the traffic lasts ~60 s, so
#: every fault lands, and evald recovers from it, while records arrive
EVENTS, RATE = 18_000, 300.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One three-node cluster for the module; each case uses its own topics and group, and
    leaves every node running and in sync."""
    instance = Cluster(tmp_path_factory.mktemp("kafka-cluster"))
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(autouse=True)
def healed(cluster: Cluster) -> Iterator[None]:
    """After each case, every node is up and in sync again, even when the case failed."""
    yield
    cluster.heal()


@dataclass
class Fault:
    """What a case did: a name for the printout, when the fault began and the results
    committed until then (the recovery times are measured from there)."""

    what: str
    at: float
    produced_before: float


def produced_now(inst: Instance) -> float:
    """Results committed so far, as evald's /metrics says (asked again while it is busy)."""
    value = results_produced(inst)
    assert value is not None, "evald's /metrics did not answer for 60 s"
    return value


def transactional_id(unique: str) -> str:
    return f"evald/g-{unique}/a"


def chaos_run(
    cluster: Cluster,
    unique: str,
    tmp_path: Path,
    seed: int,
    fault: Callable[[Instance], Fault],
) -> tuple[Fault, Sampler]:
    """Stream simulator events through one `evald run`, apply ``fault`` while results flow,
    let evald catch up, stop it, and check the whole oracle."""
    topics = names(unique)
    cluster.create(
        {
            topics["impressions"]: PARTITIONS,
            topics["feedback"]: PARTITIONS,
            # outputs created here on three replicas: evald creates missing ones on one
            topics["results"]: PARTITIONS,
            topics["dlq"]: PARTITIONS,
            f"{topics['results']}.checkpoints": PARTITIONS,
        }
    )
    feeder = Feeder(
        cluster.bootstrap,
        topics["impressions"],
        topics["feedback"],
        events=EVENTS,
        seed=seed,
        rate=RATE,
    )
    inst = Instance(cluster.bootstrap, unique, "a", tmp_path)
    try:
        wait_until(lambda: inst.metric(PRODUCED) > 0, 120, "the first results")
        reader = CommittedReader(cluster.bootstrap, topics["results"])
        sampler = Sampler(inst)
        try:
            done = fault(inst)
            written = feeder.join()
            wait_until(lambda: inst.lag_zero(PARTITIONS), 180, "evald to catch up")
            time.sleep(1.0)  # one more commit interval
        except BaseException:
            print(f"/readyz said {sampler.not_ready_reasons(0.0)}; evald's log ends:")
            print(evald_log_tail(inst.log_path))
            print(f"(the whole log: {inst.log_path})")
            print(evald_stacks(inst.proc.pid))
            raise
        finally:
            sampler.stop()
            seen = reader.stop()
        assert inst.terminate() == 0
    finally:
        inst.close()
    assert_exact_on_the_cluster(cluster, unique, inst.windows, seen, written)
    reasons = sampler.not_ready_reasons(done.at)
    ready = _secs(sampler.ready_again(done.at), "never") if reasons else "stayed 200"
    flowing = _secs(sampler.flowing_again(done.at, done.produced_before), "never")
    print(
        f"{done.what}: fault -> /readyz 200 {ready}, fault -> results flowing again {flowing}, "
        f"longest pause in results {sampler.longest_pause(done.at):.1f}s; /readyz said "
        f"{reasons[:3]}; {len(seen)} results seen read_committed during the chaos, all standing"
    )
    return done, sampler


def evald_log_tail(path: Path, lines: int = 150) -> str:
    """evald's own lines (the client library's connection noise and the scrapes served
    without the engine left out), for a failure."""
    own = [
        line
        for line in path.read_text(errors="replace").splitlines()
        if (" evald" in line or "kafka.coordinator" in line or "kafka.producer" in line)
        and "evald.exposition.collector" not in line
    ]
    return "\n".join(own[-lines:])


def evald_stacks(pid: int) -> str:
    """Where every thread of evald is at the failure (py-spy, when installed): a loop stuck in
    a broker wait names the wait."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return "(py-spy not installed: no stacks)"
    try:
        dump = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(py-spy dump failed: {exc})"
    return f"evald's threads:\n{dump.stdout}{dump.stderr}"


def _secs(value: float | None, otherwise: str) -> str:
    return otherwise if value is None else f"{value:.1f}s"


def assert_exact_on_the_cluster(
    cluster: Cluster, unique: str, windows: Path, seen: list, written: int
) -> None:
    """The whole oracle (module docstring)."""
    topics = names(unique)
    tools = KafkaTools(cluster.bootstrap)
    inputs = (topics["impressions"], topics["feedback"])
    stored = sum(len(tools.read(topic)) for topic in inputs)
    assert stored == written, "the cluster lost or doubled input records: the test is void"
    expected, reference = tools.expected(
        make_settings(cluster.bootstrap, unique).engine_config(), *inputs
    )
    assert_exactly_once(results_by_id(tools, topics["results"]), expected)
    assert_windows_equal(read_windows(windows), reference)
    assert_seen_during_chaos_stands(seen, expected, tools, topics["results"])
    assert_offsets_at_the_end(cluster, unique)
    assert_no_transaction_left_open(cluster, unique)


def assert_offsets_at_the_end(cluster: Cluster, unique: str) -> None:
    """The group's committed offsets reach the end of both inputs. evald commits, per input,
    the smallest offset still needed to rebuild pending joins (docs/design.md), and next to it
    the offset of its own checkpoint record, which names how far the engine consumed: so the
    committed checkpoint of every partition has consumed both inputs to their end, and the
    input offsets the group committed are the ones that checkpoint was committed with."""
    topics = names(unique)
    checkpoints = f"{topics['results']}.checkpoints"
    inputs = {"impression": topics["impressions"], "feedback": topics["feedback"]}
    committed = cluster.committed_offsets(f"g-{unique}")
    written = {
        (r.partition, r.offset): Checkpoint.decode(r.value)
        for r in KafkaTools(cluster.bootstrap).read(checkpoints, committed=True)
    }
    ends = {kind: cluster.end_offsets(topic) for kind, topic in inputs.items()}
    for p in range(PARTITIONS):
        checkpoint = written[(p, committed[(checkpoints, p)] - 1)]
        for kind, topic in inputs.items():
            assert checkpoint.consumed[kind] == ends[kind][(topic, p)], (topic, p)
            assert committed[(topic, p)] == checkpoint.committed[kind], (topic, p)


def assert_no_transaction_left_open(cluster: Cluster, unique: str) -> None:
    """No transaction of evald's left undecided (``Ongoing``) on any coordinator; a decided one
    (``PrepareCommit``/``PrepareAbort``: EndTxn answers before the markers are written) must
    complete within seconds; then no producer holds a transaction open on evald's output
    partitions. Checking ``Ongoing`` at once matters: the coordinator would abort a left-open
    transaction by itself after the transaction timeout."""
    prefix = transactional_id(unique)
    undecided = [t for t in cluster.open_transactions(prefix) if t.state == "Ongoing"]
    assert undecided == []
    wait_until(lambda: not cluster.open_transactions(prefix), 30, "transaction markers written")
    topics = names(unique)
    for topic in (topics["results"], topics["dlq"], f"{topics['results']}.checkpoints"):
        wait_until(
            lambda topic=topic: not cluster.producers_with_open_transactions(topic),
            15,
            f"no open transaction on {topic}",
        )


def kill_and_recover(
    cluster: Cluster, inst: Instance, what: str, where: Callable[[], int]
) -> Fault:
    """kill -9 of the node ``where()`` names; wait until the role has moved to a live node and
    results flow without it; restart it on its data and wait until every replica is in sync."""
    victim = where()
    done = Fault(f"{what} (node {victim}) kill -9", time.monotonic(), produced_now(inst))
    cluster.node(victim).kill()
    moved_from(victim, where)
    wait_until(
        lambda: produced_now(inst) > done.produced_before,
        120,
        f"results flowing with the {what} dead",
    )
    cluster.restart(victim)
    cluster.wait_in_sync()
    return done


def moved_from(victim: int, where: Callable[[], int]) -> int:
    """Where ``where()`` says the role is now, once it answers with another live node."""

    def elsewhere() -> int | None:
        try:
            node = where()
        except Exception:  # the role is still moving: the coordinator is loading, no leader
            return None
        return node if node not in (victim, -1) else None

    return int(wait_until(elsewhere, 60, f"the role to move off node {victim}"))


# -- the cases -----------------------------------------------------------------------------


def test_the_leader_of_a_results_partition_killed(
    cluster: Cluster, unique: str, tmp_path: Path
) -> None:
    """The leader of a results partition that coordinates neither evald's transactions nor its
    group, when there is one (the coordinator cases are the next two): a failover alone."""
    results = names(unique)["results"]

    def victim() -> int:
        return cluster.leaders(results)[partition[0]]

    partition: list[int] = []

    def fault(inst: Instance) -> Fault:
        coordinators = {
            cluster.transaction_coordinator(transactional_id(unique)),
            cluster.group_coordinator(f"g-{unique}"),
        }
        leaders = cluster.leaders(results)
        partition.append(next((p for p, n in leaders.items() if n not in coordinators), 0))
        return kill_and_recover(cluster, inst, f"results partition {partition[0]} leader", victim)

    chaos_run(cluster, unique, tmp_path, seed=31, fault=fault)


def test_the_transaction_coordinator_killed(cluster: Cluster, unique: str, tmp_path: Path) -> None:
    """The coordinator found by FindCoordinator (key type transaction) for evald's
    transactional id; evald's open transaction dies with it and is re-run elsewhere."""
    txn = transactional_id(unique)

    def fault(inst: Instance) -> Fault:
        return kill_and_recover(
            cluster, inst, "transaction coordinator", lambda: cluster.transaction_coordinator(txn)
        )

    chaos_run(cluster, unique, tmp_path, seed=32, fault=fault)


def test_the_group_coordinator_killed(cluster: Cluster, unique: str, tmp_path: Path) -> None:
    group = f"g-{unique}"

    def fault(inst: Instance) -> Fault:
        return kill_and_recover(
            cluster, inst, "group coordinator", lambda: cluster.group_coordinator(group)
        )

    chaos_run(cluster, unique, tmp_path, seed=33, fault=fault)


def test_two_brokers_down_evald_stalls_then_resumes(
    cluster: Cluster, unique: str, tmp_path: Path
) -> None:
    """Below min ISR nothing can be committed: evald must stop producing results, say why on
    /readyz, lose nothing, and go on once the brokers are back."""
    txn = transactional_id(unique)
    stalled: list[float] = []

    def fault(inst: Instance) -> Fault:
        coordinator = cluster.transaction_coordinator(txn)
        victims = [coordinator, next(i for i in (1, 2, 3) if i != coordinator)]
        done = Fault(f"two brokers (nodes {victims}) kill -9", time.monotonic(), produced_now(inst))
        for victim in victims:
            cluster.node(victim).kill()
        wait_until(lambda: inst.get("/readyz")[0] != 200, 120, "/readyz to report the outage")
        frozen = produced_now(inst)
        time.sleep(8.0)
        assert produced_now(inst) == frozen, "results committed below min ISR"
        stalled.append(frozen - done.produced_before)
        cluster.restart(*victims)
        cluster.wait_in_sync()
        return done

    done, sampler = chaos_run(cluster, unique, tmp_path, seed=34, fault=fault)
    assert sampler.not_ready_reasons(done.at), "/readyz never said why"
    print(f"two brokers down: {stalled[0]:.0f} results committed between the kill and the stall")


def test_a_rolling_restart_of_all_three_brokers(
    cluster: Cluster, unique: str, tmp_path: Path
) -> None:
    """One node at a time: SIGTERM (a controlled shutdown hands its leaderships over), start it
    on its data, wait until every replica is in sync, next."""
    per_node: list[str] = []

    def fault(inst: Instance) -> Fault:
        done = Fault("rolling restart (SIGTERM)", time.monotonic(), produced_now(inst))
        for node_id in (1, 2, 3):
            began = time.monotonic()
            cluster.node(node_id).stop()
            cluster.restart(node_id)
            cluster.wait_in_sync()
            per_node.append(f"node {node_id} {time.monotonic() - began:.1f}s")
        return done

    chaos_run(cluster, unique, tmp_path, seed=35, fault=fault)
    print(f"rolling restart, stop -> in sync: {', '.join(per_node)}")


# -- the oracle's own negative control -------------------------------------------------------


def test_the_cluster_oracle_sees_an_open_transaction_and_offsets_short_of_the_end(
    cluster: Cluster, unique: str
) -> None:
    """The checks beyond the single-broker oracle can fail: a transaction left open on an
    output topic or under evald's transactional id, and a committed checkpoint that consumed
    less than the inputs hold."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    topics = names(unique)
    checkpoints = f"{topics['results']}.checkpoints"
    inputs = {"impression": topics["impressions"], "feedback": topics["feedback"]}
    cluster.create(
        {t: PARTITIONS for t in (*inputs.values(), topics["results"], topics["dlq"], checkpoints)}
    )
    for txn_id, topic in ((unique, topics["results"]), (transactional_id(unique), topics["dlq"])):
        producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=txn_id)
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, b"{}", partition=1)
            producer.flush()
            # evald's id: Ongoing at once; another producer's: still open after the wait
            with pytest.raises((AssertionError, pytest.fail.Exception)):
                assert_no_transaction_left_open(cluster, unique)
            producer.abort_transaction()
        finally:
            producer.close(timeout=5)
    assert_no_transaction_left_open(cluster, unique)

    tools = KafkaTools(cluster.bootstrap)
    tools.produce_raw(topics["impressions"], [b"a", b"b"], partition=0)
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    for p in range(PARTITIONS):
        # partition 0's checkpoint consumed one impression of the two
        at = {"impression": 1 if p == 0 else 0, "feedback": 0}
        mark = Checkpoint.of(p, None, committed=at, consumed=at)
        tools.produce_raw(checkpoints, [mark.encode()], partition=p)
        offsets[TopicPartition(checkpoints, p)] = OffsetAndMetadata(1, "", -1)
        for kind, topic in inputs.items():
            offsets[TopicPartition(topic, p)] = OffsetAndMetadata(at[kind], "", -1)
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id=f"g-{unique}")
    try:
        consumer.commit(offsets)
    finally:
        consumer.close()
    with pytest.raises(AssertionError, match=topics["impressions"]):
        assert_offsets_at_the_end(cluster, unique)
    # caught up, the same check passes: the failure above was the one planted
    tools.produce_raw(
        checkpoints,
        [
            Checkpoint.of(
                0, None, {"impression": 2, "feedback": 0}, {"impression": 2, "feedback": 0}
            ).encode()
        ],
        partition=0,
    )
    offsets[TopicPartition(checkpoints, 0)] = OffsetAndMetadata(2, "", -1)
    offsets[TopicPartition(topics["impressions"], 0)] = OffsetAndMetadata(2, "", -1)
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id=f"g-{unique}")
    try:
        consumer.commit(offsets)
    finally:
        consumer.close()
    assert_offsets_at_the_end(cluster, unique)
