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


def fold_of_results(results: list[Result], config: EngineConfig) -> ComparisonState:
    """The oracle: every non-late result summed per window and labels, folded in order."""
    width = config.statistics.window
    names = list(config.measures)
    windows: dict[int, dict[tuple, np.ndarray]] = defaultdict(dict)
    for r in results:
        if r.reason == "late":
            continue
        y = np.asarray([r.measures[m] for m in names])
        row = np.stack([np.isfinite(y), np.nan_to_num(y), np.nan_to_num(y) ** 2], axis=-1)
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


def test_a_share_of_many_segments_is_cut_into_records_that_add_up():
    """Every record stays far below Kafka's default 1 MiB however many segments there are;
    the fold of the chunks equals the fold of the whole window."""
    config = settings(min_n=2, cusum_min_n=2)
    segments = SegmentIndex(("arm", "surface"), 5000, 5000)
    shares = PartitionShares(config.statistics.window, config.window, len(MEASURES), segments)
    rng = np.random.default_rng(11)
    labels = [{"arm": a, "surface": f"s{i}"} for i in range(2250) for a in ("A", "B")]
    seg = np.asarray([segments.segment_of(lab) for lab in labels] * 3)
    ts = np.full(len(seg), T0 + 5)
    values = rng.random((len(seg), len(MEASURES)))
    shares.observe(0, seg, ts, values, ["window"] * len(seg))
    frozen = shares.freeze(0, None, final=True)
    assert frozen is not None and len(frozen.shares) == 3
    assert [s.chunk for s in frozen.shares] == [0, 1, 2]
    assert len({s.key for s in frozen.shares}) == 3
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
    assert len(view.state.rests) == 2250
