"""`evald run`'s comparisons over every partition, on Apache Kafka.

Two instances share four partitions, one is killed -9 mid-stream, and the comparison series on
the survivor's /metrics (difference, bounds, n per arm, p-value, CUSUMs, sample-ratio guard)
equal those of one uninterrupted engine folding the same records — the engine `evald replay`
runs, fed per partition in the daemon's documented order. On one partition, killed -9 and
restarted, they equal what the `evald replay` command prints for the same records
(docs/design.md, "Statistics over all partitions").
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka_harness import ENGINE, Broker, KafkaTools, wait_until
from kafka_instances import Instance, names
from kafka_oracle import assert_consumed_to_the_end
from planted_checkpoint import WIDTH, plant
from prometheus_client import generate_latest

from evald.config import EngineConfig, load_config
from evald.daemon.main.comparisons import statistics_topic
from evald.daemon.settings import TopicSettings
from evald.exposition import build_registry
from evald.statistics.shares import Frozen, Share, decode_record

pytestmark = pytest.mark.kafka

STATISTICS = {
    "window": "5m",
    "min_n": 30,
    "cusum_min_n": 10,
    "tuning_n": 2000,
    "comparisons": [
        {
            "name": "ab",
            "label": "arm",
            "control": "control",
            "treatments": ["treatment"],
            "start": 0,
            "arm_scoped_labels": ["model"],
            "min_effect": {"nDCG@10": 0.01},
        }
    ],
}
PREFIXES = ("evald_comparison_", "evald_cusum_")
#: the simulator's records per wall second (at 60x event time): 8000 records span 42 minutes
#: of event time, eight 5-minute windows of about 450 lists each, so every CUSUM steps
RATE = 200.0


def comparison_samples(text: str) -> dict[str, float]:
    """The comparison series of an exposition: sample line (name and labels) -> value."""
    out = {}
    for line in text.splitlines():
        if line.startswith(PREFIXES):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def equal(got: dict[str, float], want: dict[str, float]) -> bool:
    return got.keys() == want.keys() and all(
        math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-12) for k in want
    )


def show_differences(got: dict[str, float], want: dict[str, float]) -> None:
    """Print the series that differ (pytest shows them when the wait fails)."""
    for key in sorted(want.keys() | got.keys()):
        if not math.isclose(got.get(key, math.nan), want.get(key, math.nan), rel_tol=1e-9):
            print(f"{key}: got {got.get(key)} want {want.get(key)}")


def reference(tools: KafkaTools, unique: str) -> dict[str, float]:
    """The uninterrupted engine's comparison series (what `evald replay` folds)."""
    topics = names(unique)
    config = load_config({**ENGINE, "statistics": STATISTICS})
    _, engine = tools.expected(
        config, topics["impressions"], topics["feedback"], global_statistics=True
    )
    registry, _ = build_registry(engine, process=False)
    return comparison_samples(generate_latest(registry).decode())


def test_two_instances_one_killed_fold_the_same_comparison_as_one_engine(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 4, topics["feedback"]: 4})
    extra = ("--set", f"engine.statistics={json.dumps(STATISTICS)}")
    a, b = instances("a", extra=extra), instances("b", extra=extra)
    wait_until(lambda: a.lag_zero(2) and b.lag_zero(2), 90, "two partitions for each instance")
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=8000, seed=6, rate=RATE
    )
    wait_until(
        lambda: (
            a.metric("evald_results_produced_total") > 100
            and b.metric("evald_results_produced_total") > 100
        ),
        90,
        "both instances producing results",
    )
    a.kill()
    wait_until(lambda: b.lag_zero(4), 150, "the survivor to take over and catch up")
    want = reference(kafka_tools, unique)
    assert any(k.startswith("evald_comparison_lower{") for k in want), "no bound: too little data"
    # the simulator's impressions have user ids: every variance is clustered by user, so the
    # replicate sums went through the shares, the topic and the checkpoints
    clustered = [v for k, v in want.items() if k.startswith("evald_comparison_clustered{")]
    assert clustered and all(v == 1.0 for v in clustered)
    assert want['evald_comparison_end_timestamp_seconds{comparison="ab"}'] > 0

    def survivor() -> dict[str, float]:
        return comparison_samples(b.get("/metrics")[1])

    try:
        wait_until(lambda: equal(survivor(), want), 60, "the survivor's comparison to settle")
    finally:
        show_differences(survivor(), want)
    # every (window, partition) share was written once, by a committed transaction
    topic = statistics_topic(TopicSettings(**topics))
    records = [decode_record(r.value) for r in kafka_tools.read(topic, committed=True)]
    shares = [(r.start, r.partition) for r in records if isinstance(r, Share)]
    assert shares and len(shares) == len(set(shares))
    assert {r.partition for r in records if isinstance(r, Frozen)} == {0, 1, 2, 3}
    # a fresh instance folds the same comparison from the topic alone
    c = instances("c", extra=extra)
    started = time.monotonic()

    def reader() -> dict[str, float]:
        return comparison_samples(c.get("/metrics")[1])

    try:
        wait_until(lambda: equal(reader(), want), 60, "a new reader")
    finally:
        show_differences(reader(), want)
    took = time.monotonic() - started
    print(f"a third instance folded the comparison from the topic in {took:.1f}s")
    assert b.terminate() == 0 and c.terminate() == 0


LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def by_labels(samples: dict[str, float]) -> dict[tuple, float]:
    """Sample lines keyed by (name, sorted non-empty label pairs)."""
    out = {}
    for line, value in samples.items():
        name = line.split("{", 1)[0]
        labels = tuple(sorted((k, v) for k, v in LABEL.findall(line) if v))
        out[(name, labels)] = value
    return out


def replay_command(tools: KafkaTools, unique: str, tmp_path: Path) -> list[dict]:
    """`evald replay --format json` over the topics' records in the daemon's order."""
    topics = names(unique)
    records = [(r, 0) for r in tools.read(topics["impressions"])]
    records += [(r, 1) for r in tools.read(topics["feedback"])]
    records.sort(key=lambda x: (x[0].partition, x[0].timestamp, x[1], x[0].offset))
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(r.value + b"\n" for r, _ in records))
    config = tmp_path / "engine.json"
    config.write_text(json.dumps({**ENGINE, "statistics": STATISTICS}))
    argv = [sys.executable, "-m", "evald", "replay", "--config", str(config)]
    proc = subprocess.run(
        [*argv, "--format", "json", str(events)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["comparisons"]


def replay_matches(records: list[dict], got: dict[tuple, float]) -> bool:
    """Every value `evald replay` printed is the series of the same name and labels, and the
    series are no more than those."""
    want: dict[tuple, float] = {}
    for r in records:
        rest = tuple(r["segment"].items())
        pair = (("comparison", r["comparison"]), ("measure", r["measure"]), *rest)
        treat = tuple(sorted((*pair, ("arm", r["treatment"]))))
        control = tuple(sorted((*pair, ("arm", r["control"]))))
        for name, key in [
            ("difference", "difference"),
            ("lower", "lower"),
            ("upper", "upper"),
            ("p_value", "p_value"),
            ("alpha", "alpha"),
        ]:
            if r[key] is not None:
                want[(f"evald_comparison_{name}", treat)] = r[key]
        want[("evald_cusum_vs_control", treat)] = r["cusum_vs_control"]
        want[("evald_comparison_clustered", treat)] = float(r["variance"] == "user")
        for arm, statistic in r["cusum_vs_baseline"].items():
            if statistic is not None:
                arm_key = tuple(sorted((*pair, ("arm", arm))))
                want[("evald_cusum_vs_baseline", arm_key)] = statistic
        want[("evald_comparison_lists", treat)] = r["n_treatment"]
        want[("evald_comparison_lists", control)] = r["n_control"]
        srm = tuple(sorted((("comparison", r["comparison"]), *rest)))
        want[("evald_comparison_srm_p_value", srm)] = r["srm_p_value"]
    names_ = {name for name, _ in want}
    mine = {k: v for k, v in got.items() if k[0] in names_}
    return mine.keys() == want.keys() and all(
        math.isclose(mine[k], want[k], rel_tol=1e-9, abs_tol=1e-12) for k in want
    )


def test_one_partition_killed_and_restarted_equals_the_evald_replay_command(
    broker: Broker,
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
    tmp_path: Path,
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    extra = ("--set", f"engine.statistics={json.dumps(STATISTICS)}")
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=6000, seed=7, rate=RATE
    )
    # two blocks of impressions of no arm, 20 minutes on: the watermark passes every window
    # with data (a time moves it once a whole block of watermark_quorum events reached it;
    # `evald replay` folds the rest at its drain; these are in no comparison)
    last = max(r.timestamp for r in kafka_tools.read(topics["impressions"]))
    quorum = EngineConfig.model_fields["watermark_quorum"].default
    ts = last + 1_200_000
    tail = [
        json.dumps({"request_id": f"tail-{i}", "ts": ts, "items": ["x"], "labels": {"arm": "none"}})
        for i in range(2 * quorum)
    ]
    kafka_tools.produce_raw(topics["impressions"], [t.encode() for t in tail], timestamp_ms=ts)
    first = instances("a", extra=extra)
    wait_until(
        lambda: first.metric("evald_results_produced_total") > 300, 90, "results before the kill"
    )
    first.kill()
    second = instances("a", extra=extra)
    wait_until(lambda: second.lag_zero(1), 120, "the restarted daemon to catch up")
    records = replay_command(kafka_tools, unique, tmp_path)
    assert records and any(r["lower"] is not None for r in records)
    assert all(r["variance"] == "user" for r in records)

    def got() -> dict[tuple, float]:
        return by_labels(comparison_samples(second.get("/metrics")[1]))

    wait_until(lambda: replay_matches(records, got()), 60, "the comparison of evald replay")
    assert second.terminate() == 0


@pytest.mark.chaos
@pytest.mark.parametrize("recovery", ["restart", "takeover"])
@pytest.mark.parametrize("step", ["statistics_sent", "statistics_committed"])
def test_kill_9_around_the_commit_of_shares_is_exact(
    step: str,
    recovery: str,
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
) -> None:
    """The process kills itself just before (``statistics_sent``: shares flushed into the open
    transaction) or just after (``statistics_committed``) the first commit holding a share;
    the same instance restarts, or a live one takes over. Every share is on the topic once,
    from committed transactions, and the comparison equals the uninterrupted engine's."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 4, topics["feedback"]: 4})
    extra = ("--set", f"engine.statistics={json.dumps(STATISTICS)}")
    victim = instances("a", extra=extra, crash_at=step)
    heir = instances("b", extra=extra) if recovery == "takeover" else None
    if heir is not None:
        wait_until(lambda: victim.lag_zero(2) and heir.lag_zero(2), 90, "two members sharing")
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=8000, seed=21, rate=RATE
    )
    wait_until(lambda: victim.proc.poll() is not None, 120, f"the crash at {step}")
    assert "killing this process" in victim.log_path.read_text(errors="replace")
    survivor = heir or instances("a", extra=extra)
    wait_until(lambda: survivor.lag_zero(4), 180, "one instance owning everything, caught up")
    want = reference(kafka_tools, unique)
    wait_until(
        lambda: equal(comparison_samples(survivor.get("/metrics")[1]), want),
        60,
        "the survivor's comparison to equal the uninterrupted engine's",
    )
    topic = statistics_topic(TopicSettings(**topics))
    records = [decode_record(r.value) for r in kafka_tools.read(topic, committed=True)]
    shares = [(r.start, r.partition) for r in records if isinstance(r, Share)]
    assert shares and len(shares) == len(set(shares))
    if step == "statistics_sent":  # the killed transaction's shares are in the log, aborted
        everything = [decode_record(r.value) for r in kafka_tools.read(topic)]
        assert sum(isinstance(r, Share) for r in everything) > len(shares)
    assert survivor.terminate() == 0


def produce_many_surfaces(
    tools: KafkaTools, topics: dict[str, str], surfaces: int, start: int, stop: int
) -> None:
    """Simulator events ``start..stop`` with each request on one of ``surfaces`` surfaces."""
    from itertools import islice

    from kafka import KafkaProducer

    from evald.demo.simulator import IMPRESSION, Faults, Simulator

    producer = KafkaProducer(bootstrap_servers=tools.bootstrap, linger_ms=10)
    try:
        sim = Simulator(8, rate=400, speed=60, faults=Faults(malformed=0.0))
        for event in islice(sim.events(), start, stop):
            value = event.value
            if event.kind == IMPRESSION:
                doc = json.loads(value)
                doc["labels"]["surface"] = f"s{zlib.crc32(event.key) % surfaces}"
                value = json.dumps(doc).encode()
            topic = topics["impressions" if event.kind == IMPRESSION else "feedback"]
            producer.send(topic, key=event.key, value=value, timestamp_ms=event.at_ms)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


#: 20 measures on 300 surfaces: a partition's open shares are over 64 KiB of JSON after the
#: first 9,000 events of seed 8 (about 93 KB in each of the two partitions)
WIDE = {
    "label_value_cap": 1000,
    "max_segments": 2000,
    "max_series": 10_000_000,
    "measures": [f"nDCG@{k}" for k in range(1, 11)] + [f"P@{k}" for k in range(1, 11)],
}


def consumed_to_the_end(tools: KafkaTools, unique: str) -> bool:
    """Every input record fed and committed (read from Kafka: this test's /metrics, tens of
    thousands of series, is too heavy to poll)."""
    from kafka.errors import KafkaError

    try:
        assert_consumed_to_the_end(tools, unique)
    except (AssertionError, KafkaError):  # not yet, or no group coordinator yet
        return False
    return True


@pytest.mark.chaos  # about 2 minutes
def test_open_shares_too_large_for_a_checkpoint_record_restore_exactly(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """Hundreds of segments: the open shares leave the checkpoint record for records of their
    own; after a kill -9 the restart reads them back, the rest of the stream completes the
    open window, and the comparison equals the uninterrupted engine's."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    extra = ["--set", f"engine.statistics={json.dumps(STATISTICS)}"]
    for key, value in WIDE.items():
        extra += ["--set", f"engine.{key}={json.dumps(value)}"]
    produce_many_surfaces(kafka_tools, topics, 300, 0, 9000)
    first = instances("a", extra=tuple(extra))

    def done() -> bool:
        return consumed_to_the_end(kafka_tools, unique)

    wait_until(done, 120, "the first part consumed and committed", interval=2.0)
    first.kill()
    second = instances("a", extra=tuple(extra))
    wait_until(lambda: second.get("/readyz")[0] == 200, 120, "the restart ready", interval=1.0)
    log = second.log_path.read_text(errors="replace")
    assert log.count("open comparison shares read from") == 2, "restored inline, not from records"
    produce_many_surfaces(kafka_tools, topics, 300, 9000, 12000)
    wait_until(done, 180, "the rest consumed and committed", interval=2.0)
    config = load_config({**ENGINE, **WIDE, "statistics": STATISTICS})
    _, engine = kafka_tools.expected(
        config, topics["impressions"], topics["feedback"], global_statistics=True
    )
    registry, _ = build_registry(engine, process=False)
    want = comparison_samples(generate_latest(registry).decode())
    assert len(want) > 5000
    wait_until(
        lambda: equal(comparison_samples(second.get("/metrics", timeout=30)[1]), want),
        90,
        "the restarted daemon's comparison",
        interval=2.0,
    )
    assert second.terminate() == 0


def test_a_deleted_statistics_topic_is_refused_until_the_comparison_starts_after_the_loss(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """Partition 0's checkpoint says its shares were published up to an hour ago, on the
    statistics topic as it was then. The topic deleted while evald runs stops it (it used to
    keep running; on a broker that creates topics on demand a client re-created it without
    compaction); the restart creates it compacted and refuses, since the comparison would miss
    the lost windows' lists (1,827 of 9,327 in one run); with the comparison started after the
    loss, evald runs."""
    from kafka import KafkaAdminClient

    from evald.daemon.connect_check import topic_configs
    from evald.decode import time_in_words

    def shares(final: int) -> dict[str, object]:
        return {"v": 1, "width": WIDTH, "final": final, "open": []}

    stats, final = plant(broker, kafka_tools, unique, shares)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:

        def comparing(start: int) -> tuple[str, ...]:
            config = {
                **STATISTICS,
                "comparisons": [{**STATISTICS["comparisons"][0], "start": start}],
            }  # type: ignore[index]
            return ("--set", f"engine.statistics={json.dumps(config)}")

        running = instances("a", extra=comparing(0))
        wait_until(lambda: running.get("/readyz")[0] == 200, 90, "readiness")
        admin.delete_topics([stats])
        wait_until(lambda: running.proc.poll() is not None, 60, "evald to stop")
        assert running.proc.returncode == 2
        text = running.log_path.read_text(errors="replace")
        assert f"statistics topic {stats} no longer exists while evald ran" in text

        restarted = instances("a", extra=comparing(0))
        wait_until(lambda: restarted.proc.poll() is not None, 60, "the restart to be refused")
        assert restarted.proc.returncode == 2
        text = restarted.log_path.read_text(errors="replace")
        assert f"the statistics topic {stats} was deleted and created again" in text
        assert "the comparisons ['ab'] would silently miss" in text
        assert f"set their start to {time_in_words(final)} or later" in text
        # evald created it again, compacted, one partition
        assert topic_configs(admin, stats)["cleanup.policy"] == "compact"  # type: ignore[index]
        assert len(admin.describe_topics([stats])[0]["partitions"]) == 1

        after = instances("a", extra=comparing(final))
        wait_until(lambda: after.get("/readyz")[0] == 200, 90, "readiness with the new start")
        assert after.terminate() == 0
    finally:
        admin.close()
