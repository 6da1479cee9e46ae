"""Every output exactly once when the faults land *during* a restore, with every feature on at
once (the chaos tier: four processes of `evald run`, under a minute).

The comparison (with its drop attributed to a label that is not a segment key), the click
model, the interleaving test, the zero-feedback signals and dead letters of planted malformed
records, over two partitions. A first process commits some and is killed -9; a second dies
(kill -9) restoring, its group's offsets fetched and nothing read yet (crash point
``restore``); a third has its session fail after its engine was rebuilt from the checkpoints,
snapshots and committed results but before an input was read (``restore_rebuilt:fault``, what
a broker lost at that point does), restores again in a new session of the same process and
consumes the rest. Then a member joins, dies restoring the partition it was given, and the
third restores both again in-process, after its own commits (what a rolling restart does to
the one that stays). Every output then equals one uninterrupted engine's: the results
read_committed with no de-duplication (interleaving credit and zero-feedback signals in them),
the window aggregates, the counters of the last checkpoints, one dead letter per refused
record, each comparison and credit share once on the statistics topic, the comparison and
preference series, the examination curve and the debiased click series, and the ``/queries``
page (drill-down and label attribution). The UBI mapping, another decoder, goes through the
same restarts in a test of its own.

A rolling restart of two instances sharing four partitions, with the same features and then
with UBI: ``a`` is stopped and started again while traffic flows, then ``b`` once ``a`` owns
partitions again, one stop a SIGTERM and the other a kill -9 (both orders); the instances
commit every 2 s, so that the revocations and stops commit work of their own. Caught up, each
instance must show the uninterrupted engine's comparison and preference series and the
examination curve of exactly the partitions it owns; then a last process restores all four
partitions and every output is checked as above.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from itertools import islice
from typing import Any

import pytest
from kafka_harness import ENGINE, KafkaTools, wait_until
from kafka_instances import Instance, make_settings, names
from kafka_oracle import assert_dead_letters_once, assert_matches_an_uninterrupted_run
from prometheus_client import generate_latest
from replay_traffic import MALFORMED
from test_kafka import committed_checkpoint
from test_kafka_click_model import debiased_beyond, examination_curve, exported
from test_kafka_statistics import equal, show_differences

from evald.config import EngineConfig, load_config
from evald.daemon.main.checkpoint import SnapshotRef
from evald.daemon.main.comparisons import decode_statistics, statistics_topic
from evald.daemon.main.snapshots import whole
from evald.daemon.settings import TopicSettings
from evald.demo.simulator import IMPRESSION, TEAMS, Faults, Simulator
from evald.drilldown.page import QueriesPage
from evald.engine import Engine
from evald.exposition import build_registry
from evald.interleaving.shares import CreditShare
from evald.statistics.shares import Share

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]

PARTITIONS = (0, 1)
#: "treatment" is the comparison's control: the control arm, worse on android (its lists
#: reversed there), is the arm with a drop, which the attribution puts on device=android
FEATURES: dict[str, Any] = {
    "statistics": {
        "window": "5m",
        "min_n": 30,
        "cusum_min_n": 10,
        "tuning_n": 2000,
        "comparisons": [
            {
                "name": "ab",
                "label": "arm",
                "control": "treatment",
                "treatments": ["control"],
                "start": 0,
            }
        ],
    },
    "interleaving": {"teams": list(TEAMS), "window": "5m", "min_n": 30},
    "click_model": {"model": "pbm", "refit_every": 100},
    "zero_feedback": {"depth": 10},
    "label_keys": ["arm", "surface"],  # "model" and "device" are summarised, not segments
}
EXTRA = tuple(
    arg for key, value in FEATURES.items() for arg in ("--set", f"engine.{key}={json.dumps(value)}")
)
#: simulator events (seed 23, 200 a wall second at 60x): 8,000 span about 42 minutes of event
#: time, written in three chunks ending at these
CHUNKS, SEED = (4000, 6000, 8000), 23
#: a malformed impression every this many events
PLANTED = 400
#: what the series compared on /metrics start with
PREFIXES = ("evald_comparison_", "evald_cusum_", "evald_interleaving_")


def produce(
    tools: KafkaTools, topics: dict[str, str], start: int, stop: int, pace: float = 0.0
) -> None:
    """Simulator events ``start..stop`` (3 in 10 requests interleaved), each impression given
    a device, the control arm's android lists reversed, and a malformed impression planted
    every ``PLANTED`` events; ``pace``: seconds to wait after every 100 events sent (traffic
    that keeps flowing while instances stop, start and rebalance)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=tools.bootstrap, linger_ms=10)
    try:
        sim = Simulator(SEED, rate=200, speed=60, faults=Faults(), interleave=0.3)
        for i, event in enumerate(islice(sim.events(), start, stop), start):
            value = event.value
            if event.kind == IMPRESSION:
                value = with_device(event.key, value)
                if i % PLANTED == 0:
                    key = f"planted-{i}".encode()
                    producer.send(
                        topics["impressions"], key=key, value=MALFORMED, timestamp_ms=event.at_ms
                    )
            topic = topics["impressions" if event.kind == IMPRESSION else "feedback"]
            producer.send(topic, key=event.key, value=value, timestamp_ms=event.at_ms)
            if pace and i % 100 == 99:
                producer.flush(timeout=30)
                time.sleep(pace)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def with_device(key: bytes, value: bytes) -> bytes:
    """The impression with a ``device`` label (android for a third of the request ids), its
    items reversed on the control arm's android lists; a malformed one unchanged."""
    try:
        doc = json.loads(value)
    except ValueError:
        return value
    if not isinstance(doc, dict) or not isinstance(doc.get("labels"), dict):
        return value
    android = zlib.crc32(key) % 3 == 0
    doc["labels"]["device"] = "android" if android else "ios"
    if android and doc["labels"].get("arm") == "control":
        doc["items"] = doc["items"][::-1]
    return json.dumps(doc).encode()


def config() -> EngineConfig:
    return load_config({**ENGINE, **FEATURES})


def samples(text: str) -> dict[str, float]:
    """The comparison, CUSUM and interleaving samples of an exposition."""
    out = {}
    for line in text.splitlines():
        if line.startswith(PREFIXES):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def queries(engine: Engine | None, inst: Instance | None = None) -> Any:
    """The ``/queries?k=1000`` document of the engine, or the one ``inst`` serves."""
    if inst is not None:
        status, text = inst.get("/queries?k=1000")
        return json.loads(text) if status == 200 else None
    status, doc = QueriesPage(lambda: engine, nullcontext())({"k": ["1000"]})
    assert status == 200
    return json.loads(json.dumps(doc))


def restored_clicks(
    tools: KafkaTools, unique: str, partitions: Iterable[int] = PARTITIONS
) -> Engine:
    """An engine holding the click models of the committed checkpoints of ``partitions``:
    what a restore loads, beyond which a process counts its debiased series."""
    engine = Engine(config())
    assert engine.clicks is not None
    topic = make_settings(tools.bootstrap, unique).topics.checkpoint_topic
    log = {(r.partition, r.offset): r.value for r in tools.read(topic)}
    for p in partitions:
        held = committed_checkpoint(tools, unique, p).state.click_model
        assert held is not None
        ref = SnapshotRef.from_json(held.get("records"))
        if ref is not None:  # too large for the checkpoint record: in records of its own
            raw = whole([log[(p, offset)] for offset in ref.offsets], ref)
            held = {k: v for k, v in held.items() if k != "records"}
            held["snapshot"] = base64.b64encode(raw).decode()
        engine.clicks.load(p, held)
    return engine


def assert_shares_once(tools: KafkaTools, topics: dict[str, str]) -> Counter[str]:
    """Each comparison share and credit share on the statistics topic once (read_committed);
    returns how many of each kind."""
    topic = statistics_topic(TopicSettings(**topics))
    keys: Counter[bytes] = Counter()
    kinds: Counter[str] = Counter()
    for record in tools.read(topic, committed=True):
        share = decode_statistics(record.value)
        if isinstance(share, Share | CreditShare):
            keys[record.key] += 1
            kinds[type(share).__name__] += 1
    twice = [key for key, n in keys.items() if n > 1]
    assert not twice, f"{len(twice)} shares committed more than once, e.g. {twice[:3]}"
    assert kinds["Share"] and kinds["CreditShare"], kinds
    return kinds


def faults(
    tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> tuple[Instance, Engine]:
    """The lives and their faults (see the module doc): returns the last process, by then
    alone and caught up, and an engine holding the click models it restored first."""
    topics = names(unique)
    tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    produce(tools, topics, 0, CHUNKS[0])
    first = instances("a", extra=EXTRA)
    wait_until(lambda: first.metric("evald_results_produced_total") > 500, 120, "results")
    first.kill()
    produce(tools, topics, CHUNKS[0], CHUNKS[1])
    dies = instances("a", extra=EXTRA, crash_at="restore")
    wait_until(lambda: dies.proc.poll() is not None, 120, "the kill -9 while restoring")
    assert dies.proc.returncode == -9
    assert "=restore: killing this process" in dies.log_path.read_text(errors="replace")
    restored = restored_clicks(tools, unique)  # the last process restores these
    last = instances("a", extra=EXTRA, crash_at="restore_rebuilt:fault")
    wait_until(lambda: last.lag_zero(2), 180, "the last process to restore twice, catch up")
    assert "=restore_rebuilt:fault: failing this session" in last.log_path.read_text(
        errors="replace"
    ), "not the hook"
    produce(tools, topics, CHUNKS[1], CHUNKS[2])
    joins = instances("b", extra=EXTRA, crash_at="restore")
    wait_until(lambda: joins.proc.poll() is not None, 120, "the member joining to die restoring")
    assert joins.proc.returncode == -9
    wait_until(lambda: last.alone(2), 180, "the last process to take everything back")
    return last, restored


def test_kills_while_restoring_and_a_broker_fault_after_the_rebuild_leave_every_output_exact(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    last, restored = faults(kafka_tools, unique, instances)
    assert_every_output_exact(kafka_tools, unique, last, restored)


def assert_every_output_exact(
    kafka_tools: KafkaTools, unique: str, last: Instance, restored: Engine
) -> None:
    """Every output of the run equals one uninterrupted engine's (the module doc's list);
    ``last``: the last process, alone and caught up, stopped here; ``restored``: the click
    models it restored first, beyond which it counts its debiased series."""
    topics = names(unique)
    want_engine = kafka_tools.expected(
        config(), topics["impressions"], topics["feedback"], global_statistics=True
    )[1]
    want = samples(generate_latest(build_registry(want_engine, process=False)[0]).decode())
    assert any(k.startswith("evald_comparison_lower{") for k in want), "no bound: too little"
    assert any(k.startswith("evald_interleaving_lower{") for k in want), "no band: too little"
    try:
        wait_until(lambda: equal(samples(last.get("/metrics")[1]), want), 60, "the series")
    finally:
        show_differences(samples(last.get("/metrics")[1]), want)
    want_page = queries(want_engine)
    explained = [r for r in want_page["attribution"] if r["explanations"]]
    assert explained and all(
        (r["explanations"][0]["dimension"], r["explanations"][0]["value"]) == ("device", "android")
        for r in explained
    ), "the drop is not attributed: not effective"
    wait_until(lambda: queries(None, last) == want_page, 60, "the /queries page")
    curve = examination_curve(want_engine)
    assert curve
    wait_until(
        lambda: exported(last, "evald_click_examination") == curve, 60, "the examination curve"
    )
    want_debiased = debiased_beyond(want_engine, restored)
    assert all(any(v > 0 for v in part.values()) for part in want_debiased.values())
    wait_until(
        lambda: (
            {p: exported(last, f"evald_click_measure_{p}") for p in want_debiased} == want_debiased
        ),
        60,
        "the debiased click series",
    )
    assert last.terminate() == 0

    assert_matches_an_uninterrupted_run(kafka_tools, unique, last.windows, config=config())
    letters = assert_dead_letters_once(kafka_tools, unique, config())
    kinds = assert_shares_once(kafka_tools, topics)
    print(f"every output exact: {letters} dead letters, shares once {dict(kinds)}")


def test_ubi_lists_through_kills_while_restoring_and_a_broker_fault_after_the_rebuild(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """The UBI mapping (another decoder, so a test of its own): lists assembled across
    records and topics, items shown up to a minute after their query so that lists stay open
    across the checkpoints, through the same faults; results exactly once and each equal to
    the schema oracle's (test_kafka_ubi.py)."""
    from test_kafka_ubi import MAPPING, assert_exact_and_meaningful
    from test_kafka_ubi import produce as produce_ubi
    from ubi_fixture import searches

    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    found = searches(33, 600, gap_ms=2_000, scroll_ms=60_000)
    produce_ubi(kafka_tools, unique, found, 33)
    first = instances("a", extra=MAPPING)
    wait_until(lambda: first.metric("evald_results_produced_total") > 100, 120, "results")
    first.kill()
    dies = instances("a", extra=MAPPING, crash_at="restore")
    wait_until(lambda: dies.proc.poll() is not None, 120, "the kill -9 while restoring")
    assert dies.proc.returncode == -9
    last = instances("a", extra=MAPPING, crash_at="restore_rebuilt:fault")
    wait_until(lambda: last.lag_zero(2), 180, "the last process to restore twice, catch up")
    assert "=restore_rebuilt:fault: failing this session" in last.log_path.read_text(
        errors="replace"
    ), "not the hook"
    wait_until(lambda: last.alone(2), 60, "the last process settled")
    time.sleep(1.0)  # one more commit interval
    assert last.terminate() == 0
    checked = assert_exact_and_meaningful(kafka_tools, unique, found, last)
    print(f"ubi lists through faults while restoring: {checked} lists exactly once")


# -- a rolling restart of two instances -------------------------------------------------------

#: four partitions shared by two instances (a, then b, restarted)
SHARED = (0, 1, 2, 3)
#: the simulator events of the rolling restart: a backlog, a chunk during each restart, one
#: more with both back, and the last one for the process that checks every output
ROLLING = (3000, 5000, 7000, 8500, 10000)
#: the traffic during each restart: 100 events every this many seconds, 6 s of traffic that
#: the stop, the start and both rebalances land in (the revocations commit what was fed)
PACE = 0.3
#: the rolled instances commit every 2 s, not every 0.3: a stop or a revocation then finds
#: work of its own to commit (or to lose, killed) while the traffic flows
APART = ("--set", "daemon.commit_interval_ms=2000")
ROLLED = (*EXTRA, *APART)
#: how each of a and b is stopped: one SIGTERM (the clean stop: its revocation commits, the
#: other takes its partitions at once) and one kill -9 (taken over after the session timeout
#: from the last commit), in both orders
ORDERS = {"a-sigterm-b-kill9": ("sigterm", "kill-9"), "a-kill9-b-sigterm": ("kill-9", "sigterm")}


def sharing(live: dict[str, Instance]) -> bool:
    """Every instance ready and owning partitions, all of ``SHARED`` owned among them."""
    owned = [inst.owned() for inst in live.values()]
    return all(owned) and set().union(*(mine or set() for mine in owned)) == set(SHARED)


def produced(live: dict[str, Instance]) -> float:
    """Results the instances produced (the first to join may have taken everything so far
    before the other's join moved partitions to it)."""
    return sum(inst.metric("evald_results_produced_total") for inst in live.values())


def caught_up(live: dict[str, Instance]) -> bool:
    """Sharing, and every instance with no lag on what it owns."""
    return sharing(live) and all(inst.lag_zero(len(inst.owned() or ())) for inst in live.values())


def assert_each_instance_exact(tools: KafkaTools, unique: str, live: dict[str, Instance]) -> None:
    """The rolled instances themselves, caught up and sharing the partitions: each shows
    the comparison, CUSUM and interleaving series of one uninterrupted engine (each reads
    every instance's shares), and the examination curve of that engine's click models of
    the partitions it owns (none of a partition it gave away, each it took restored)."""
    topics = names(unique)

    def uninterrupted() -> Engine:
        return tools.expected(
            config(), topics["impressions"], topics["feedback"], global_statistics=True
        )[1]

    first = uninterrupted()
    want = samples(generate_latest(build_registry(first, process=False)[0]).decode())
    for name, inst in live.items():
        got = lambda inst=inst: samples(inst.get("/metrics")[1])  # noqa: E731
        try:
            wait_until(lambda got=got: equal(got(), want), 60, f"{name}'s series")
        finally:
            show_differences(got(), want)
    for i, (name, inst) in enumerate(live.items()):
        owned = inst.owned() or set()
        engine = first if i == 0 else uninterrupted()  # one per instance: the others dropped
        assert engine.clicks is not None
        for p in set(engine.clicks.models) - owned:
            engine.clicks.drop(p)
        curve = examination_curve(engine)
        assert curve, name
        wait_until(
            lambda inst=inst, curve=curve: exported(inst, "evald_click_examination") == curve,
            60,
            f"{name}'s examination curve, of partitions {sorted(owned)}",
        )


def roll(
    live: dict[str, Instance],
    start: Callable[[str], Instance],
    stops: tuple[str, str],
    during: Callable[[int], None],
) -> None:
    """The rolling restart: ``a``, then ``b`` once ``a`` is back and owns partitions, each
    stopped as ``stops`` says and started again at once, ``during(i)`` (more traffic) running
    on a thread meanwhile; returns once both are back and share the partitions."""
    with ThreadPoolExecutor(1) as pool:
        for i, (name, how) in enumerate(zip(("a", "b"), stops, strict=True)):
            feed = pool.submit(during, i)
            if how == "kill-9":
                live[name].kill()
            else:
                assert live[name].terminate() == 0
            live[name] = start(name)
            feed.result()
            wait_until(lambda: sharing(live), 180, f"{name} back, both owning partitions")


def rolling(
    tools: KafkaTools, unique: str, instances: Callable[..., Instance], stops: tuple[str, str]
) -> tuple[Instance, Engine]:
    """Two instances share four partitions, roll (:func:`roll`, traffic during each
    restart), take more traffic and stop (SIGTERM); then a last process restores every
    partition they left and consumes the last chunk alone. Returns it, caught up, and an
    engine holding the click models it restored."""
    topics = names(unique)
    tools.create({topics["impressions"]: len(SHARED), topics["feedback"]: len(SHARED)})
    produce(tools, topics, 0, ROLLING[0])
    live = {name: instances(name, extra=ROLLED) for name in ("a", "b")}
    wait_until(lambda: sharing(live) and produced(live) > 500, 180, "two sharing, results")
    roll(
        live,
        lambda name: instances(name, extra=ROLLED),
        stops,
        lambda i: produce(tools, topics, ROLLING[i], ROLLING[i + 1], pace=PACE),
    )
    produce(tools, topics, ROLLING[2], ROLLING[3])
    wait_until(lambda: caught_up(live), 180, "both instances caught up")
    assert_each_instance_exact(tools, unique, live)
    for inst in (live["b"], live["a"]):
        assert inst.terminate() == 0
    restored = restored_clicks(tools, unique, SHARED)
    produce(tools, topics, ROLLING[3], ROLLING[4])
    last = instances("a", extra=EXTRA)
    wait_until(lambda: last.alone(len(SHARED)), 180, "the last process alone, caught up")
    return last, restored


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stops", list(ORDERS.values()), ids=list(ORDERS))
def test_a_rolling_restart_of_two_instances_leaves_every_output_exact(
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
    stops: tuple[str, str],
) -> None:
    """Every feature on, four partitions shared by two instances: ``a`` is stopped and
    started again while traffic flows, then ``b`` once ``a`` owns partitions again, one of
    the stops a SIGTERM and the other a kill -9; more traffic, both stop, and a last process
    restores all four partitions and takes the last chunk alone. Every output equals one
    uninterrupted engine's, as after the faults while restoring."""
    last, restored = rolling(kafka_tools, unique, instances, stops)
    assert_every_output_exact(kafka_tools, unique, last, restored)


@pytest.mark.timeout(600)
def test_ubi_lists_through_a_rolling_restart_of_two_instances(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """The UBI mapping through the same rolling restart (a SIGTERM, then b kill -9) while
    the two instances work through the records (all produced first: the lists are assembled
    across records and topics, so chunks cut at a time would reorder them): results exactly
    once and each equal to the schema oracle's."""
    from test_kafka_ubi import MAPPING, assert_exact_and_meaningful
    from test_kafka_ubi import produce as produce_ubi
    from ubi_fixture import searches

    topics = names(unique)
    kafka_tools.create({topics["impressions"]: len(SHARED), topics["feedback"]: len(SHARED)})
    found = searches(34, 1200, gap_ms=2_000, scroll_ms=60_000)
    produce_ubi(kafka_tools, unique, found, 34)
    rolled = (*MAPPING, *APART)
    live = {name: instances(name, extra=rolled) for name in ("a", "b")}
    wait_until(lambda: sharing(live) and produced(live) > 100, 180, "two sharing, results")
    roll(
        live,
        lambda name: instances(name, extra=rolled),
        ORDERS["a-sigterm-b-kill9"],
        lambda i: None,
    )
    wait_until(lambda: caught_up(live), 180, "both instances caught up")
    assert live["b"].terminate() == 0
    wait_until(lambda: live["a"].alone(len(SHARED)), 180, "a alone, caught up")
    assert live["a"].terminate() == 0  # its shutdown commits the rest
    checked = assert_exact_and_meaningful(kafka_tools, unique, found, live["a"])
    print(f"ubi lists through a rolling restart: {checked} lists exactly once")
