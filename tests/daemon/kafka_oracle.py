"""The oracle of the Kafka tests: the results topic read with ``read_committed`` and no
de-duplication equals one uninterrupted engine fed the same records (every request_id once, every
value equal), the window aggregates equal that engine's, the committed checkpoints reach the ends
of both inputs, no transaction is left open, and what a ``read_committed`` reader saw *during* a
fault still stands afterwards (docs/design.md, "What real Kafka changed")."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from kafka_harness import KafkaTools, wait_until
from kafka_instances import make_settings, names

from evald.config import EngineConfig
from evald.daemon.main.checkpoint import Checkpoint
from evald.engine import Engine


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
        now = tools.read(topic, committed=True)
        final = {(r.partition, r.offset) for r in now}
        home: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for r in now:
            home[json.loads(r.value)["request_id"]].append((r.partition, r.offset))
        where = [
            (
                r.partition,
                r.offset,
                "committed now" if (r.partition, r.offset) in final else "not committed now",
                "same bytes on the log" if log.get((r.partition, r.offset)) == r.value else "gone",
                _why_bad(r, seen, expected),
                f"committed copies now at {home.get(json.loads(r.value)['request_id'], [])}",
            )
            for r in bad[:5]
        ]
        pytest.fail(f"{len(bad)} results seen during the chaos do not stand, e.g. {where}")
    return len(seen)


def _why_bad(record: Any, seen: dict[str, list[Any]], expected: dict[str, Any]) -> str:
    """Why one record seen during the chaos does not stand: seen twice, unknown, or which
    fields differ from the uninterrupted run's result."""
    doc = json.loads(record.value)
    copies = len(seen[doc["request_id"]])
    want = expected.get(doc["request_id"])
    if want is None:
        return "not in the uninterrupted run"
    if doc != want:
        fields = sorted(k for k in doc.keys() | want.keys() if doc.get(k) != want.get(k))
        return f"differs: {[(k, doc.get(k), want.get(k)) for k in fields]}"[:600]
    return f"seen {copies} times"


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
        # the bootstrap sums behind it are keyed by each list's cluster (its user): a result
        # re-added after a restart must keep its user's weights (docs/statistics.md)
        got, ref = (r["ci95_clustered_halfwidth"] for r in (have[k], row))
        assert (got is None) == (ref is None), k  # None: below its minimum n (NaN)
        assert got is None or math.isclose(got, ref, rel_tol=1e-9), (k, got, ref)


def read_windows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def expected_results(tools: KafkaTools, unique: str) -> dict[str, Any]:
    """request_id -> result of one uninterrupted engine over the test's input topics."""
    topics = names(unique)
    config = make_settings(tools.bootstrap, unique).engine_config()
    return tools.expected(config, topics["impressions"], topics["feedback"])[0]


def assert_matches_an_uninterrupted_run(
    kafka_tools: KafkaTools,
    unique: str,
    windows: Path,
    *,
    leaky_broker: bool = False,
    config: EngineConfig | None = None,
) -> int:
    """Results read_committed exactly once (identical copies allowed only on a broker that
    leaks aborted records), the window rows equal to one engine fed every record, and the
    counters the last committed checkpoints carry, summed, equal to that engine's; returns
    the copies seen. ``config``: the engine settings evald ran with (default: the tests')."""
    topics = names(unique)
    expected, reference = kafka_tools.expected(
        config or make_settings(kafka_tools.bootstrap, unique).engine_config(),
        topics["impressions"],
        topics["feedback"],
    )
    copies = assert_exactly_once(
        results_by_id(kafka_tools, topics["results"], committed=not leaky_broker),
        expected,
        allow_identical_copies=leaky_broker,
    )
    assert_windows_equal(read_windows(windows), reference)
    if not leaky_broker:  # tansu answers neither ListTransactions nor DescribeProducers
        last = assert_consumed_to_the_end(kafka_tools, unique)
        assert_checkpoints_count_once(last, reference.stats.counted())
        assert_no_transaction_left_open(kafka_tools, unique)
    return copies


def assert_dead_letters_once(
    tools: KafkaTools, unique: str, config: EngineConfig | None = None
) -> int:
    """The DLQ read ``read_committed`` holds one letter per input record the engine refuses
    (found by decoding every record as the daemon does, with its record timestamp) and
    nothing else; returns how many. ``config``: the engine settings evald ran with."""
    from evald.decode import Rejection

    topics = names(unique)
    engine = Engine(config or make_settings(tools.bootstrap, unique).engine_config())
    want = set()
    for kind, topic in (("impression", topics["impressions"]), ("feedback", topics["feedback"])):
        for r in tools.read(topic):
            got = engine.feed(r.value, partition=r.partition, kind=kind, timestamp=r.timestamp)
            if isinstance(got, Rejection):
                want.add((topic, r.partition, r.offset))
    letters: dict[tuple[str, int, int], int] = defaultdict(int)
    for record in tools.read(topics["dlq"], committed=True):
        headers = dict(record.headers)
        source = (
            headers["evald-source-topic"].decode(),
            int(headers["evald-source-partition"]),
            int(headers["evald-source-offset"]),
        )
        letters[source] += 1
    assert want, "no record to dead-letter: the check is not effective"
    twice = {source: n for source, n in letters.items() if n > 1}
    assert not twice, f"{len(twice)} records dead-lettered more than once, e.g. {list(twice)[:3]}"
    assert set(letters) == want
    return len(want)


def assert_checkpoints_count_once(last: dict[int, Checkpoint], want: dict[str, int]) -> None:
    """Every engine counter, summed over the partitions' last committed checkpoints, equals
    one uninterrupted engine's: each record and outcome counted by exactly one commit."""
    got: Counter[str] = Counter()
    for checkpoint in last.values():
        got.update(checkpoint.state.counters)
    assert want.get("events/impression/accepted"), "nothing counted: the check is not effective"
    assert dict(+got) == want, {k: (got.get(k), want.get(k)) for k in set(got) | set(want)}


def assert_consumed_to_the_end(tools: KafkaTools, unique: str) -> dict[int, Checkpoint]:
    """The group's committed offsets on the checkpoint topic point, for every partition, at a
    checkpoint whose consumed positions are the ends of both inputs, and its committed offsets
    on the inputs are that checkpoint's replay start (they stay behind the end by the
    impressions still pending in the engine's open window); returns those checkpoints."""
    from kafka import KafkaAdminClient

    topics = names(unique)
    checkpoints = make_settings(tools.bootstrap, unique).topics.checkpoint_topic
    admin = KafkaAdminClient(bootstrap_servers=tools.bootstrap)
    try:
        group = f"g-{unique}"
        offsets = {
            (tp.topic, tp.partition): meta.offset
            for tp, meta in admin.list_group_offsets({group: None})[group].items()
        }
    finally:
        admin.close()
    on_log = {(r.partition, r.offset): r.value for r in tools.read(checkpoints, committed=True)}
    ends = {
        "impression": tools.end_offsets(topics["impressions"]),
        "feedback": tools.end_offsets(topics["feedback"]),
    }
    partitions = sorted(set(ends["impression"]) | set(ends["feedback"]))
    assert partitions, "no input records: the check is not effective"
    last = {}
    for p in partitions:
        at = offsets.get((checkpoints, p))
        assert at is not None and (p, at - 1) in on_log, f"partition {p}: no committed checkpoint"
        checkpoint = last[p] = Checkpoint.decode(on_log[(p, at - 1)])
        assert checkpoint.consumed == {k: ends[k].get(p, 0) for k in ends}, p
        for kind, topic in (("impression", "impressions"), ("feedback", "feedback")):
            assert offsets.get((topics[topic], p)) == checkpoint.committed[kind], (p, kind)
    return last


def _group_transactions(admin: Any, unique: str) -> list[Any]:
    """Every transaction listing (ListTransactions) of the group's transactional ids."""
    return [
        listing
        for listings in admin.list_transactions(
            transactional_id_pattern=f"evald/g-{unique}/.*"
        ).values()
        for listing in listings
    ]


def wait_killed_transactions_aborted(
    tools: KafkaTools, unique: str, *killed: str, timeout: float = 60.0
) -> None:
    """Wait until the broker has ended the transactions of the ``killed`` instances.

    An instance killed with a transaction open keeps the partitions that transaction wrote
    behind their last stable offset until the coordinator aborts it at
    ``transaction_timeout_ms`` (a survivor has its own transactional id and cannot fence it):
    a ``read_committed`` reader sees nothing past it, the survivor's committed results
    included, until then. A survivor that catches up sooner than that timeout (the instances'
    10 s) must not be read before: what a downstream reader sees eventually is what counts."""
    from kafka import KafkaAdminClient
    from kafka.admin import TransactionState

    done = {
        TransactionState.EMPTY,
        TransactionState.COMPLETE_COMMIT,
        TransactionState.COMPLETE_ABORT,
    }
    ids = {f"evald/g-{unique}/{name}" for name in killed}
    admin = KafkaAdminClient(bootstrap_servers=tools.bootstrap)

    def ended() -> bool:
        listed = _group_transactions(admin, unique)
        return all(t.state in done for t in listed if t.transactional_id in ids)

    try:
        wait_until(ended, timeout, f"the killed instances' transactions ended: {sorted(ids)}")
    finally:
        admin.close()


def assert_no_transaction_left_open(tools: KafkaTools, unique: str) -> None:
    """No transactional id of the group is in an open state (ListTransactions) and no partition
    evald writes has an open transaction (DescribeProducers)."""
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.admin import TransactionState

    topics = names(unique)
    done = {
        TransactionState.EMPTY,
        TransactionState.COMPLETE_COMMIT,
        TransactionState.COMPLETE_ABORT,
    }
    admin = KafkaAdminClient(bootstrap_servers=tools.bootstrap)
    try:
        listed = _group_transactions(admin, unique)
        assert listed, "evald's transactional ids are not listed: the check is not effective"
        still_open = [(t.transactional_id, t.state) for t in listed if t.state not in done]
        assert not still_open, f"transactions left open: {still_open}"
        checkpoints = make_settings(tools.bootstrap, unique).topics.checkpoint_topic
        written = [topics["results"], checkpoints]
        tps = [TopicPartition(t, p) for t in written for p in tools.partitions(t)]
        producers = admin.describe_producers(tps)
    finally:
        admin.close()
    assert set(producers) == set(tps)
    in_txn = [
        (tp.topic, tp.partition, state.producer_id, state.current_transaction_start_offset)
        for tp, described in producers.items()
        for state in described.active_producers
        if state.current_transaction_start_offset != -1
    ]
    assert not in_txn, f"partitions with a transaction still open: {in_txn}"
