import math

import numpy as np
import pytest

from evald.aggregate import Aggregates
from evald.segments import SegmentIndex
from evald.stats import mean_ci95

MIN = 60_000


def make() -> tuple[Aggregates, SegmentIndex]:
    segments = SegmentIndex(["arm"], cap=5)
    agg = Aggregates(["m1", "m2"], segments, [0.0, 0.5, 1.0], MIN, [5 * MIN, 60 * MIN], 120 * MIN)
    return agg, segments


def test_histogram_buckets_are_upper_inclusive():
    agg, segments = make()
    seg = segments.segment_of({"arm": "A"})
    values = np.array([[0.0, 0.5], [0.5, 1.0], [0.7, 2.0]])
    agg.observe(0, np.array([seg] * 3), np.array([0, 1, 2]), values)
    assert agg.hist_counts[seg, 0].tolist() == [1, 1, 1, 0]  # 0 | (0,.5] | (.5,1] | +Inf
    assert agg.hist_counts[seg, 1].tolist() == [0, 1, 1, 1]
    assert agg.hist_sum[seg].tolist() == pytest.approx([1.2, 3.5])
    assert agg.hist_count[seg].tolist() == [3, 3]


def test_non_finite_values_are_left_out():
    agg, segments = make()
    seg = segments.segment_of({})
    agg.observe(0, np.array([seg, seg]), np.array([0, 0]), np.array([[np.nan, 1.0], [0.5, 1.0]]))
    assert agg.hist_count[seg].tolist() == [1, 2]
    assert agg.hist_sum[seg].tolist() == [0.5, 2.0]
    (row,) = [r for r in agg.window_rows(5 * MIN) if r.measure == "m1"]
    assert row.count == 1 and row.sum == 0.5


def test_window_sums_merge_partitions_and_buckets():
    agg, segments = make()
    seg = segments.segment_of({"arm": "A"})
    rng = np.random.default_rng(0)
    ts = rng.integers(0, 10 * MIN, size=200)
    vals = rng.random((200, 2))
    parts = rng.integers(0, 3, size=200)
    for p in range(3):
        sel = parts == p
        agg.observe(p, np.full(sel.sum(), seg), ts[sel], vals[sel])
    rows = agg.window_rows(10 * MIN, last_only=False)
    fives = sorted((r.start_ms, r.measure, r) for r in rows if r.window == "5m")
    assert [(s, m) for s, m, _ in fives] == [(0, "m1"), (0, "m2"), (5 * MIN, "m1"), (5 * MIN, "m2")]
    for start, measure, row in fives:
        m = int(measure[1]) - 1
        sel = (ts >= start) & (ts < start + 5 * MIN)
        assert row.count == sel.sum()
        assert row.sum == pytest.approx(vals[sel, m].sum())
        assert row.sum_squares == pytest.approx((vals[sel, m] ** 2).sum())
        assert row.mean == pytest.approx(vals[sel, m].mean())
    # the 1h window holding [0, 10m) is not complete at 10m
    assert not [r for r in rows if r.window == "1h"]
    assert [r.end_ms for r in agg.window_rows(10 * MIN) if r.measure == "m1"] == [10 * MIN]


def test_final_includes_the_window_holding_the_newest_data():
    agg, segments = make()
    agg.observe(0, np.array([segments.segment_of({})]), np.array([7 * MIN]), np.array([[1, 1]]))
    assert agg.window_rows(None) == []
    rows = agg.window_rows(None, final=True)
    assert {(r.window, r.start_ms, r.end_ms) for r in rows} == {
        ("5m", 5 * MIN, 10 * MIN),
        ("1h", 0, 60 * MIN),
    }


def test_prune_and_drop_partition():
    agg, segments = make()
    seg = segments.segment_of({})
    agg.observe(0, np.array([seg, seg]), np.array([0, 30 * MIN]), np.ones((2, 2)))
    agg.observe(1, np.array([seg]), np.array([0]), np.ones((1, 2)))
    agg.prune(0, 30 * MIN)  # the 1h window [0, 60m) does not end by 30m: kept whole
    assert agg.window_sums(0, 60 * MIN)[seg, 0, 0] == 3
    agg.prune(0, 60 * MIN)  # drops partition 0's windows ending at or before 60m
    assert agg.window_sums(0, 60 * MIN)[seg, 0, 0] == 1  # partition 1's 0m
    agg.observe(0, np.array([seg]), np.array([60 * MIN]), np.ones((1, 2)))
    agg.drop_partition(1)
    assert agg.window_sums(0, 60 * MIN)[seg, 0, 0] == 0
    assert agg.window_sums(0, 120 * MIN)[seg, 0, 0] == 1
    assert agg.partitions() == [0]
    assert agg.hist_count[seg, 0] == 4  # histograms never go down


def test_a_window_is_pruned_whole_or_kept_whole():
    """The oldest window kept still has its first buckets: its row counts the whole window,
    as its bootstrap sums do (a row of part of a window disagreed with them)."""
    agg, segments = make()
    seg = segments.segment_of({})
    ts = np.arange(0, 70 * MIN, MIN // 2)
    agg.observe(0, np.full(len(ts), seg), ts, np.ones((len(ts), 2)), clusters=ts.astype(np.uint64))
    agg.prune(0, 62 * MIN)  # [60m, 65m) and the 1h window [60m, 120m) do not end by 62m
    rows = {(r.window, r.start_ms): r for r in agg.window_rows(None, last_only=False, final=True)}
    assert rows[("5m", 60 * MIN)].count == 10  # every bucket of it, not the last three
    assert agg.reach(62 * MIN) == 60 * MIN
    assert ("5m", 55 * MIN) not in rows and ("1h", 0) not in rows


def test_segments_created_after_buckets_exist_grow_the_arrays():
    agg, segments = make()
    for k in range(12):
        agg.observe(
            0, np.array([segments.segment_of({"arm": f"a{k}"})]), np.array([0]), np.ones((1, 2))
        )
    assert len(segments) == 6  # 5 values + __other__
    sums = agg.window_sums(0, 5 * MIN)
    assert sums[:, 0, 0].tolist() == [1, 1, 1, 1, 1, 7]


def test_mean_ci95():
    mean, half = mean_ci95(4, 2.0, 1.5)
    sd = math.sqrt((1.5 - 2.0**2 / 4) / 3)
    assert mean == 0.5 and half == pytest.approx(1.959963984540054 * sd / 2)
    assert math.isnan(mean_ci95(0, 0, 0)[0])
    assert mean_ci95(1, 0.3, 0.09)[0] == 0.3 and math.isnan(mean_ci95(1, 0.3, 0.09)[1])


def test_impressions_scored_into_the_overflow_segment_are_counted():
    segments = SegmentIndex(["arm"], cap=5, max_segments=1)
    agg = Aggregates(["m1"], segments, [0.5], MIN, [5 * MIN], 60 * MIN)
    kept = segments.segment_of({"arm": "A"})
    agg.observe(0, np.array([kept, kept]), np.array([0, 1]), np.ones((2, 1)))
    assert agg.overflow == 0
    folded = segments.segment_of({"arm": "B"})
    agg.observe(0, np.array([folded, kept, folded]), np.array([2, 3, 4]), np.ones((3, 1)))
    assert agg.overflow == 2
    # results replayed after a restart feed the window sums only: not counted again
    agg.observe(0, np.array([folded]), np.array([5]), np.ones((1, 1)), histogram=False)
    assert agg.overflow == 2


def test_window_bootstrap_sums_merge_partitions_and_give_the_clustered_interval():
    """The window's replicate sums, split over partitions, equal BootstrapState.of over the
    window's lists; the interval follows, and the squares counter is the sum of squares."""
    from evald.statistics import BootstrapState
    from evald.statistics.bootstrap import request_clusters

    agg, segments = make()
    seg = segments.segment_of({"arm": "A"})
    rng = np.random.default_rng(4)
    n = 400
    values = rng.beta(2, 3, (n, 2))
    values[::50, 1] = np.nan  # a measure undefined for some lists: not in its Σw
    ts = rng.integers(0, 5 * MIN, n)
    rids = [f"r{i}" for i in range(n)]
    keys = request_clusters(rids)
    part = rng.integers(0, 3, n)
    for p in range(3):
        sel = part == p
        agg.observe(p, np.full(sel.sum(), seg), ts[sel], values[sel], clusters=keys[sel])
    rows = {r.measure: r for r in agg.window_rows(5 * MIN) if r.window == "5m"}
    for j, measure in enumerate(agg.measures):
        state = BootstrapState.of(keys, values[:, j])
        expected = state.interval().half_width
        assert rows[measure].ci95_clustered_halfwidth == pytest.approx(expected, rel=1e-9)
        finite = values[np.isfinite(values[:, j]), j]
        assert agg.hist_squares[seg, j] == pytest.approx(float(finite @ finite))
    # without cluster keys (or with 0 replicates) there is no clustered interval
    bare, bare_segments = make()
    bare.observe(0, np.full(n, bare_segments.segment_of({"arm": "A"})), ts, values)
    assert all(math.isnan(r.ci95_clustered_halfwidth) for r in bare.window_rows(5 * MIN))


def _filled(seed: int, arms: int = 4) -> tuple[Aggregates, SegmentIndex]:
    """Two partitions of random finite and non-finite values over many buckets/segments
    (more than 5 ``arms``: some fold into ``__other__``)."""
    agg, segments = make()
    rng = np.random.default_rng(seed)
    for p in (0, 1):
        n = 500
        labels = [{"arm": f"a{k}"} for k in rng.integers(0, arms, n)]
        seg = np.asarray([segments.segment_of(lab) for lab in labels])
        values = rng.random((n, 2)) / 3  # sums that are not exact in binary
        values[rng.random((n, 2)) < 0.05] = np.nan
        agg.observe(p, seg, rng.integers(0, 90 * MIN, n), values)
    return agg, segments


def _state(agg: Aggregates, partition: int) -> dict[tuple[int, tuple[str, ...]], list[float]]:
    """Partition's window sums by (bucket, segment labels), compared exactly."""
    out = {}
    for key in range(0, 100):
        sums = agg.window_sums(key * MIN, (key + 1) * MIN)
        for seg_id, per in enumerate(sums):
            if per.any():
                out[(key, tuple(agg.segments.segments[seg_id]))] = per.ravel().tolist()
    return out


def test_a_loaded_snapshot_equals_the_original_bit_for_bit():
    agg, _ = _filled(3, arms=12)
    agg.drop_partition(1)
    raw = agg.snapshot(0)
    # another process: other segment ids (the same labels seen in another order first)
    other, segments = make()
    for segment in reversed(agg.segments.segments):
        segments.id_of(segment)
    assert segments.segments != agg.segments.segments
    other.load(0, raw)
    assert _state(other, 0) == _state(agg, 0) and _state(agg, 0)
    assert other.bucket_range() == agg.bucket_range()
    assert other.snapshot(0) != b"" and other.hist_count.sum() == 0  # windows only
    # and it keeps adding like the original
    for target in (agg, other):
        seg = np.asarray([target.segments.segment_of({"arm": "a1"})])
        target.observe(0, seg, np.asarray([5 * MIN]), np.asarray([[0.1, 0.7]]))
    assert _state(other, 0) == _state(agg, 0)


def test_a_snapshot_holds_only_its_partition_and_replaces_on_load():
    agg, _ = _filled(4)
    other, _ = _filled(5)
    other.load(1, agg.snapshot(0))
    expected, _ = _filled(4)
    expected.drop_partition(1)
    mine, _ = _filled(5)
    mine.drop_partition(1)
    merged = _state(other, 0)  # partition 0 of seed 5 + partition 0 of seed 4 as partition 1
    assert merged != _state(mine, 0)
    other.drop_partition(0)
    assert _state(other, 1) == _state(expected, 0)


def test_an_empty_partition_snapshot_loads_empty():
    agg, _ = make()
    other, _ = _filled(6)
    other.load(0, agg.snapshot(0))
    assert other.partitions() == [0, 1] and other.snapshot(0) == agg.snapshot(0)


def test_a_snapshot_of_other_measures_or_bucket_is_refused_unchanged():
    agg, _ = _filled(7)
    raw = agg.snapshot(0)
    wrong = Aggregates(["m1"], SegmentIndex(["arm"], 10), [0.5], MIN, [5 * MIN], 60 * MIN)
    coarse = Aggregates(["m1", "m2"], SegmentIndex(["arm"], 10), [0.5], 2 * MIN, [], MIN)
    for target in (wrong, coarse):
        with pytest.raises(ValueError, match="another bucket or other measures"):
            target.load(0, raw)
        assert target.partitions() == []
    with pytest.raises(ValueError):
        agg.load(0, raw[:-9])


def test_a_snapshot_covers_buckets_made_before_later_segments_existed():
    segments = SegmentIndex(["arm"], cap=50)
    agg = Aggregates(["m1"], segments, [0.5], MIN, [5 * MIN], 60 * MIN)
    agg.observe(0, np.asarray([segments.segment_of({"arm": "a"})]), np.asarray([0]), [[0.3]])
    late = [segments.segment_of({"arm": f"b{k}"}) for k in range(12)]  # past the 8 first rows
    agg.observe(0, np.asarray(late), np.full(12, MIN), np.full((12, 1), 0.7))
    other = Aggregates(["m1"], SegmentIndex(["arm"], cap=50), [0.5], MIN, [5 * MIN], 60 * MIN)
    other.load(0, agg.snapshot(0))
    assert _state(other, 0) == _state(agg, 0) and len(_state(agg, 0)) == 13


def test_a_snapshot_carries_the_bootstrap_sums_so_the_clustered_interval_survives():
    """The clustered interval of a loaded partition equals the original's, digit for digit."""
    from evald.statistics.bootstrap import request_clusters

    agg, segments = make()
    seg = segments.segment_of({"arm": "A"})
    rng = np.random.default_rng(8)
    n = 300
    values = rng.beta(2, 3, (n, 2))
    ts = rng.integers(0, 5 * MIN, n)
    keys = request_clusters([f"r{i}" for i in range(n)])
    agg.observe(0, np.full(n, seg), ts, values, clusters=keys)
    other, _ = make()
    other.load(0, agg.snapshot(0))
    rows = [(r.window, r.measure, r.ci95_clustered_halfwidth) for r in agg.window_rows(5 * MIN)]
    again = [(r.window, r.measure, r.ci95_clustered_halfwidth) for r in other.window_rows(5 * MIN)]
    assert rows == again and not any(math.isnan(r[2]) for r in rows if r[0] == "5m")
