"""Per-partition shares of the comparison windows: when a share is final, what it holds, that the
fold counts each (window, partition) once, and that the engine's fold (what `evald replay` runs)
equals the fold of the non-late results whatever the partitioning, batching and tick timing."""

from __future__ import annotations

import json
import zlib
from collections import defaultdict

import numpy as np
import pytest
from test_fold import HOUR, MEASURES, T0, fold_partitioned, lists, settings, states_close

from evald.config import EngineConfig, load_config
from evald.demo.simulator import DEFAULT_START_MS, Faults, Simulator
from evald.engine import Engine, Result
from evald.segments import SegmentIndex
from evald.statistics.bootstrap import DEFAULT_SEED, list_clusters, poisson_weights, user_cluster
from evald.statistics.fold import ComparisonState, fold_window
from evald.statistics.live import LiveStatistics
from evald.statistics.shares import Frozen, PartitionShares, Share, decode_record


def shares_for(config: EngineConfig) -> PartitionShares:
    segments = SegmentIndex(config.label_keys, config.label_value_cap, config.max_segments)
    return PartitionShares(config.statistics.window, config.window, len(MEASURES), segments)


def observe(shares: PartitionShares, p: int, ts: list[int], reasons: list[str], arm: str = "A"):
    seg = shares.segments.segment_of({"arm": arm, "model": "m", "surface": "web"})
    values = np.full((len(ts), len(MEASURES)), 0.5)
    shares.observe(p, np.full(len(ts), seg), np.asarray(ts), values, reasons)


def test_a_share_is_final_when_its_own_partition_passes_the_window_end_by_the_window():
    config = settings()
    shares = shares_for(config)
    attribution = config.window
    observe(shares, 0, [T0 + 10, T0 + HOUR - 1], ["window", "window"])
    observe(shares, 1, [T0 + 20], ["window"])
    # partition 0 is one ms short: the window before is final, this one is not
    frozen = shares.freeze(0, T0 + HOUR + attribution - 2)
    assert frozen == Frozen(0, T0, ())
    assert not shares.due(0, T0 + HOUR + attribution - 2)
    assert shares.freeze(0, T0 + HOUR + attribution - 2) is None  # the mark did not move
    frozen = shares.freeze(0, T0 + HOUR + attribution - 1)
    assert frozen is not None and frozen.final_until == T0 + HOUR
    (share,) = frozen.shares
    assert (share.start, share.partition) == (T0, 0)
    ((labels, sums),) = share.segments
    assert dict(labels)["arm"] == "A"
    assert sums[:, 0].tolist() == [2.0, 2.0]  # partition 1's result is not in it
    # partition 1 is not final because partition 0 is
    frozen1 = shares.freeze(1, T0 + 10)
    assert frozen1 is not None and not frozen1.shares


def test_late_results_are_left_out_and_a_window_handed_out_is_not_reopened():
    config = settings()
    shares = shares_for(config)
    observe(shares, 0, [T0 + 1, T0 + 2, T0 + 3], ["window", "late", "cap"])
    frozen = shares.freeze(0, T0 + HOUR + config.window)
    assert frozen is not None
    assert frozen.shares[0].segments[0][1][:, 0].tolist() == [2.0, 2.0]
    observe(shares, 0, [T0 + 4], ["drain"])  # would reopen [T0, T0 + 1h): dropped
    assert shares.freeze(0, None, final=True) == Frozen(0, 1 << 62, ())


def test_the_fold_waits_for_every_partition_and_folds_in_window_order():
    config = settings(min_n=2, cusum_min_n=2)
    shares = shares_for(config)
    for p in (0, 1):
        for hour in range(3):
            for arm in ("A", "B"):
                observe(shares, p, [T0 + hour * HOUR + i for i in range(5)], ["window"] * 5, arm)
    live = LiveStatistics(config, MEASURES)
    live.add(shares.freeze(0, T0 + 2 * HOUR + config.window))  # two windows final in p0
    assert live.fold([0, 1]) == 0  # partition 1 has no mark yet
    assert live.unmarked([0, 1]) == [1]
    live.add(shares.freeze(1, T0 + HOUR + config.window))  # one window final in p1
    assert live.fold([0, 1]) == 1
    (view,) = live.views()
    assert view.state.windows == 1 and view.last_end_ms == T0 + HOUR
    seq = view.state.sequences[("B", (("surface", "web"),), "nDCG@10")]
    assert (seq.control.n, seq.treatment.n) == (10, 10)  # both partitions' shares
    live.add(shares.freeze(1, None, final=True))
    live.add(shares.freeze(0, None, final=True))
    assert live.fold([0, 1]) == 2
    (view,) = live.views()
    assert view.state.windows == 3 and view.last_end_ms == T0 + 3 * HOUR


def test_a_share_seen_twice_counts_once_and_counting_it_twice_would_show():
    """The topic may hold a share twice (idempotent writes); the fold keeps the first. Negative
    control: the same share counted as another partition's changes the state, and the
    comparison used throughout these tests notices."""
    config = settings(min_n=30, cusum_min_n=30)
    data = lists(np.random.default_rng(3), 6000, 12, drop_from=6)
    reference = fold_partitioned(config, data, 3, seed=1)
    (ref,) = reference.views()

    def replayed(twice: bool) -> LiveStatistics:
        shares = shares_for(config)
        labels, ts, values, _ = data
        part = np.random.default_rng(1).integers(0, 3, len(ts))
        seg = np.asarray([shares.segments.segment_of(lab) for lab in labels])
        for p in range(3):
            sel = part == p
            shares.observe(p, seg[sel], ts[sel], values[sel], ["window"] * int(sel.sum()))
        live = LiveStatistics(config, MEASURES)
        copies = 0
        for p in range(3):
            frozen = shares.freeze(p, None, final=True)
            assert frozen is not None
            live.add(frozen)
            copies += len(frozen.shares)
            for share in frozen.shares:
                # what a reader sees after a retried write: the same record again
                live.add(decode_record(share.encode()))
                if twice and p == 0 and share.start == T0 + 5 * HOUR:
                    live.add(Share(share.start, share.width, 7, share.segments))
        live.add(Frozen(7, 1 << 62))
        live.fold()
        assert live.ignored == copies  # every second copy
        return live

    once = replayed(twice=False)
    (view,) = once.views()
    states_close(ref.state, view.state)
    (doubled,) = replayed(twice=True).views()
    with pytest.raises(AssertionError):
        states_close(ref.state, doubled.state)


def test_the_open_shares_round_trip_through_a_checkpoint():
    """What the daemon stores per partition: a fresh ``PartitionShares`` loaded from it hands
    out the same shares as the one that wrote it."""
    config = settings()
    a = shares_for(config)
    observe(a, 0, [T0 + 1, T0 + HOUR + 5], ["window", "window"])
    a.freeze(0, T0 + config.window)  # a mark, nothing final
    doc = json.loads(json.dumps(a.state(0)))
    b = shares_for(config)
    observe(b, 0, [T0 + 2 * HOUR], ["window"], arm="B")  # b's segment ids differ from a's
    b.load(0, doc, watermark=None)
    observe(b, 0, [T0 + 7], ["window"])
    observe(a, 0, [T0 + 7], ["window"])
    assert b.due(0, T0 + 3 * HOUR) and not b.due(0, T0 + config.window)
    got, want = b.freeze(0, None, final=True), a.freeze(0, None, final=True)
    assert got is not None and want is not None
    assert [(s.start, [(lab, arr.tolist()) for lab, arr in s.segments]) for s in got.shares] == [
        (s.start, [(lab, arr.tolist()) for lab, arr in s.segments]) for s in want.shares
    ]


def test_a_checkpoint_without_statistics_counts_the_windows_final_at_its_watermark_as_done():
    config = settings()
    shares = shares_for(config)
    shares.load(0, None, watermark=T0 + HOUR + config.window)
    observe(shares, 0, [T0 + 5, T0 + HOUR + 5], ["window", "window"])
    frozen = shares.freeze(0, None, final=True)
    assert frozen is not None and [s.start for s in frozen.shares] == [T0 + HOUR]


def test_malformed_statistics_records_are_refused():
    for raw in (b"{", b'{"v": 9}', b'{"v": 1, "kind": "x"}', b'{"v":1,"kind":"share"}'):
        with pytest.raises(ValueError):
            decode_record(raw)


# ------------------------------------------------------------------ the engine (evald replay)

STATISTICS = {
    "window": "5m",
    "min_n": 30,
    "cusum_min_n": 10,
    "comparisons": [
        {
            "name": "demo",
            "label": "arm",
            "control": "control",
            "treatments": ["treatment"],
            "start": 0,
            "arm_scoped_labels": ["model"],
            "min_effect": {"nDCG@10": 0.01},
        }
    ],
}


def traffic() -> list:
    """30 minutes of the demo's traffic with its usual dirt (stragglers, duplicates, lost
    impressions), a regression half-way, and late impressions: a copy of every 40th impression
    under a new request id, delivered three minutes after it was served."""
    half = 15 * 60_000
    sim = Simulator(
        5,
        rate=600,
        speed=60,
        stop_ms=DEFAULT_START_MS + 2 * half,
        regress_at_ms=DEFAULT_START_MS + half,
        faults=Faults(malformed=0.0),
    )
    events = list(sim)
    late = []
    for i, event in enumerate(e for e in events if e.kind == "impression"):
        if i % 40 == 0:
            doc = json.loads(event.value)
            doc["request_id"] += "-late"
            value = json.dumps(doc).encode()
            late.append(
                event._replace(
                    at_ms=event.at_ms + 180_000, value=value, key=doc["request_id"].encode()
                )
            )
    return sorted(events + late, key=lambda e: e.at_ms)


def run_engine(events: list, partitions: int, tick_every: int, order_seed: int | None):
    """Feed ``events`` split by key over ``partitions`` (each partition's order kept; the
    partitions interleaved at random when ``order_seed`` is given), ticking every
    ``tick_every`` events; returns the comparison and the results."""
    # each event confirms its time: the watermark then lags no partition by a block of events,
    # so the same impressions are late however the events are split (what the comparison
    # of partitionings below needs; the rule with blocks is tested in tests/join/test_clock.py)
    config = load_config(window="1m", lateness="30s", statistics=STATISTICS, watermark_quorum=1)
    results: list[Result] = []
    engine = Engine(config, global_statistics=True, on_result=results.append)
    per = defaultdict(list)
    for event in events:
        per[zlib.crc32(event.key) % partitions].append(event)
    if order_seed is None:
        sequence = [(p, e) for p in sorted(per) for e in per[p]]
    else:
        rng = np.random.default_rng(order_seed)
        cursors = dict.fromkeys(per, 0)
        sequence = []
        while cursors:
            p = int(rng.choice(sorted(cursors)))
            sequence.append((p, per[p][cursors[p]]))
            cursors[p] += 1
            if cursors[p] == len(per[p]):
                del cursors[p]
    for i, (p, event) in enumerate(sequence):
        engine.feed(event.value, partition=p, kind=event.kind)
        if i % tick_every == 0:
            engine.tick()
    engine.drain()
    assert engine.statistics is not None
    (view,) = engine.statistics.views()
    return view, results, config


def result_rows(results: list[Result], names: list[str], replicates: int) -> np.ndarray:
    """Each result's (M, columns) sums, from its own fields: n, y, y², then (with replicates)
    whether it had a user id and its weights times y and times 1, keyed by its cluster (its
    user, else its request id)."""
    y = np.asarray([[r.measures[m] for m in names] for r in results]).reshape(-1, len(names))
    finite, clean = np.isfinite(y), np.nan_to_num(y)
    columns = [finite, clean, clean**2]
    if not replicates:
        return np.stack(columns, axis=-1)
    users = np.asarray([r.cluster for r in results], dtype=np.uint64)
    keys = list_clusters(users, [r.request_id for r in results])
    w = poisson_weights(keys, replicates, DEFAULT_SEED).astype(np.float64)[:, None, :]
    user = finite & (users != 0)[:, None]
    return np.concatenate(
        [np.stack([*columns, user], axis=-1), clean[..., None] * w, finite[..., None] * w],
        axis=2,
    )


def fold_of_results(results: list[Result], config: EngineConfig) -> ComparisonState:
    """The oracle: every non-late result summed per window and labels, folded in order."""
    width = config.statistics.window
    names = list(config.measures)
    kept = [r for r in results if r.reason != "late"]
    rows = result_rows(kept, names, config.statistics.bootstrap_replicates)
    windows: dict[int, dict[tuple, np.ndarray]] = defaultdict(dict)
    for r, row in zip(kept, rows, strict=True):
        labels = tuple(sorted(r.labels.items()))
        table = windows[r.ts // width * width]
        table[labels] = table.get(labels, 0) + row
    (comp,) = config.statistics.comparisons
    state = ComparisonState()
    for start in sorted(windows):
        segs = [(dict(lab), arr) for lab, arr in sorted(windows[start].items())]
        state = fold_window(state, comp, config.statistics, names, segs)
    return state


def test_the_engine_fold_equals_the_fold_of_the_non_late_results_whatever_the_partitioning():
    events = traffic()
    one, results, config = run_engine(events, 1, 500, None)
    assert one.state.windows >= 5 and one.state.sequences
    assert sum(r.reason == "late" for r in results) > 50  # left out of every fold below
    states_close(fold_of_results(results, config), one.state)
    for partitions, tick_every, seed in [(3, 97, 2), (3, 1000, 4), (5, 1, 9)]:
        view, results_p, _ = run_engine(events, partitions, tick_every, seed)
        states_close(fold_of_results(results_p, config), view.state)
        states_close(one.state, view.state)


@pytest.mark.parametrize(("replicates", "surfaces"), [(0, 2250), (100, 100)])
def test_a_share_of_many_segments_is_cut_into_records_that_add_up(replicates: int, surfaces: int):
    """Every record stays far below Kafka's default 1 MiB however many segments there are,
    with the replicate sums too; the fold of the chunks equals the fold of the whole window."""
    config = settings(min_n=2, cusum_min_n=2)
    segments = SegmentIndex(("arm", "surface"), 5000, 5000)
    shares = PartitionShares(
        config.statistics.window, config.window, len(MEASURES), segments, replicates
    )
    rng = np.random.default_rng(11)
    labels = [{"arm": a, "surface": f"s{i}"} for i in range(surfaces) for a in ("A", "B")]
    seg = np.asarray([segments.segment_of(lab) for lab in labels] * 3)
    ts = np.full(len(seg), T0 + 5)
    values = rng.random((len(seg), len(MEASURES)))
    weights = users = None
    if replicates:
        keys = rng.integers(1, 2**63, len(seg)).astype(np.uint64)
        weights, users = poisson_weights(keys, replicates, DEFAULT_SEED), np.ones(len(seg), bool)
    shares.observe(0, seg, ts, values, ["window"] * len(seg), weights, users)
    frozen = shares.freeze(0, None, final=True)
    per_record = 12_000 // ((3 if not replicates else 204) * len(MEASURES))
    chunks = -(-2 * surfaces // per_record)
    assert chunks >= 3
    assert frozen is not None and len(frozen.shares) == chunks
    assert [s.chunk for s in frozen.shares] == list(range(chunks))
    assert len({s.key for s in frozen.shares}) == chunks
    assert max(len(s.encode()) for s in frozen.shares) < 300_000
    live = LiveStatistics(config, MEASURES)
    for share in frozen.shares:
        live.add(decode_record(share.encode()))
    live.add(Frozen(0, frozen.final_until))
    assert live.fold([0]) == 1
    whole = [(dict(lab), arr) for s in frozen.shares for lab, arr in s.segments]
    (comp,) = config.statistics.comparisons
    state = fold_window(ComparisonState(), comp, config.statistics, MEASURES, whole)
    (view,) = live.views()
    states_close(state, view.state)
    assert len(view.state.rests) == surfaces


# ------------------------------------------------------------------ records written before

#: a share and a final mark exactly as the release before the user-clustered variance wrote
#: them (version 1: n, Σy, Σy² per measure, no replicate sums)
V1_SHARE = (
    b'{"v":1,"kind":"share","start":1767225600000,"width":3600000,"partition":0,"chunk":0,'
    b'"segments":[[[["model","ranker-1"],["arm","A"],["surface","web"]],'
    b"[[40.0,20.0,12.0],[40.0,16.0,8.0]]],"
    b'[[["model","ranker-2"],["arm","B"],["surface","web"]],'
    b"[[40.0,18.0,10.0],[40.0,14.0,6.0]]]]}"
)
V1_MARK = b'{"v":1,"kind":"final","partition":0,"final":1767229200000}'
#: a partition checkpoint's ``statistics`` field as that release wrote it
V1_STATE = {
    "v": 1,
    "width": HOUR,
    "final": T0,
    "open": [[T0, [[[["model", "m"], ["arm", "A"], ["surface", "web"]], [[3.0, 1.5, 0.75]] * 2]]]],
}


def clustered_shares(config: EngineConfig) -> PartitionShares:
    segments = SegmentIndex(config.label_keys, config.label_value_cap, config.max_segments)
    return PartitionShares(
        config.statistics.window, config.window, len(MEASURES), segments, replicates=100
    )


def observe_users(shares: PartitionShares, p: int, ts: list[int], arm: str = "A") -> None:
    """Results of users u0, u1, ... with their bootstrap weights."""
    seg = shares.segments.segment_of({"arm": arm, "model": "m", "surface": "web"})
    keys = np.asarray([user_cluster(f"u{i % 7}") for i in range(len(ts))], dtype=np.uint64)
    values = np.random.default_rng(len(ts)).random((len(ts), len(MEASURES)))
    weights = poisson_weights(keys, 100, DEFAULT_SEED)
    users = np.ones(len(ts), dtype=bool)
    shares.observe(
        p, np.full(len(ts), seg), np.asarray(ts), values, ["window"] * len(ts), weights, users
    )


def test_records_of_the_release_before_still_decode_and_fold_at_list_level():
    """A statistics topic written by the release before (a restart reads it from the start):
    its shares fold with the list-level variance (their replicates are unknown); in a window
    where another partition's share has replicates, that window folds at list level too."""
    share = decode_record(V1_SHARE)
    assert isinstance(share, Share) and share.segments[0][1].shape == (2, 3)
    mark = decode_record(V1_MARK)
    assert mark == Frozen(0, T0 + HOUR)
    config = settings(min_n=2, cusum_min_n=2)
    new = clustered_shares(config)
    observe_users(new, 1, [T0 + i for i in range(40)], "A")
    observe_users(new, 1, [T0 + i for i in range(40)], "B")
    frozen = new.freeze(1, None, final=True)
    assert frozen is not None
    assert frozen.shares[0].segments[0][1].shape == (2, 4 + 200)  # n, Σy, Σy², users, 2B
    assert decode_record(frozen.shares[0].encode()).segments[0][1].tolist() == (
        frozen.shares[0].segments[0][1].tolist()
    )
    live = LiveStatistics(config, MEASURES)
    live.add(share)
    live.add(mark)
    live.add(frozen)
    assert live.fold([0, 1]) == 1
    (view,) = live.views()
    key = ("B", (("surface", "web"),), "nDCG@10")
    seq = view.state.sequences[key]
    assert (seq.control.n, seq.treatment.n) == (80, 80)  # both partitions' lists
    assert not view.state.bounds[key].clustered and seq.treatment.weighted is None
    # the new partition alone folds clustered
    alone = LiveStatistics(config, MEASURES)
    alone.add(frozen)
    alone.fold([1])
    assert alone.views()[0].state.bounds[key].clustered


def test_a_checkpoint_of_the_release_before_loads_its_open_shares_at_list_level():
    config = settings()
    shares = clustered_shares(config)
    shares.load(0, json.loads(json.dumps(V1_STATE)), watermark=None)
    observe_users(shares, 0, [T0 + 5, T0 + 6], "A")  # the same window, now with replicates
    observe_users(shares, 0, [T0 + HOUR + 5], "A")  # the next window: new records only
    frozen = shares.freeze(0, None, final=True)
    assert frozen is not None
    first, second = frozen.shares
    ((_, sums),) = first.segments
    assert sums.shape == (2, 3) and sums[:, 0].tolist() == [5.0, 5.0]  # 3 loaded + 2 observed
    ((_, sums),) = second.segments
    assert sums.shape == (2, 204)
    assert shares.state(0)["v"] == 2


def test_a_restart_with_another_bootstrap_replicates_folds_on_without_a_crash(caplog):
    """`statistics.bootstrap_replicates` changed between two runs: the statistics topic then
    holds windows summed with B = 100 and later ones with B = 50. The CUSUMs' open runs (and the
    stream's pooled replicate sums) of 100 numbers met 50 and the fold raised ValueError, which
    stops the daemon's statistics; the run goes on at the new B."""
    config = settings(min_n=2, cusum_min_n=2, bootstrap_replicates=50)
    live = LiveStatistics(config, MEASURES)
    segments = SegmentIndex(config.label_keys, config.label_value_cap, config.max_segments)
    rng = np.random.default_rng(5)
    for hour, replicates in enumerate([100] * 3 + [50] * 3):
        shares = PartitionShares(
            config.statistics.window, config.window, len(MEASURES), segments, replicates
        )
        for arm, level in (("A", 0.6), ("B", 0.3)):  # B far below: the CUSUM's run stays open
            seg = segments.segment_of({"arm": arm, "model": "m", "surface": "web"})
            ts = np.asarray([T0 + hour * HOUR + i for i in range(60)])
            keys = np.asarray([user_cluster(f"u{arm}{i % 20}") for i in range(60)], np.uint64)
            values = np.clip(level + 0.1 * rng.standard_normal((60, len(MEASURES))), 0, 1)
            weights = poisson_weights(keys, replicates, DEFAULT_SEED)
            shares.observe(
                0, np.full(60, seg), ts, values, ["window"] * 60, weights, np.ones(60, bool)
            )
        frozen = shares.freeze(0, T0 + (hour + 1) * HOUR + config.window)
        assert frozen is not None
        live.add(frozen)
    assert live.fold([0]) == 6
    (view,) = live.views()
    key = ("B", (("surface", "web"),), "nDCG@10")
    cusum = view.state.vs_control[key]
    assert cusum.windows == 6 and cusum.alarmed
    assert cusum.run_replicates is not None and len(cusum.run_replicates) == 50
    assert view.state.bounds[key].clustered is False  # the sums of two B: list level
    # settings at B = 50: the three windows of B = 100 are named once, with what to do
    messages = [r.getMessage() for r in caplog.records]
    (warning,) = [m for m in messages if "bootstrap_replicates" in m]
    assert "bootstrap_replicates 100, not 50" in warning and "later start" in warning


def test_a_share_of_many_segments_with_long_labels_is_cut_by_their_bytes_too():
    """2000 segments (of two measures) whose labels take 512 characters: cut by the sums
    alone, they made one record of 1.3 MB, over Kafka's default max.message.bytes; cut by the
    labels' bytes too, each record holds at most LABEL_BYTES_PER_RECORD of them, and the
    chunks still add up."""
    config = settings(min_n=2, cusum_min_n=2)
    segments = SegmentIndex(("arm", "surface"), 5000, 5000)
    shares = PartitionShares(config.statistics.window, config.window, len(MEASURES), segments)
    labels = [{"arm": a, "surface": f"{i:04d}" + "s" * 508} for i in range(1000) for a in "AB"]
    seg = np.asarray([segments.segment_of(lab) for lab in labels] * 2)
    values = np.random.default_rng(3).random((len(seg), len(MEASURES)))
    ts = np.full(len(seg), T0 + 5)
    shares.observe(0, seg, ts, values, ["window"] * len(seg), None, None)
    frozen = shares.freeze(0, None, final=True)
    assert frozen is not None
    records = [s.encode() for s in frozen.shares]
    assert max(len(r) for r in records) < 1_048_588 - 4096
    from evald.statistics.shares import LABEL_BYTES_PER_RECORD

    for share in frozen.shares:
        held = sum(
            len(json.dumps([list(p) for p in lab], separators=(",", ":")))
            for lab, _ in share.segments
        )
        assert held <= LABEL_BYTES_PER_RECORD
    assert [s.chunk for s in frozen.shares] == list(range(len(records)))
    assert sum(len(s.segments) for s in frozen.shares) == 2000
