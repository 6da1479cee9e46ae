"""A restore rebuilds the oldest window it still keeps whole, over the in-memory Kafka
(fake_kafka.py): the real commit cycle, restore and engine.

The aggregates drop a window once it ends past the retention; the commit's result ranges
are pruned by their newest result's time. Both must reach back to the start of the oldest
window kept: when the first buckets of that window were pruned while its bootstrap sums
were kept whole, and the ranges that held its first results were dropped, a restarted
process reported that window with another clustered interval than the uninterrupted one
(the twenty-kill chaos test saw 0.0845 for 0.0783).
"""

from __future__ import annotations

import math
from typing import Any

from fake_kafka import Cluster, Session
from replay_traffic import Records, traffic
from settable_clock import SettableClock
from test_restart_during_replay import (
    BASE,
    PARTITIONS,
    checkpoints,
    run_to_the_end,
    settings,
    write,
)

#: a short retention, so that a few minutes of traffic prune windows at every commit
RETENTION = {"retention": "5m", "windows": ["1m", "5m"]}
LIVES = 6


def chunks(records: Records, n: int) -> list[Records]:
    """The records in ``n`` consecutive chunks of each partition's."""
    return [
        {p: rows[len(rows) * k // n : len(rows) * (k + 1) // n] for p, rows in records.items()}
        for k in range(n)
    ]


def rows(session: Session) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {
        (r.window, r.start_ms, tuple(sorted(r.labels.items())), r.measure): r.to_json()
        for r in session.engine.window_rows(last_only=False)
    }


def test_restarts_report_the_oldest_window_kept_as_an_uninterrupted_process_does() -> None:
    """Six lives, each consuming a chunk of the traffic, committing and killed -9: each
    restore starts a result range of its own, and the first lives' ranges are pruned as the
    retention passes them. The uninterrupted session consumes the same chunks."""
    traffics = {p: traffic(seed=9, partition=p, n=1200, base=BASE) for p in PARTITIONS}
    config = settings(**RETENTION)
    ref_cluster, ref_clock = Cluster(), SettableClock()
    ref = Session(ref_cluster, config, PARTITIONS, ref_clock)
    cluster, clock = Cluster(), SettableClock()
    for chunk in chunks(traffics, LIVES):
        write(ref_cluster, chunk)
        run_to_the_end(ref, ref_clock)
        ref.commit()
        write(cluster, chunk)
        last = Session(cluster, config, PARTITIONS, clock)  # the one before: killed -9
        run_to_the_end(last, clock)
        last.commit()
    ranges = [len(checkpoint.results) for checkpoint in checkpoints(cluster).values()]
    assert min(ranges) < LIVES, ranges  # a partition's first lives' ranges were pruned

    want, got = rows(ref), rows(last)
    assert len({key[1] for key in want}) > 3
    assert set(got) == set(want)
    for key, row in want.items():
        mine = got[key]
        assert mine["count"] == row["count"], key
        assert math.isclose(mine["sum"], row["sum"], rel_tol=1e-9, abs_tol=1e-9), key
        theirs, ours = row["ci95_clustered_halfwidth"], mine["ci95_clustered_halfwidth"]
        assert (theirs is None) == (ours is None), key
        assert ours is None or math.isclose(ours, theirs, rel_tol=1e-9), (key, ours, theirs)
