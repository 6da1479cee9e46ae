"""The variance clustered by user: the streamed replicate sums give exactly the sketch of the
cluster-robust variance over per-user totals, whatever the partitions and windows the lists
came in; its mean over the weights is that variance; lists without a user id fall back to the
list-level variance (gbstats' sequence) and say so."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evald.statistics.bootstrap import poisson_weights
from evald.statistics.clustered import ClusterSums, contrast, sums_of_rows
from evald.statistics.intervals import Moments
from evald.statistics.sequential import Comparison, confidence_sequence

B = 100


def sums(users: np.ndarray, y: np.ndarray, keys: np.ndarray, replicates: int = B) -> ClusterSums:
    """The ClusterSums of lists of ``users`` (index into ``keys``; -1: no user id) with values y."""
    w = poisson_weights(keys[users], replicates, 7).astype(np.float64)
    return ClusterSums(
        Moments.of(y), int((users >= 0).sum()), (y[:, None] * w).sum(axis=0), w.sum(axis=0)
    )


def population(rng: np.random.Generator, n: int, users: int, effect: float):
    """n lists of ``users`` users with a per-user effect; keys per user (the last: no user)."""
    who = rng.integers(0, users, n)
    y = np.clip(0.3 + effect * rng.normal(size=users)[who] + rng.normal(0, 0.2, n), 0, 1)
    keys = rng.integers(1, 2**63, users + 1).astype(np.uint64)
    return who, y, keys


def cluster_robust(who: np.ndarray, y: np.ndarray) -> float:
    """Σ_u (Y_u − ȳ N_u)² / N², from per-user totals (what no partition can compute alone)."""
    total = np.bincount(who, y)
    count = np.bincount(who).astype(np.float64)
    residual = total - y.mean() * count
    return float(np.square(residual).sum() / len(y) ** 2)


def test_streamed_replicate_sums_are_exactly_the_sketch_of_per_user_totals() -> None:
    """D_b = (T_b − ȳ W_b)/N equals Σ_u (w_ub − 1)(Y_u − ȳ N_u)/N computed from per-user
    totals, however the lists are split over partitions and windows and merged."""
    rng = np.random.default_rng(1)
    who, y, keys = population(rng, 4000, 300, 0.1)
    pieces = np.array_split(rng.permutation(len(y)), 17)
    merged = ClusterSums()
    for piece in pieces:
        merged = merged + sums(who[piece], y[piece], keys)
    total = np.bincount(who, y, 300)
    count = np.bincount(who, minlength=300).astype(np.float64)
    w = poisson_weights(keys[:300], B, 7).astype(np.float64)
    brute = ((w - 1.0).T @ (total - y.mean() * count)) / len(y)
    deviations = merged.centred()
    assert deviations is not None
    assert np.allclose(deviations, brute, rtol=1e-9, atol=1e-13)


def test_the_sketch_is_unbiased_for_the_cluster_robust_variance() -> None:
    """Averaged over 40 seeds of the weights, (1/B) Σ D_b² is Σ_u (Y_u − ȳN_u)²/N² (within
    three times the average's noise), which is far above the list-level s²/N here; with one
    list per user it is the list-level variance."""
    rng = np.random.default_rng(2)
    for users, effect in ((200, 0.15), (4000, 0.0)):
        who, y, _ = population(rng, 4000, users, effect)
        if not effect:
            who = np.arange(len(y))  # one list each
        want = cluster_robust(who, y)
        estimates = []
        for seed in range(40):
            keys = np.random.default_rng(100 + seed).integers(1, 2**63, len(y)).astype(np.uint64)
            d = sums(who, y, keys).centred()
            assert d is not None
            estimates.append(np.mean(d**2))
        assert np.mean(estimates) == pytest.approx(want, rel=3 * np.sqrt(2 / B / 40))
        list_level = float(np.var(y, ddof=1) / len(y))
        if effect:
            assert want > 5 * list_level
        else:
            assert want == pytest.approx(list_level, rel=1e-3)


def test_a_contrast_counts_a_user_in_both_terms_once_with_its_covariance() -> None:
    """A window against a baseline holding the same users: the clustered variance of the
    difference is far below the sum of the two variances (their user effects cancel)."""
    rng = np.random.default_rng(3)
    who, y, keys = population(rng, 8000, 200, 0.2)
    early, late = np.arange(4000), np.arange(4000, 8000)
    a, b = sums(who[early], y[early], keys), sums(who[late], y[late], keys)
    c = contrast(a, b)
    assert c.clustered and c.replicates is not None
    da, db = a.centred(), b.centred()
    assert da is not None and db is not None
    apart = float(np.mean(da**2) + np.mean(db**2))
    assert c.variance < apart / 3
    assert c.variance >= b.variance / b.n + a.variance / a.n  # never below the list level


def test_without_user_ids_it_is_the_list_level_sequence_exactly() -> None:
    """No list has a user id: the request-level fallback, the very sequence gbstats gives (the
    Moments path, checked against gbstats in test_sequential)."""
    rng = np.random.default_rng(4)
    y_c, y_t = rng.beta(2, 3, 900), rng.beta(2, 3, 1100)
    keys = rng.integers(1, 2**63, 2000).astype(np.uint64)
    c = sums(np.full(900, -1), y_c, keys[:900])
    t = sums(np.full(1100, -1), y_t, keys[900:])
    assert c.users == t.users == 0
    plain = confidence_sequence(Moments.of(y_c), Moments.of(y_t), 0.05, 2000.0)
    fallback = confidence_sequence(c, t, 0.05, 2000.0)
    assert fallback == plain and not fallback.clustered
    # one user id anywhere and the same sums are read clustered
    tagged = ClusterSums(t.moments, 1, t.weighted, t.weights)
    assert confidence_sequence(c, tagged, 0.05, 2000.0).clustered


def test_unknown_replicates_make_the_sum_list_level_and_an_empty_side_adds_nothing() -> None:
    rng = np.random.default_rng(5)
    who, y, keys = population(rng, 500, 50, 0.2)
    known = sums(who, y, keys)
    unknown = ClusterSums(Moments.of(y))  # a share written before replicates were kept
    assert (ClusterSums() + known) == known == (known + ClusterSums())
    mixed = known + unknown
    assert mixed.weighted is None and mixed.n == 2 * known.n and mixed.users == known.users
    assert not contrast(mixed, known).clustered
    # sums of another B (bootstrap_replicates changed between two runs) add up at list level
    other = known + sums(who, y, keys, replicates=10)
    assert other.weighted is None and other.n == 2 * known.n
    assert not contrast(known, sums(who, y, keys, replicates=10)).clustered


def test_rows_and_json_round_trip_and_old_moments_read_as_unknown_replicates() -> None:
    rng = np.random.default_rng(6)
    who, y, keys = population(rng, 300, 40, 0.1)
    s = sums(who, y, keys)
    row = np.concatenate(
        [[s.n, s.moments.total, s.moments.squares, s.users], s.weighted, s.weights]
    )
    (back,) = sums_of_rows(row[None, :])
    assert back == s
    assert ClusterSums.from_json(json.loads(json.dumps(s.to_json()))) == s
    old = ClusterSums.from_json(Moments(3, 1.0, 0.5).to_json())
    assert old.weighted is None and old.n == 3
    (list_level,) = sums_of_rows(np.asarray([[3.0, 1.0, 0.5]]))
    assert list_level == old
    with pytest.raises(ValueError):
        sums_of_rows(np.zeros((1, 5)))
    state, _ = Comparison().look(s, s)
    assert Comparison.from_json(json.loads(json.dumps(state.to_json()))) == state
