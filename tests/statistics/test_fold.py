"""The fold over complete windows: merge invariance, detection with a negative control, the
family, the declared start and the arm-scoped labels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evald.config import EngineConfig, load_config
from evald.segments import SegmentIndex
from evald.statistics.bootstrap import DEFAULT_SEED, list_clusters, poisson_weights, user_cluster
from evald.statistics.fold import ComparisonState, fold_window
from evald.statistics.live import LiveStatistics
from evald.statistics.shares import PartitionShares

HOUR = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MEASURES = ["nDCG@10", "RR"]
ARMS = {"A": "ranker-1", "B": "ranker-2"}


def settings(**stats: object) -> EngineConfig:
    comparison = {
        "name": "ab",
        "label": "arm",
        "control": "A",
        "treatments": ["B"],
        "start": T0,
        "arm_scoped_labels": ["model"],
        "min_effect": {"nDCG@10": 0.01},
    }
    return load_config(
        {
            "measures": ["nDCG@10", "RR"],
            "statistics": {"comparisons": [comparison], **stats},
        }
    )


def lists(rng: np.random.Generator, n: int, hours: int, drop_from: int | None = None):
    """(labels, ts, values (n, 2), request ids) of n lists over ``hours`` hourly windows."""
    arm = rng.choice(["A", "B"], n)
    surface = rng.choice(["web", "app"], n)
    ts = T0 + rng.integers(0, hours * HOUR, n)
    values = rng.beta(2, 3, (n, 2))
    if drop_from is not None:
        values[(arm == "B") & (ts >= T0 + drop_from * HOUR)] -= 0.05
    labels = [
        {"model": ARMS[a], "arm": str(a), "surface": str(s)}
        for a, s in zip(arm, surface, strict=True)
    ]
    return labels, ts, values, [f"r{i}" for i in range(n)]


def fold_partitioned(
    config: EngineConfig, data, partitions: int, seed: int, users: np.ndarray | None = None
) -> LiveStatistics:
    """Observe the lists split at random over ``partitions`` partitions, in a random order,
    then fold every partition's final shares. ``users``: each list's user (-1: none), whose
    bootstrap weights the shares then keep (a user's lists land in several partitions)."""
    labels, ts, values, rids = data
    segments = SegmentIndex(config.label_keys, config.label_value_cap, config.max_segments)
    replicates = 0 if users is None else config.statistics.bootstrap_replicates
    shares = PartitionShares(
        config.statistics.window, config.window, len(MEASURES), segments, replicates
    )
    weights = has_user = None
    if users is not None:
        keys = list_clusters([user_cluster(f"u{u}") if u >= 0 else 0 for u in users.tolist()], rids)
        weights, has_user = poisson_weights(keys, replicates, DEFAULT_SEED), users >= 0
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ts))
    part = rng.integers(0, partitions, len(ts))
    seg = np.asarray([segments.segment_of(lab) for lab in labels])
    for chunk in np.array_split(order, 13):
        for p in range(partitions):
            sel = chunk[part[chunk] == p]
            w = None if weights is None else weights[sel]
            u = None if has_user is None else has_user[sel]
            shares.observe(p, seg[sel], ts[sel], values[sel], ["window"] * len(sel), w, u)
    live = LiveStatistics(config, MEASURES)
    for p in rng.permutation(partitions).tolist():
        frozen = shares.freeze(p, None, final=True)
        assert frozen is not None
        live.add(frozen)
    live.fold(range(partitions))
    return live


def states_close(a: ComparisonState, b: ComparisonState) -> None:
    assert a.windows == b.windows and a.rests == b.rests and a.family == b.family
    assert a.sequences.keys() == b.sequences.keys()
    for key, seq in a.sequences.items():
        other = b.sequences[key]
        assert seq.control.n == other.control.n and seq.treatment.n == other.treatment.n
        for x, y in [
            (seq.low, other.low),
            (seq.high, other.high),
            (seq.p_value, other.p_value),
            (seq.treatment.total, other.treatment.total),
            (a.vs_control[key].statistic, b.vs_control[key].statistic),
        ]:
            assert x == pytest.approx(y, rel=1e-9, abs=1e-12)
        assert a.bounds[key].clustered == b.bounds[key].clustered
        assert seq.treatment.users == other.treatment.users
    for key, cusum in a.vs_baseline.items():
        assert cusum.statistic == pytest.approx(b.vs_baseline[key].statistic, rel=1e-9, abs=1e-12)
    assert {k: r.counts for k, r in a.ratio.items()} == {k: r.counts for k, r in b.ratio.items()}
    pooled = [None if s.pooled_ratio is None else s.pooled_ratio.counts for s in (a, b)]
    assert pooled[0] == pooled[1]


def test_any_partitioning_of_the_windows_sums_gives_the_same_state():
    config = settings(min_n=30, cusum_min_n=30)
    data = lists(np.random.default_rng(3), 6000, 12, drop_from=6)
    (whole,) = fold_partitioned(config, data, 1, seed=0).views()
    assert whole.state.windows == 12 and whole.state.sequences
    for partitions, seed in [(2, 1), (7, 2), (31, 3)]:
        (view,) = fold_partitioned(config, data, partitions, seed).views()
        states_close(whole.state, view.state)


def test_any_partitioning_gives_the_same_state_clustered_by_user():
    """Lists of 300 users (a user's lists in several partitions and windows) and some without
    a user id: the sequences, bounds and CUSUMs clustered by user come out the same whatever
    the partitioning, and differ from the list-level fold of the same lists."""
    config = settings(min_n=30, cusum_min_n=30)
    rng = np.random.default_rng(4)
    data = lists(rng, 6000, 12, drop_from=6)
    users = rng.integers(-1, 300, 6000)
    (whole,) = fold_partitioned(config, data, 1, seed=0, users=users).views()
    assert whole.state.windows == 12
    assert all(bound.clustered for bound in whole.state.bounds.values())
    for partitions, seed in [(2, 1), (7, 2), (31, 3)]:
        (view,) = fold_partitioned(config, data, partitions, seed, users=users).views()
        states_close(whole.state, view.state)
    (plain,) = fold_partitioned(config, data, 1, seed=0).views()
    assert not any(bound.clustered for bound in plain.state.bounds.values())
    with pytest.raises(AssertionError):
        states_close(whole.state, plain.state)


def test_the_pooled_sample_ratio_guard_counts_every_comparison_segment():
    config = settings(min_n=30, cusum_min_n=30)
    (view,) = fold_partitioned(config, lists(np.random.default_rng(6), 3000, 6), 3, 1).views()
    state = view.state
    assert state.pooled_ratio is not None and len(state.ratio) == 2
    assert state.pooled_ratio.counts == tuple(
        sum(r.counts[i] for r in state.ratio.values()) for i in range(2)
    )
    assert set(state.srm_p_values()) == set(state.ratio)


def window_sums(rng: np.random.Generator, n: int, shift: float) -> list:
    """One window's (labels, (M, 3) sums) for both arms of one surface."""
    out = []
    for arm, delta in (("A", 0.0), ("B", shift)):
        y = rng.normal(0.5 + delta, 0.3, (n, len(MEASURES)))
        sums = np.stack([np.full(len(MEASURES), n), y.sum(0), (y * y).sum(0)], axis=-1)
        out.append(({"model": ARMS[arm], "arm": arm, "surface": "web"}, sums))
    return out


@pytest.mark.parametrize("shift", [0.0, -0.03])
def test_a_drop_of_the_treatment_alarms_and_the_same_seed_without_it_does_not(shift):
    """Negative control: the same seed and windows with no drop raise nothing."""
    config = settings(min_n=100, cusum_min_n=30)
    comp = config.statistics.comparisons[0]
    rng = np.random.default_rng(7)
    state = ComparisonState()
    for w in range(60):
        state = fold_window(
            state,
            comp,
            config.statistics,
            MEASURES,
            window_sums(rng, 500, shift if w >= 30 else 0.0),
        )
    key = ("B", (("surface", "web"),), "nDCG@10")
    alarm = state.vs_control[key].alarm_window
    if shift:
        assert alarm is not None and 30 < alarm <= 45  # a 1.4-SE drop: ~5 windows (Siegmund)
        assert state.bounds[key].high < 0
    else:
        assert alarm is None
        assert state.bounds[key].low <= 0 <= state.bounds[key].high
        assert not state.ratio[(("surface", "web"),)].mismatch(0.001)


def test_the_family_is_treatments_by_alerting_measures_by_comparison_segments():
    config = load_config(
        {
            "measures": ["nDCG@10", "RR", "P@10"],
            "statistics": {
                "alpha": 0.04,
                "comparisons": [
                    {
                        "name": "abc",
                        "label": "arm",
                        "control": "A",
                        "treatments": ["B", "C"],
                        "start": 0,
                        "min_effect": {"nDCG@10": 0.01, "RR": 0.02},
                    }
                ],
            },
        }
    )
    comp = config.statistics.comparisons[0]
    sums = np.ones((3, 3))
    segments = [
        ({"model": "m", "arm": arm, "surface": surface}, sums)
        for arm in "ABC"
        for surface in ("web", "app")
    ]
    state = fold_window(ComparisonState(), comp, config.statistics, config.measures, segments)
    assert state.family == 2 * 2 * 2  # model is not arm-scoped here: it is one value anyway
    assert state.alpha(config.statistics) == pytest.approx(0.04 / 8)
    assert len(state.sequences) == 2 * 3 * 2  # every measure is compared, two alert


def test_windows_before_the_start_are_not_folded_and_scoped_labels_are_summed_away():
    start = T0 + 3 * HOUR
    base = settings()
    comp = base.statistics.comparisons[0].model_copy(update={"start": start})
    config = base.model_copy(
        update={"statistics": base.statistics.model_copy(update={"comparisons": [comp]})}
    )
    data = lists(np.random.default_rng(5), 3000, 6)
    (view,) = fold_partitioned(config, data, 1, seed=0).views()
    labels, ts, values, _ = data
    after = ts >= start
    arms = np.asarray([lab["arm"] for lab in labels])
    surfaces = np.asarray([lab["surface"] for lab in labels])
    assert view.state.windows == 3
    assert view.first_end_ms == start + HOUR
    for surface in ("web", "app"):
        seq = view.state.sequences[("B", (("surface", surface),), "nDCG@10")]
        sel = after & (surfaces == surface)
        assert seq.control.n == int((sel & (arms == "A")).sum())
        assert seq.treatment.n == int((sel & (arms == "B")).sum())
        assert seq.treatment.total == pytest.approx(values[sel & (arms == "B"), 0].sum())
    assert not math.isnan(view.state.bounds[("B", (("surface", "web"),), "nDCG@10")].high)


def test_the_settings_example_in_the_docs_is_valid():
    """docs/statistics.md's `statistics:` example loads as engine settings."""
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs/statistics.md").read_text()
    (block,) = re.findall(r"```yaml\n(statistics:\n.*?)```", text, re.DOTALL)
    config = load_config(yaml.safe_load(block))
    (comp,) = config.statistics.comparisons
    assert comp.min_effect == {"nDCG@10": 0.01, "RR": 0.01} and comp.start == T0


def test_the_state_round_trips_through_json_for_a_checkpoint():
    """A restart resumes the fold from the checkpointed state: the next window gives the same
    state as without the restart."""
    import json

    config = settings(min_n=100, cusum_min_n=30)
    comp = config.statistics.comparisons[0]
    rng = np.random.default_rng(9)
    state = ComparisonState()
    for _ in range(8):
        state = fold_window(state, comp, config.statistics, MEASURES, window_sums(rng, 300, -0.01))
    text = json.dumps(state.to_json(), allow_nan=False)
    restored = ComparisonState.from_json(json.loads(text))
    assert restored == state
    nxt = window_sums(np.random.default_rng(10), 300, -0.01)
    a = fold_window(state, comp, config.statistics, MEASURES, nxt)
    b = fold_window(restored, comp, config.statistics, MEASURES, nxt)
    assert a == b
