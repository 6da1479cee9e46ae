"""The interleaving preference test through `evald run`'s commit and restore cycle, over the
in-memory Kafka (fake_kafka.py): every partition's credit shares go to the statistics topic in
the commits that make them final, and the test folded from that topic (as every instance's
statistics reader folds it) must equal an uninterrupted session's, replay's engine on the same
stream, and the plain counts of the stream, through a kill -9 and a rebalance mid-stream."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from typing import Any

import pytest
from fake_kafka import Cluster, Session
from interleaved_stream import CONFIG, INTERLEAVING_WINDOW, WINDOW, events, plain_credit
from settable_clock import SettableClock

from evald.config import load_config
from evald.daemon.main.comparisons import decode_statistics, preference_fold, statistics_topic
from evald.daemon.settings import Settings, load_settings
from evald.engine import Engine
from evald.interleaving.shares import CreditFrozen, CreditShare

TOPICS = {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"}
ENGINE = {**CONFIG, "interleaving": {**CONFIG["interleaving"], "teams": ["A", "B"]}}
PARTITIONS = (0, 1)
GROUP = "g"


def settings() -> Settings:
    return load_settings(
        environ={},
        flags={
            "topics": TOPICS,
            "daemon": {"group_id": GROUP, "instance_id": "a"},
            "engine": ENGINE,
        },
    )


def partition_of(event: dict[str, Any]) -> int:
    return int(event["request_id"][1:]) % len(PARTITIONS)


def rows(stream: list[dict[str, Any]]) -> dict[int, list[tuple[str, bytes, int]]]:
    out: dict[int, list[tuple[str, bytes, int]]] = {p: [] for p in PARTITIONS}
    for event in stream:
        topic = TOPICS["impressions"] if "items" in event else TOPICS["feedback"]
        out[partition_of(event)].append((topic, json.dumps(event).encode(), event["ts"]))
    return out


def write(cluster: Cluster, part: dict[int, list[tuple[str, bytes, int]]]) -> None:
    for p, records in part.items():
        for topic, value, ts in records:
            cluster.append(topic, p, value, timestamp=ts, key=b"k")


def run(session: Session, clock: SettableClock, cycles: int = 12) -> None:
    for _ in range(cycles):
        session.cycle(limit=300)
        clock.now += 3.0


def folded(cluster: Cluster) -> tuple[list[dict[str, Any]], Counter[bytes]]:
    """The test folded from the committed statistics topic as the reader folds it, and how
    often each credit share key was written."""
    live = preference_fold(settings().engine_config())
    keys: Counter[bytes] = Counter()
    for record in cluster.records(statistics_topic(settings().topics)):
        decoded = decode_statistics(record.value or b"")
        assert isinstance(decoded, CreditShare | CreditFrozen)
        live.add(decoded)
        if isinstance(decoded, CreditShare):
            keys[record.key or b""] += 1
    live.fold(PARTITIONS)
    return live.records(["surface"]), keys


def replayed(stream: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replay's engine (it folds its own shares) on the same partitions, not drained: the
    windows final at the same watermarks."""
    engine = Engine(load_config(ENGINE), clock=lambda: 0.0, global_statistics=True)
    for p, records in rows(stream).items():
        assert engine.feed_batch([value for _, value, _ in records], partition=p) == []
    engine.tick()
    return engine.interleaving.records()


def plain_windows(stream: list[dict[str, Any]], until: int) -> dict[tuple[Any, ...], list[int]]:
    """(surface, a, b) -> [lists, lead_a, wins_a, wins_b, ties] over the lists whose
    interleaving window ends at or before ``until``, counted the plain way."""
    credits = plain_credit(stream)
    out: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0] * 5)
    for e in stream:
        if e.get("request_id") not in credits or "items" not in e:
            continue
        if e["ts"] // INTERLEAVING_WINDOW * INTERLEAVING_WINDOW + INTERLEAVING_WINDOW > until:
            continue
        per_team = credits[e["request_id"]]
        for a, b in itertools.combinations(sorted(per_team), 2):
            cell = out[(e["labels"]["surface"], a, b)]
            ca, cb = per_team[a], per_team[b]
            cell[0] += 1
            cell[1] += e["teams"].index(a) < e["teams"].index(b)
            if ca or cb:
                cell[2 if ca > cb else 3 if cb > ca else 4] += 1
    return dict(out)


def final_until(stream: list[dict[str, Any]]) -> int:
    """The last interleaving window final in every partition: watermark = newest event time
    (lateness 0), a window final once it is past its end by the attribution window."""
    marks = []
    for p in PARTITIONS:
        newest = max(e["ts"] for e in stream if partition_of(e) == p)
        marks.append((newest - WINDOW + 1) // INTERLEAVING_WINDOW * INTERLEAVING_WINDOW)
    return min(marks)


def uninterrupted(stream: list[dict[str, Any]]) -> Cluster:
    cluster, clock = Cluster(), SettableClock()
    write(cluster, rows(stream))
    session = Session(cluster, settings(), PARTITIONS, clock)
    run(session, clock, cycles=30)
    session.commit()
    return cluster


STREAM = events(seed=7, n=4000)


@pytest.fixture(scope="module")
def reference() -> tuple[list[dict[str, Any]], Counter[bytes]]:
    """The uninterrupted session's folded test, checked against replay and the plain counts."""
    want, want_keys = folded(uninterrupted(STREAM))
    assert want and all(r["looks"] >= 2 for r in want)
    assert {r["winner"] for r in want} == {"A"}  # the stream's A is the better ranker
    assert set(want_keys.values()) == {1}
    assert replayed(STREAM) == want  # the replay path folds the same state
    plain = plain_windows(STREAM, final_until(STREAM))
    assert {(r["segment"]["surface"], r["team_a"], r["team_b"]) for r in want} == set(plain)
    for r in want:
        a, b = r["team_a"], r["team_b"]
        lists, _lead, wins_a, wins_b, ties = plain[(r["segment"]["surface"], a, b)]
        assert (r["lists"], r["wins"], r["ties"]) == (lists, {a: wins_a, b: wins_b}, ties)
        assert r["preference"] == (wins_a - wins_b) / (wins_a + wins_b + ties)
    return want, want_keys


def test_the_uninterrupted_run_folds_replays_test_and_the_plain_counts(
    reference: tuple[list[dict[str, Any]], Counter[bytes]],
) -> None:
    assert reference[0]


@pytest.mark.parametrize("interrupt", ["kill -9", "revoke"])
def test_a_restart_mid_stream_folds_the_uninterrupted_test(
    interrupt: str, reference: tuple[list[dict[str, Any]], Counter[bytes]]
) -> None:
    """A first session consumes the first half and commits; the second half is written, it
    consumes some and commits in the middle of an interleaving window, then is revoked (the
    revocation commits) or consumes more and is killed -9 (that transaction never commits); a
    new session restores and consumes the rest. Each window's fold needs the lists credited
    before the interruption: they come back from the checkpoint's open credit shares only."""
    want, want_keys = reference
    cluster, clock = Cluster(), SettableClock()
    whole = rows(STREAM)
    head = {p: records[: len(records) // 2] for p, records in whole.items()}
    tail = {p: records[len(records) // 2 :] for p, records in whole.items()}
    write(cluster, head)
    first = Session(cluster, settings(), PARTITIONS, clock)
    run(first, clock)
    first.commit()
    assert folded(cluster)[0]  # some window is folded before the interruption
    write(cluster, tail)
    run(first, clock, cycles=1)
    first.commit()  # mid-window: its lists so far are in the checkpoint's open shares
    opened = cluster.checkpoint(GROUP, settings().topics.checkpoint_topic, 0).statistics
    assert opened is not None and opened["interleaving"]["open"]
    if interrupt == "revoke":
        first.revoke()  # a rebalance: the next owner restores the revocation's checkpoint
    else:
        run(first, clock, cycles=1)  # more lists credited, never committed
    # kill -9: the session is dropped with its transaction open; the next one fences it
    last = Session(cluster, settings(), PARTITIONS, clock)
    run(last, clock, cycles=30)
    last.commit()
    got, keys = folded(cluster)
    assert got == want
    assert keys == want_keys  # every credit share written by exactly one committed commit
