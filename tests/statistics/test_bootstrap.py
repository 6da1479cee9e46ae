"""The hashed Poisson bootstrap: deterministic weights, merge invariance, coverage under ICC 0.2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from evald.statistics.bootstrap import (
    BootstrapState,
    cluster_key,
    list_cluster,
    normal_quantile,
    poisson_weights,
    replicate_sums,
)
from evald.statistics.intervals import t_interval


def test_weights_are_poisson_one_and_a_pure_function_of_key_and_replicate() -> None:
    keys = np.arange(200_000, dtype=np.uint64) * np.uint64(2654435761)
    w = poisson_weights(keys, replicates=4, seed=9)
    assert w.mean() == pytest.approx(1.0, abs=0.01)
    assert w.var() == pytest.approx(1.0, abs=0.02)
    assert (w == 0).mean() == pytest.approx(np.exp(-1), abs=0.005)
    # independent across replicates and keys
    assert abs(np.corrcoef(w[:, 0], w[:, 1])[0, 1]) < 0.01
    # the same key gets the same weights alone or in any batch
    assert (poisson_weights(keys[[5]], 4, 9) == w[[5]]).all()
    assert (poisson_weights(keys[::-1], 4, 9) == w[::-1]).all()
    assert not (poisson_weights(keys[:100], 4, 10) == w[:100]).all()  # the seed matters


def test_cluster_key_is_stable_across_processes() -> None:
    """Not Python's salted hash(): another process with another hash seed gets the same key."""
    code = "from evald.statistics import cluster_key; print(cluster_key('user-42'))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)
    assert int(out.stdout) == cluster_key("user-42")
    assert cluster_key("user-42") != cluster_key("user-43")


def test_replicate_sums_round_each_product_and_add_the_rows_in_order() -> None:
    """The plain loop's bits, whatever BLAS kernel the CPU would select: a checkpoint must not
    depend on the machine that wrote it (tests/daemon/test_checkpoint_fixture.py)."""
    rng = np.random.default_rng(7)
    y = np.round(rng.random((57, 14)), 5)
    w = poisson_weights(np.arange(57), 100).astype(np.float64)
    rows = np.zeros((14, 100))
    column = np.zeros(100)
    for i in range(57):
        rows = rows + np.multiply.outer(y[i], w[i])
        column = column + y[i, 3] * w[i]
    assert replicate_sums(y, w).tobytes() == rows.tobytes()
    assert replicate_sums(y[:, 3], w).tobytes() == column.tobytes()
    assert replicate_sums(y[:0], w[:0]).tobytes() == np.zeros((14, 100)).tobytes()


def test_lists_without_a_user_id_fall_back_to_their_request_id() -> None:
    assert list_cluster("alice", "r1") == list_cluster("alice", "r2")  # one user, one cluster
    assert list_cluster(None, "r1") != list_cluster(None, "r2")  # no user: each list alone
    assert list_cluster("", "r1") == list_cluster(None, "r1")
    assert list_cluster("r1", "x") != list_cluster(None, "r1")  # equal strings, other kinds


def test_list_clusters_is_list_cluster_of_each_list() -> None:
    from evald.statistics.bootstrap import list_clusters, request_clusters, user_cluster

    users = ["alice", None, "", "bob", "alice", "r9"]
    rids = [f"r{i}" for i in range(len(users))]
    want = [list_cluster(u, r) for u, r in zip(users, rids, strict=True)]
    user_keys = [user_cluster(u) if u else 0 for u in users]
    assert list_clusters(user_keys, rids).tolist() == want
    assert request_clusters(rids).tolist() == [list_cluster(None, r) for r in rids]


def test_any_partitioning_and_order_give_the_same_state() -> None:
    rng = np.random.default_rng(4)
    users = rng.integers(0, 300, 5000).astype(np.uint64)
    y = rng.random(5000)
    y[rng.random(5000) < 0.01] = np.nan  # undefined measures are skipped
    whole = BootstrapState.of(users, y)
    for parts in (2, 7, 31):
        owner = rng.integers(0, parts, y.size)
        order = rng.permutation(parts)
        merged = BootstrapState()
        for p in order:
            merged = merged + BootstrapState.of(users[owner == p], y[owner == p])
        assert merged.moments.n == whole.moments.n
        np.testing.assert_allclose(merged.weighted_sum, whole.weighted_sum, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(merged.weight_sum, whole.weight_sum)
        assert merged.interval().low == pytest.approx(whole.interval().low, abs=1e-9)


def test_json_round_trip_and_mismatched_states_refuse_to_merge() -> None:
    state = BootstrapState.of([1, 2, 2], [0.2, 0.4, 0.9], replicates=8)
    back = BootstrapState.from_json(json.loads(json.dumps(state.to_json())))
    np.testing.assert_array_equal(back.weighted_sum, state.weighted_sum)
    np.testing.assert_array_equal(back.weight_sum, state.weight_sum)
    assert back.moments == state.moments
    with pytest.raises(ValueError, match="do not merge"):
        _ = state + BootstrapState(replicates=8, seed=1)


def _coverage(icc: float, windows: int, seed: int) -> tuple[float, float]:
    """Share of windows whose 95% interval covers the true mean 0: (clustered, unclustered).

    Each window has 150 users with 1 + Poisson(4) lists; a list's value is the user's effect
    (variance icc) plus its own noise (variance 1 − icc)."""
    rng = np.random.default_rng(seed)
    clustered = unclustered = 0
    for w in range(windows):
        lists = 1 + rng.poisson(4.0, 150)
        effect = rng.normal(0.0, np.sqrt(icc), 150)
        user = np.repeat(np.arange(150), lists)
        y = effect[user] + rng.normal(0.0, np.sqrt(1 - icc), user.size)
        keys = (np.uint64(w) << np.uint64(32)) + user.astype(np.uint64)
        state = BootstrapState.of(keys, y)
        boot, plain = state.interval(), t_interval(state.moments)
        clustered += boot.low <= 0.0 <= boot.high
        unclustered += plain.low <= 0.0 <= plain.high
    return clustered / windows, unclustered / windows


def test_clustered_interval_covers_where_the_unclustered_one_does_not() -> None:
    clustered, unclustered = _coverage(icc=0.2, windows=2000, seed=20261124)
    assert 0.935 <= clustered <= 0.965, clustered
    assert unclustered < 0.90, unclustered


def test_heavy_tailed_lists_per_user_cover_a_little_under_the_level() -> None:
    """Lists per user as in the A/B simulations (⌈lognormal(1, 1.2)⌉, up to 600), ICC 0.2,
    400 users a window: the bootstrap covers 93.3% of 2000 windows (92.3% at 150 users: the few
    heaviest users hold much of a window, the sandwich's small-sample bias), the plain t
    interval 62%. Held to [92.5%, 96.5%] here, and said so in docs/statistics.md §2."""
    rng = np.random.default_rng(4)
    covered = plain = 0
    for _ in range(2000):
        lists = np.minimum(np.ceil(np.exp(rng.normal(1.0, 1.2, 400))), 600).astype(np.int64)
        user = np.repeat(np.arange(400), lists)
        y = rng.normal(0.0, np.sqrt(0.2), 400)[user] + rng.normal(0.0, np.sqrt(0.8), user.size)
        keys = rng.integers(1, 2**63, 400, dtype=np.uint64)[user]
        state = BootstrapState.of(keys, y)
        boot, t = state.interval(), t_interval(state.moments)
        covered += boot.low <= 0.0 <= boot.high
        plain += t.low <= 0.0 <= t.high
    assert 0.925 <= covered / 2000 <= 0.965, covered
    assert plain / 2000 < 0.75, plain


def test_without_clustering_the_two_agree() -> None:
    clustered, unclustered = _coverage(icc=0.0, windows=600, seed=8)
    assert abs(clustered - unclustered) <= 0.1 * unclustered
    assert 0.92 <= clustered <= 0.97


def test_the_fast_weights_equal_the_documented_definition():
    """Integer thresholds in place of the float quantile: the same weight for every key and
    replicate (2 million, heavy tail included), so states from either merge."""
    from evald.statistics.bootstrap import _poisson_weights_reference

    keys = np.random.default_rng(8).integers(0, 2**63, 20_000, dtype=np.uint64)
    keys[:3] = [0, 1, 2**63 - 1]
    fast = poisson_weights(keys, 100, seed=7)
    assert fast.max() >= 7  # the rare branch is exercised
    np.testing.assert_array_equal(fast, _poisson_weights_reference(keys, 100, seed=7))


def test_cached_normal_quantile_is_scipys_and_the_interval_uses_it() -> None:
    from scipy.stats import norm

    for q in (0.975, 0.95, 0.995):
        assert normal_quantile(q) == float(norm.ppf(q))
    rng = np.random.default_rng(3)
    state = BootstrapState.of(np.arange(200), rng.random(200))
    ci = state.interval(0.9)
    half = float(norm.ppf(0.95)) * state.standard_error()
    assert (ci.low, ci.high) == (ci.mean - half, ci.mean + half)
