"""Restarts that land while a restored partition is still replaying, through `evald run` on
Apache Kafka: every output exactly once.

A restore seeks both inputs back to the committed offsets and replays the records up to the
checkpoint's consumed offsets to rebuild the pending joins. A commit made before that replay is
all fed (the periodic one, a revocation, the shutdown) once recorded ``consumed`` as far as the
replay had got, and the next restore took the rest of the replay for new records: results,
dead letters and counts of records fed before the first checkpoint came out again.

In ``make test``: a SIGTERM and a kill -9 right after a commit made mid-replay (test-only crash
point ``replay_committed``). In the chaos tier (``make test-chaos``): rolling restarts of two
instances, SIGTERM and kill -9, quick enough that restarts and rebalances land during replays,
on traffic with 1% late impressions and malformed records. The oracle: results
``read_committed`` with no de-duplication equal to one uninterrupted engine, the window
aggregates equal, one dead letter per refused record, and (SIGTERM: every process's counts are
logged when it stops) the engine's counters summed over every session equal the uninterrupted
engine's.
"""

from __future__ import annotations

import ast
import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable

import pytest
from kafka_harness import KafkaTools, wait_until
from kafka_instances import Instance, make_settings, names
from kafka_oracle import assert_dead_letters_once, assert_matches_an_uninterrupted_run
from replay_traffic import MALFORMED, split, traffic
from test_kafka import committed_checkpoint
from test_kafka_chaos import Stream, covered

pytestmark = pytest.mark.kafka

PARTITIONS = (0, 1)
#: small polls, and a commit after every cycle that fed a record: the first cycle that feeds
#: part of a restore's replay commits with the rest still to feed
SLOW = ("--set", "daemon.max_poll_records=20", "--set", "daemon.commit_max_records=1")


def test_sigterm_and_kill_9_right_after_a_commit_made_mid_replay_are_exact(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """A first run consumes everything and stops; the next one stops with SIGTERM right after
    a commit made while its partitions replay, the one after it is killed -9 at the same
    point; then more traffic and a last run. Both mid-replay checkpoints must keep the first
    one's consumed offsets, and the outputs must be exact."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    base = int(time.time() * 1000) - 30 * 60_000
    records = {p: traffic(seed=7, partition=p, n=900, base=base) for p in PARTITIONS}
    head, tail = split(records, 2 / 3)
    kafka_tools.produce_rows(topics["impressions"], topics["feedback"], head)
    first = instances("a")
    wait_until(lambda: first.lag_zero(2), 120, "the first run to consume everything")
    time.sleep(1.0)  # a commit interval
    assert first.terminate() == 0
    before = {p: committed_checkpoint(kafka_tools, unique, p) for p in PARTITIONS}
    impressions = kafka_tools.read(topics["impressions"])
    for p, checkpoint in before.items():  # what a wrong restore would repeat is in the replay
        start, end = checkpoint.committed["impression"], checkpoint.consumed["impression"]
        assert end - start > 100, p
        replayed = [r.value for r in impressions if r.partition == p and start <= r.offset < end]
        assert MALFORMED in replayed, p
    for step in ("replay_committed:term", "replay_committed"):
        inst = instances("a", extra=SLOW, crash_at=step)
        wait_until(lambda inst=inst: inst.proc.poll() is not None, 120, f"the stop at {step}")
        assert inst.proc.returncode == (0 if step.endswith(":term") else -9), step
        assert "=replay_committed" in inst.log_path.read_text(errors="replace"), "not the hook"
        for p in PARTITIONS:
            assert committed_checkpoint(kafka_tools, unique, p).consumed == before[p].consumed
    kafka_tools.produce_rows(topics["impressions"], topics["feedback"], tail)
    last = instances("a")
    wait_until(lambda: last.lag_zero(2), 120, "the last run to catch up")
    time.sleep(1.0)
    assert last.terminate() == 0
    assert_matches_an_uninterrupted_run(kafka_tools, unique, last.windows)
    assert_dead_letters_once(kafka_tools, unique)


# -- the chaos tier: rolling restarts that land during replays --------------------------------

#: the simulator's stream: about 27 requests per second of event time, so a one-minute window
#: holds some 2,000 pending impressions and every restore replays a few thousand records; 1%
#: of the impressions are late (closed as they arrive: what a wrong replay emitted again), and
#: the simulator's faults include malformed records
SIM = {"rate": 2000, "speed": 20, "late": 0.01}
BACKLOG, CHUNK = 30_000, 100
ROUNDS, SEED = 3, 20261127

RESTORED = re.compile(r"restored: .*replay from (\{[^}]*\}) to (\{[^}]*\})")
COUNTED = re.compile(r"session \d+ ended; its engine counted (\{.*\})$")


def replays(logs: list[Instance]) -> tuple[int, int]:
    """(restores that had records to replay, replays fed to their end) in the instances' logs:
    the difference were cut short by a stop or a rebalance."""
    started = finished = 0
    for path in {inst.log_path for inst in logs}:  # the processes of a name share a log
        for line in path.read_text(errors="replace").splitlines():
            found = RESTORED.search(line)
            if found and ast.literal_eval(found[1]) != ast.literal_eval(found[2]):
                started += 1
            finished += "replay fed up to" in line
    return started, finished


def counted_by_every_session(logs: list[Instance]) -> Counter[str]:
    """The engine counters every session logged when it ended, summed."""
    total: Counter[str] = Counter()
    for path in {inst.log_path for inst in logs}:  # the processes of a name share a log
        for line in path.read_text(errors="replace").splitlines():
            found = COUNTED.search(line)
            if found:
                total.update(json.loads(found[1]))
    return total


def assert_counted_once(tools: KafkaTools, unique: str, got: Counter[str]) -> None:
    """Every counter summed over the sessions equals the uninterrupted engine's."""
    topics = names(unique)
    config = make_settings(tools.bootstrap, unique).engine_config()
    _, reference = tools.expected(config, topics["impressions"], topics["feedback"])
    want = Counter(reference.stats.counted())
    assert +got == +want


ASSIGNED = re.compile(rb"partitions \[\d[^\]]*\] assigned")


def assigned_since(inst: Instance, since: int) -> bool:
    """Whether the instance logged an assignment of partitions past byte ``since`` of its log
    (where its process began): it is restoring them, or replaying."""
    inst.log.flush()
    with inst.log_path.open("rb") as log:
        log.seek(since)
        return ASSIGNED.search(log.read()) is not None


def replaying_since(inst: Instance, since: int) -> bool:
    """Whether the instance logged, past byte ``since`` of its log, a restore with records to
    replay and not yet the end of every replay it started."""
    inst.log.flush()
    with inst.log_path.open("rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    started = sum(
        1
        for found in RESTORED.finditer(text)
        if ast.literal_eval(found[1]) != ast.literal_eval(found[2])
    )
    return started > text.count("replay fed up to")


def rolling_restarts(
    tools: KafkaTools, unique: str, start: Callable[..., Instance], stop: str
) -> tuple[list[Instance], Instance]:
    """Two instances share four partitions while traffic streams in; ``ROUNDS`` times each in
    turn is stopped (``stop``: "terminate" or "kill") as soon as it replays, or 0-1 s after
    partitions were assigned to it if no replay shows by then, and started again at once: the
    stop lands while it replays, and the rebalances its leaving and joining cause land while
    the other one replays. Then the stream ends, b stops and a
    takes everything and is stopped. Returns every process and the last one (its windows
    file has every partition)."""
    rng = random.Random(SEED)
    topics = names(unique)
    partitions = {0, 1, 2, 3}
    tools.create({topics["impressions"]: 4, topics["feedback"]: 4})
    tools.produce_sim(topics["impressions"], topics["feedback"], events=BACKLOG, seed=SEED, **SIM)
    live = {name: start(name) for name in ("a", "b")}
    every = list(live.values())
    began = dict.fromkeys(live, 0)  # where each name's current process begins in its log
    wait_until(lambda: covered(list(live.values()), partitions), 240, "two members sharing")
    stream = Stream(tools, topics, seed=SEED, chunk=CHUNK, start=BACKLOG, **SIM)
    landed = 0  # stops sent while the log showed a replay under way
    for _ in range(ROUNDS):
        for name in ("a", "b"):
            inst, since = live[name], began[name]
            wait_until(
                lambda i=inst, n=since: assigned_since(i, n), 240, f"{name} to get partitions"
            )
            # into its replay once one is under way (a replay can end within a fixed 0-1 s:
            # in one run of the tier no stop landed in a replay at all)
            deadline = time.monotonic() + rng.uniform(0.0, 1.0)
            while time.monotonic() < deadline and not replaying_since(inst, since):
                time.sleep(0.02)
            landed += replaying_since(inst, since)
            if stop == "kill":
                inst.kill()
            else:
                assert inst.terminate() == 0
            began[name] = inst.log_path.stat().st_size
            live[name] = start(name)
            every.append(live[name])
    sent = stream.stop()
    wait_until(lambda: covered(list(live.values()), partitions), 240, "both members back")
    assert live["b"].terminate() == 0
    wait_until(lambda: live["a"].alone(4), 300, "one instance owning everything, caught up")
    assert live["a"].terminate() == 0
    started, finished = replays(every)
    # or directly: a stop sent while the log showed a replay under way landed in it
    effective = started > finished or landed > 0
    assert effective, "no stop or rebalance landed during a replay: not effective"
    print(
        f"{2 * ROUNDS} rolling {stop}s over {sent} events: {started} restores with a replay, "
        f"{started - finished} of them cut short by a stop or a rebalance, {landed} stops "
        "sent while one was under way"
    )
    return every, live["a"]


@pytest.mark.chaos
@pytest.mark.timeout(1500)  # process starts take 25 s on a busy two-core machine
def test_rolling_sigterm_restarts_of_two_instances_during_replays_are_exact(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """Every stop is clean (SIGTERM: the shutdown commit, leaving the group, which makes the
    other instance revoke and commit too), so every session's counts are logged and their
    sum must equal the uninterrupted engine's counters."""
    every, last = rolling_restarts(kafka_tools, unique, instances, "terminate")
    assert_matches_an_uninterrupted_run(kafka_tools, unique, last.windows)
    assert_dead_letters_once(kafka_tools, unique)
    assert_counted_once(kafka_tools, unique, counted_by_every_session(every))


@pytest.mark.chaos
@pytest.mark.timeout(1500)  # process starts take 25 s on a busy two-core machine
def test_rolling_kill_9s_of_two_instances_during_replays_are_exact(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """kill -9 instead: the other instance takes the partitions over after the session
    timeout and gives them back when the killed one has rejoined. The killed processes' counts
    cannot be read (counters are process state; what a kill loses since the last commit is
    counted again by whoever redoes it), so counters are the SIGTERM test's."""
    _, last = rolling_restarts(kafka_tools, unique, instances, "kill")
    assert_matches_an_uninterrupted_run(kafka_tools, unique, last.windows)
    assert_dead_letters_once(kafka_tools, unique)
