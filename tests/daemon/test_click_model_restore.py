"""The click model of ``evald run`` through kills -9, over the in-memory Kafka (fake_kafka.py):
the real commit cycle, restore and engine.

Each partition's model is part of its checkpointed state (``PartitionState.click_model``): a
restore loads it, and the lists re-fed after the checkpoint are the ones an uninterrupted run
scored after it. So after several lives, each killed -9 after a commit, every partition's model
must be the uninterrupted session's byte for byte (statistics, pairs kept, refit schedule,
parameters) and the exported examination curve equal to the last digit.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from fake_kafka import Cluster, Session
from replay_traffic import traffic
from settable_clock import SettableClock
from test_restart_during_replay import BASE, PARTITIONS, checkpoints, run_to_the_end, settings
from test_restart_during_replay import write as write_records
from test_restore_retention import chunks

from evald.clicks import stream
from evald.daemon.main import snapshots

#: a cap below the 30 items of the traffic (pairs are evicted), refits every 100 lists
CLICKS = {"click_model": {"model": "pbm", "max_pairs": 16, "refit_every": 100, "half_life": "2m"}}
LIVES = 4


def models(session: Session) -> dict[int, bytes]:
    clicks = session.engine.clicks
    assert clicks is not None
    return {p: model.snapshot() for p, model in sorted(clicks.models.items())}


def click_records(cluster: Cluster, p: int) -> int:
    """Committed records of partition p's click-model snapshots on the checkpoint topic."""
    topic = settings().topics.checkpoint_topic
    key = f"{p}.click_model".encode()
    return sum(r.key == key for r in cluster.records(topic) if r.partition == p)


@pytest.mark.parametrize("cadence", ["every commit", "logged"])
@pytest.mark.parametrize("placed", ["inline", "records"])
def test_the_click_model_after_kills_is_the_uninterrupted_one(
    placed: str, cadence: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four lives, each consuming two chunks of the traffic, committing after each and
    killed -9; the uninterrupted session consumes the same chunks. ``records``: every model
    leaves the checkpoint record for records of its own (the path a large model takes).
    ``logged``:
    the models are snapshotted once per life (a restore's first commit) and the second
    commit logs the lists observed since, which the next life observes again."""
    if placed == "records":
        monkeypatch.setattr(snapshots, "INLINE_STATISTICS_BYTES", 0)
    monkeypatch.setattr(stream, "LOG_SHARE", 0.0 if cadence == "every commit" else 1e9)
    traffics = {p: traffic(seed=5, partition=p, n=600, base=BASE) for p in PARTITIONS}
    config = settings(**CLICKS)
    ref_cluster, ref_clock = Cluster(), SettableClock()
    ref = Session(ref_cluster, config, PARTITIONS, ref_clock)
    cluster, clock = Cluster(), SettableClock()
    halves = chunks(traffics, 2 * LIVES)
    for life in range(LIVES):
        last = Session(cluster, config, PARTITIONS, clock)  # the one before: killed -9
        for chunk in halves[2 * life : 2 * life + 2]:  # two commits a life
            write_records(ref_cluster, chunk)
            run_to_the_end(ref, ref_clock)
            ref.commit()
            write_records(cluster, chunk)
            run_to_the_end(last, clock)
            last.commit()

    for p, checkpoint in checkpoints(cluster).items():
        held = checkpoint.state.click_model
        assert held is not None and ("records" in held) == (placed == "records"), p
        assert ("log" in held) == (cadence == "logged"), p
        assert "click_model" in json.loads(checkpoint.encode()), p
        if placed == "records":  # a snapshot named again is not written again
            snapshotted = click_records(cluster, p)
            assert (snapshotted <= LIVES) == (cadence == "logged"), (p, snapshotted)
    want, got = models(ref), models(last)
    assert set(want) == set(PARTITIONS)
    ref_clicks, clicks = ref.engine.clicks, last.engine.clicks
    assert ref_clicks is not None and clicks is not None
    for p in PARTITIONS:  # the test means something: refits, evictions, decay
        model = ref_clicks.models[p]
        assert model.fits >= 3 and model.pairs.size > 16 and model.horizon.ref is not None
        assert got[p] == want[p], p
    assert ref_clicks.segments and clicks.segments == ref_clicks.segments
    assert np.array_equal(clicks.curve, ref_clicks.curve, equal_nan=True)
    assert np.array_equal(clicks.shown, ref_clicks.shown)
    assert ref_clicks.shown.sum() > 0
    assert clicks.ips_rows() == ref_clicks.ips_rows()  # the IPS sums, to the last bit
    assert all(row[1] > 0 for row in ref_clicks.ips_rows())
    assert clicks.debiased.rows() == ref_clicks.debiased.rows()  # the debiased sums, too
    assert ref_clicks.debiased.rows() and all(row[4] > 0 for row in ref_clicks.debiased.rows())
    assert np.nanmin(ref_clicks.curve) > 0 and np.nanmax(ref_clicks.curve) <= 1
