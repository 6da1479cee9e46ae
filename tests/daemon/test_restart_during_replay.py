"""Restarts and rebalances that land while a restored partition is still replaying, over the
in-memory Kafka (fake_kafka.py): the real commit cycle, restore, merge and engine, stopped
at chosen cycles. Every output must come out exactly once: the results, dead letters and
comparison shares read ``read_committed`` with no de-duplication, the window aggregates and the
engine's counters equal one uninterrupted session's.

Before the fix a checkpoint written mid-replay recorded ``consumed = fed_next``, below the
offsets the restored checkpoint had consumed, and the next restore emitted the impressions in
between that had closed before the crash (late ones, and those closed while an older-offset
one was pending) again, dead-lettered their malformed neighbours again and counted them all
again."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pytest
from fake_kafka import Cluster, Session
from replay_traffic import MALFORMED, Records, split, traffic
from settable_clock import SettableClock

from evald.daemon.main.checkpoint import Checkpoint, from_runs
from evald.daemon.main.comparisons import statistics_topic
from evald.daemon.settings import Settings, load_settings
from evald.histograms import Histograms
from evald.statistics.shares import Share, decode_record
from evald.stats import Stats

TOPICS = {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"}
ENGINE = {
    "window": "1m",
    "lateness": "10s",
    "windows": ["1m", "5m"],
    "retention": "2h",
    "min_event_time": 0,
    "max_event_lead": None,
    # a comparison, so that every commit also writes the shares that became final
    "statistics": {
        "window": "1m",
        "comparisons": [
            {"name": "ab", "label": "arm", "control": "a0", "treatments": ["a1"], "start": 0}
        ],
    },
}
GROUP = "g"
PARTITIONS = (0, 1)
#: arrival (record timestamp) of the first record, ms
BASE = 10_000_000


def settings(**engine: object) -> Settings:
    return load_settings(
        environ={},
        flags={
            "topics": TOPICS,
            "daemon": {"group_id": GROUP, "instance_id": "a"},
            "engine": {**ENGINE, **engine},
        },
    )


def write(cluster: Cluster, records: Records) -> Cluster:
    for p, rows in records.items():
        for kind, at, value in rows:
            topic = TOPICS["impressions"] if kind == "impression" else TOPICS["feedback"]
            cluster.append(topic, p, value, timestamp=at, key=b"k")
    return cluster


def run_to_the_end(session: Session, clock: SettableClock) -> None:
    """Cycles until every input record is fed (lone records wait out the merge hold)."""
    for _ in range(12):
        session.cycle()
        clock.now += 3.0
    for part in session.inputs.parts.values():
        assert part.merger.buffered() == 0


def uninterrupted(head: Records, tail: Records) -> tuple[Cluster, Session]:
    """One session that consumes ``head``, then ``tail`` once it is written."""
    cluster, clock = write(Cluster(), head), SettableClock()
    session = Session(cluster, settings(), PARTITIONS, clock)
    run_to_the_end(session, clock)
    session.commit()
    write(cluster, tail)
    run_to_the_end(session, clock)
    session.commit()
    return cluster, session


def results(cluster: Cluster) -> list[tuple[str, dict[str, Any]]]:
    """Every committed result, copies kept."""
    return [
        (doc["request_id"], doc)
        for doc in (json.loads(r.value or b"") for r in cluster.records(TOPICS["results"]))
    ]


def letters(cluster: Cluster) -> Counter[tuple[str, str]]:
    """Committed dead letters by source partition and offset, copies counted."""
    found: Counter[tuple[str, str]] = Counter()
    for record in cluster.records(TOPICS["dlq"]):
        headers = dict(record.headers)
        source = headers["evald-source-partition"], headers["evald-source-offset"]
        found[(source[0].decode(), source[1].decode())] += 1
    return found


def counted(sessions: list[Session]) -> Counter[str]:
    """Every engine counter summed over the sessions (each stopped right after a commit)."""
    total: Counter[str] = Counter()
    for session in sessions:
        stats: Stats = session.engine.stats
        total.update({f"events {k}": v for k, v in stats.events.items()})
        total.update({f"rejected {k}": v for k, v in stats.rejected.items()})
        total.update({f"unattributed {k}": v for k, v in stats.unattributed.items()})
        total.update({f"finalized {k}": v for k, v in stats.finalized.items()})
        total.update({f"skipped {k}": v for k, v in stats.skipped.items()})
        total["abandoned"] += stats.abandoned
    return +total


def assert_histograms_equal(got: Histograms, want: Histograms) -> None:
    order = [got.segments.index(segment) for segment in want.segments]
    assert sorted(got.segments) == sorted(want.segments)
    np.testing.assert_array_equal(got.counts[order], want.counts)
    np.testing.assert_array_equal(got.abandoned[order], want.abandoned)
    np.testing.assert_allclose(got.sums[order], want.sums, rtol=1e-12)
    np.testing.assert_allclose(got.squares[order], want.squares, rtol=1e-12)
    assert got.overflow == want.overflow


def assert_checkpoints_hold(cluster: Cluster, ref: Session) -> None:
    """The last checkpoints' counters, summed, are the uninterrupted session's."""
    held: Counter[str] = Counter()
    for checkpoint in checkpoints(cluster).values():
        held.update(checkpoint.state.counters)
    assert held == Counter(ref.engine.stats.counted())


def windows(session: Session) -> dict[tuple[Any, ...], tuple[int, float, float]]:
    return {
        (row.window, row.start_ms, tuple(sorted(row.labels.items())), row.measure): (
            row.count,
            row.sum,
            row.sum_squares,
        )
        for row in session.engine.window_rows(last_only=False)
    }


def assert_windows_equal(got: dict[Any, Any], want: dict[Any, Any]) -> None:
    assert want and set(got) == set(want)
    for key, (count, total, squares) in want.items():
        assert got[key][0] == count, key
        assert math.isclose(got[key][1], total, rel_tol=1e-9, abs_tol=1e-9), key
        assert math.isclose(got[key][2], squares, rel_tol=1e-9, abs_tol=1e-9), key


def shares(cluster: Cluster) -> dict[bytes, list[dict[Any, np.ndarray]]]:
    """The committed comparison shares by key (one per window, partition and chunk), copies
    kept; the final marks, which move, are left out."""
    found: dict[bytes, list[dict[Any, np.ndarray]]] = defaultdict(list)
    for record in cluster.records(statistics_topic(settings().topics)):
        share = decode_record(record.value or b"")
        if isinstance(share, Share):
            found[record.key or b""].append(dict(share.segments))
    return found


def assert_shares_equal(got: dict[bytes, Any], want: dict[bytes, Any]) -> None:
    assert want and set(got) == set(want)
    for key, (segments,) in want.items():
        (mine,) = got[key]  # each share written once
        assert set(mine) == set(segments), key
        for labels, sums in segments.items():
            np.testing.assert_allclose(mine[labels], sums, rtol=1e-12, err_msg=str(key))


def checkpoints(cluster: Cluster) -> dict[int, Checkpoint]:
    topic = settings().topics.checkpoint_topic
    return {p: cluster.checkpoint(GROUP, topic, p) for p in PARTITIONS}


@pytest.mark.parametrize("interrupt", ["commit", "revoke", "commit then kill -9"])
def test_commits_made_while_replaying_leave_every_output_exactly_once(interrupt: str) -> None:
    """One session consumes what is written and stops; three sessions in a row restore, feed
    a few replayed records of partition 1 and none of partition 0, commit (periodically, on a
    revocation, or just before a kill -9) and stop; more traffic is written and a last session
    consumes it. Each mid-replay checkpoint must hold what the first one held, and the outputs
    must be an uninterrupted session's."""
    records = {p: traffic(seed=3, partition=p, n=450, base=BASE) for p in PARTITIONS}
    head, tail = split(records, 2 / 3)
    ref_cluster, ref = uninterrupted(head, tail)
    cluster, clock = write(Cluster(), head), SettableClock()
    first = Session(cluster, settings(), PARTITIONS, clock)
    run_to_the_end(first, clock)
    first.commit()
    before = checkpoints(cluster)
    # the test is effective only if the replay holds what a wrong restore would repeat
    for p, checkpoint in before.items():
        start, end = checkpoint.committed["impression"], checkpoint.consumed["impression"]
        assert end - start > 100, p  # a long replay: older impressions still pending
        replayed = [r.value for r in cluster.records(TOPICS["impressions"]) if r.partition == p][
            start:end
        ]
        assert MALFORMED in replayed, p  # a malformed one to re-read
    assert any(doc["request_id"] for _, doc in results(cluster))
    sessions = [first]
    for _ in range(3):
        session = Session(cluster, settings(), PARTITIONS, clock)
        sessions.append(session)
        session.cycle()  # restores both partitions
        clock.now += 3.0
        session.cycle(limit=7, partitions=[1])  # partition 0's replay is not even fetched
        parts = session.inputs.parts
        assert parts[1].fed_next["impression"] > before[1].committed["impression"]
        for part in parts.values():  # neither has fed all of its replay
            assert part.fed_next["impression"] < part.replay_end["impression"]
        if interrupt == "revoke":
            session.revoke()
        else:
            session.commit()  # after a kill -9 right after it, nothing more is committed
        during = checkpoints(cluster)
        for p in PARTITIONS:
            assert during[p].consumed == before[p].consumed, p
            assert during[p].watermark == before[p].watermark, p
            assert during[p].event_times == before[p].event_times, p
            assert during[p].results == before[p].results, p
            assert during[p].evicted == before[p].evicted, p
            assert during[p].held_feedback == before[p].held_feedback, p
            assert during[p].statistics == before[p].statistics, p
    write(cluster, tail)  # closes the impressions pending at the first checkpoint
    last = Session(cluster, settings(), PARTITIONS, clock)
    sessions.append(last)
    run_to_the_end(last, clock)
    last.commit()
    got, want = results(cluster), dict(results(ref_cluster))
    assert len(got) == len(want) and dict(got) == want  # every result once, each equal
    assert letters(cluster) == letters(ref_cluster)
    assert set(letters(ref_cluster).values()) == {1}
    assert counted(sessions) == counted([ref])
    assert_checkpoints_hold(cluster, ref)
    assert_windows_equal(windows(last), windows(ref))
    assert_shares_equal(shares(cluster), shares(ref_cluster))


def test_a_record_sorting_before_the_replay_waits_until_the_replay_is_fed() -> None:
    """Before the crash impressions i0 (ts 0) and i1 (ts 50 s) were fed and checkpointed as
    pending; then a click written late, with a record timestamp of 40 s and an event time of
    200 s, closed both. The restart replays i0 and i1: the click sorts between them by record
    timestamp, and fed there it moved the watermark past i1 before i1 was rebuilt, so i1 was
    skipped as emitted and its result lost. Records after a replay now wait for all of it, as
    they were fed after all of it before the crash. (Every event confirms its time here, as
    the rule of the watermark did then: three events never fill a block of the default.)"""

    def imp(rid: str, ts: int) -> bytes:
        return json.dumps({"request_id": rid, "ts": ts, "items": ["x"]}).encode()

    click = json.dumps({"request_id": "other", "ts": 200_000, "item": "x", "action": "click"})
    outcomes = []
    for restart in (False, True):
        cluster, clock = Cluster(), SettableClock()
        cluster.append("imp", 0, imp("i0", 0), timestamp=0)
        cluster.append("imp", 0, imp("i1", 50_000), timestamp=50_000)
        session = Session(cluster, settings(watermark_quorum=1), [0], clock)
        for _ in range(3):
            session.cycle()
            clock.now += 3.0
        session.commit()
        assert not results(cluster)  # both pending at the checkpoint
        cluster.append("fb", 0, click.encode(), timestamp=40_000)
        if restart:
            session = Session(cluster, settings(watermark_quorum=1), [0], clock)
        for _ in range(4):
            session.cycle()
            clock.now += 3.0
        session.commit()
        outcomes.append(sorted(rid for rid, _ in results(cluster)))
    assert outcomes[0] == ["i0", "i1"]
    assert outcomes[1] == outcomes[0]


def test_repeats_and_feedback_held_at_the_checkpoint_are_decided_once_across_restarts() -> None:
    """Traffic with repeated impressions (ignored while the first is pending, later in event
    time) and clicks for request ids never served (held until they expire). One session
    consumes what is written and stops; a second restores, commits in mid-replay and stops; a
    last one consumes the rest. Before, the replay took a repeat whose first had been emitted
    for a new impression (a second result), and the held clicks expired uncounted."""
    records = {
        p: traffic(seed=9, partition=p, n=450, base=BASE, repeats=0.1, orphans=0.1)
        for p in PARTITIONS
    }
    head, tail = split(records, 2 / 3)
    ref_cluster, ref = uninterrupted(head, tail)
    assert ref.engine.stats.events[("impression", "duplicate")] > 0
    assert ref.engine.stats.unattributed["orphaned"] > 0
    cluster, clock = write(Cluster(), head), SettableClock()
    first = Session(cluster, settings(), PARTITIONS, clock)
    run_to_the_end(first, clock)
    first.commit()
    before = checkpoints(cluster)
    emitted = {rid for rid, _ in results(cluster)}
    for p, checkpoint in before.items():  # what a wrong restore would decide again
        assert checkpoint.held_feedback, p
        values = [r.value for r in cluster.records(TOPICS["impressions"]) if r.partition == p]
        repeats = {
            json.loads(values[o] or b"")["request_id"] for o in from_runs(checkpoint.evicted)
        }
        assert repeats & emitted, p  # repeats inside the replay of impressions emitted
    sessions = [first, Session(cluster, settings(), PARTITIONS, clock)]
    sessions[1].cycle()  # restores both partitions
    clock.now += 3.0
    sessions[1].cycle(limit=7, partitions=[1])
    sessions[1].commit()
    during = checkpoints(cluster)
    for p in PARTITIONS:
        assert during[p].held_feedback == before[p].held_feedback, p
        assert during[p].evicted == before[p].evicted, p
    write(cluster, tail)
    last = Session(cluster, settings(), PARTITIONS, clock)
    sessions.append(last)
    run_to_the_end(last, clock)
    last.commit()
    # a repeat of a late impression (closed at once) is a result of its own, in both
    got, want = results(cluster), results(ref_cluster)
    assert sorted(json.dumps(doc) for _, doc in got) == sorted(json.dumps(doc) for _, doc in want)
    assert letters(cluster) == letters(ref_cluster)
    assert counted(sessions) == counted([ref])
    assert_checkpoints_hold(cluster, ref)
    assert_windows_equal(windows(last), windows(ref))


def test_past_the_runs_a_checkpoint_lists_held_feedback_is_undercounted_never_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A checkpoint lists at most ``MAX_HELD_RUNS`` runs of held feedback (its record stays
    small); a restore leaves the outcome of the feedback held past them uncounted."""
    monkeypatch.setattr("evald.engine.MAX_HELD_RUNS", 2)
    records = {p: traffic(seed=9, partition=p, n=300, base=BASE, orphans=0.1) for p in PARTITIONS}
    head, tail = split(records, 2 / 3)
    ref_cluster, ref = uninterrupted(head, tail)
    cluster, clock = write(Cluster(), head), SettableClock()
    first = Session(cluster, settings(), PARTITIONS, clock)
    run_to_the_end(first, clock)
    first.commit()
    assert all(len(c.held_feedback) == 2 for c in checkpoints(cluster).values())
    write(cluster, tail)
    last = Session(cluster, settings(), PARTITIONS, clock)
    run_to_the_end(last, clock)
    last.commit()
    got, want = counted([first, last]), counted([ref])
    short = want["unattributed orphaned"] - got["unattributed orphaned"]
    assert short > 0 and got + Counter({"unattributed orphaned": short}) == want
    assert sorted(map(str, results(cluster))) == sorted(map(str, results(ref_cluster)))


def test_kill_9s_after_uncommitted_work_leave_the_committed_counters_exact() -> None:
    """Three lives each commit, feed on without committing and die (kill -9); a last one
    consumes the rest. What the engines counted, summed over the lives, counts the work after
    each last commit twice (the next life feeds it again); the counters the checkpoints carry
    and the counters and measure histograms each life showed on ``/metrics`` (what its commits
    held) equal one uninterrupted session's."""
    records = {
        p: traffic(seed=5, partition=p, n=450, base=BASE, repeats=0.05, orphans=0.05)
        for p in PARTITIONS
    }
    head, tail = split(records, 2 / 3)
    _, ref = uninterrupted(head, tail)
    cluster, clock = write(Cluster(), head), SettableClock()
    sessions = []
    for life in range(3):
        session = Session(cluster, settings(), PARTITIONS, clock)
        sessions.append(session)
        for _ in range(2 + life):
            session.cycle(limit=60)
            clock.now += 3.0
        session.commit()
        for _ in range(2):  # fed, counted and never committed: the kill -9 comes here
            assert session.cycle(limit=60) > 0
            clock.now += 3.0
    write(cluster, tail)
    last = Session(cluster, settings(), PARTITIONS, clock)
    sessions.append(last)
    run_to_the_end(last, clock)
    last.commit()
    want: Counter[str] = Counter(ref.engine.stats.counted())
    lived: Counter[str] = Counter()
    shown: Counter[str] = Counter()
    scored = shown_histograms = None
    for session in sessions:
        lived.update(session.engine.stats.counted())
        shown.update(session.stats.committed.counted.counted())
        mine, held = session.engine.scored(), session.stats.committed.histograms
        assert held is not None
        scored = mine if scored is None else scored.plus(mine)
        shown_histograms = held if shown_histograms is None else shown_histograms.plus(held)
    assert lived - want and not want - lived  # the negative control: counted twice, never less
    assert scored is not None and shown_histograms is not None
    assert_histograms_equal(shown_histograms, ref.engine.scored())
    with pytest.raises(AssertionError):  # what the engines scored has the tails twice
        assert_histograms_equal(scored, ref.engine.scored())
    in_checkpoints: Counter[str] = Counter()
    for checkpoint in checkpoints(cluster).values():
        in_checkpoints.update(checkpoint.state.counters)
    assert in_checkpoints == want
    assert shown == want


def test_feedback_expiring_after_the_last_record_is_committed_with_its_count() -> None:
    """After the last record the idle fallback moves the watermark on: it closes the
    impression (a result, so a commit), then, a tick later, expires the held click for a
    request id never served: counted ``orphaned`` with nothing fed or sent. Before, the commit
    cycle saw nothing to commit, and the last checkpoint never held that count (one orphan
    short in every chaos test)."""
    cluster, clock = Cluster(), SettableClock()
    served = {"request_id": "a", "ts": BASE, "items": ["x"]}
    click = {"request_id": "never", "ts": BASE + 30_000, "item": "x", "action": "click"}
    cluster.append("imp", 0, json.dumps(served).encode(), timestamp=BASE)
    cluster.append("fb", 0, json.dumps(click).encode(), timestamp=BASE + 30_000)
    # no comparison: its shares would commit as the watermark crosses their windows
    quiet = settings(watermark_quorum=1, idle_timeout="5s", statistics={"comparisons": []})
    session = Session(cluster, quiet, [0], clock)
    session.engine.clock = clock  # the idle fallback runs on wall time
    topic = settings().topics.checkpoint_topic
    orphans = []
    for _ in range(60):
        session.cycle()
        session.commit()
        clock.now += 3.0
        if results(cluster):  # committed: a checkpoint exists
            counters = cluster.checkpoint(GROUP, topic, 0).state.counters
            orphans.append(counters.get("unattributed/orphaned", 0))
    assert [rid for rid, _ in results(cluster)] == ["a"]
    assert session.engine.stats.unattributed["orphaned"] == 1
    assert orphans[0] == 0 and orphans[-1] == 1  # held when the result committed, then expired
