import math

import numpy as np
import pytest
from scipy import stats

from evald.interleaving.fold import PreferenceState, Settings, fold_window
from evald.interleaving.windows import PartitionCredit
from evald.statistics.bootstrap import poisson_weights, user_cluster
from evald.statistics.sequential import mean_bound, sequence_bound

ALPHA, TUNING = 0.05, 5000.0


def cs_half_width(n: int, variance: float, alpha: float, tuning_n: float) -> float:
    """Waudby-Smith et al. 2024, eq. 9 with the tuning of eq. 161, written out again."""
    rho2 = (-2 * math.log(alpha) + math.log(1 - 2 * math.log(alpha))) / tuning_n
    return math.sqrt(variance) * math.sqrt(
        2 * (n * rho2 + 1) / (n * n * rho2) * math.log(math.sqrt(n * rho2 + 1) / alpha)
    )


@pytest.mark.parametrize(
    ("n", "mean", "sd"), [(150, 0.1, 0.9), (1000, -0.03, 0.7), (20000, 0.01, 1.0)]
)
def test_mean_bound_is_the_one_sample_sequence(n, mean, sd):
    se2 = sd * sd / n
    got = mean_bound(mean, se2, n, ALPHA, TUNING)
    half = cs_half_width(n, sd * sd, ALPHA, TUNING)
    assert got.low == pytest.approx(mean - half, abs=1e-12)
    assert got.high == pytest.approx(mean + half, abs=1e-12)
    # the two-sample sequence (checked against gbstats) with n split any way is the same
    two = sequence_bound(mean, se2, n // 2, n - n // 2, ALPHA, TUNING, min_n=2)
    assert (got.low, got.high, got.evalue) == pytest.approx(
        (two.low, two.high, two.evalue), abs=1e-12
    )
    # it excludes 0 exactly when e >= 1/alpha
    assert (got.low > 0 or got.high < 0) == (got.evalue >= 1 / ALPHA)
    assert math.isnan(mean_bound(mean, se2, 99, ALPHA, TUNING).low)


def test_every_compared_list_won_by_one_team_decides_where_two_arms_would_wait():
    """SE² = 0: the one-sample band is the point Δ̂ (a verdict for the team that won every
    list), where the two-sample sequence publishes no band until some list disagrees."""
    won = mean_bound(1.0, 0.0, 150, ALPHA, TUNING)
    assert won.low == won.high == 1.0 and won.p_value == 0.0
    assert math.isnan(sequence_bound(1.0, 0.0, 75, 75, ALPHA, TUNING, min_n=2).low)


def window_sums(d, users, leads, replicates=100):
    """One window's sums of one cell from per-list outcomes (d = None: not compared)."""
    state = PartitionCredit(60_000, replicates)
    cell = (("web",), "A", "B")
    keys = np.asarray([user_cluster(u) for u in users], dtype=np.uint64)
    weights = poisson_weights(keys, replicates) if replicates else None
    n = len(d)
    state.observe(
        [0] * n,
        [cell] * n,
        leads,
        [0 if x is None else x for x in d],
        [x is not None for x in d],
        [True] * n,
        weights,
    )
    return state.windows[0][cell], weights


def test_a_fold_equals_the_brute_force_statistics():
    rng = np.random.default_rng(7)
    settings = Settings(alpha=ALPHA, tuning_n=TUNING, min_n=100)
    state = PreferenceState()
    all_d: list[int] = []
    all_w: list[np.ndarray] = []
    leads = [0, 0]
    srm_max = 0.0
    for look in range(6):
        n = 400
        users = [f"u{k}" for k in rng.integers(0, 120, n)]
        user_bias = {u: rng.normal(0.15, 0.4) for u in set(users)}
        d: list[int | None] = []
        for u in users:
            if rng.random() < 0.4:
                d.append(None)  # nobody clicked
            else:
                x = rng.random() + user_bias[u] * 0.3
                d.append(1 if x > 0.6 else -1 if x < 0.35 else 0)
        lead = (rng.random(n) < 0.5).tolist()
        sums, weights = window_sums(d, users, lead)
        state = fold_window(state, (look + 1) * 60_000, {(("web",), "A", "B"): sums}, settings)
        pair = state.pairs[(("web",), "A", "B")]
        kept = [i for i, x in enumerate(d) if x is not None]
        all_d += [d[i] for i in kept]
        all_w += [weights[i].astype(float) for i in kept]
        leads[0] += sum(lead)
        leads[1] += n - sum(lead)
        # brute force: Δ, the clustered variance max(s²/n, mean_b D_b²), the band
        y = np.asarray(all_d, dtype=float)
        w = np.asarray(all_w)
        m = len(y)
        delta = y.mean()
        list_level = y.var(ddof=1) / m
        replicate_d = (w * (y - delta)[:, None]).sum(axis=0) / m
        variance = max(list_level, float(np.mean(replicate_d**2)))
        half = cs_half_width(m, m * variance, ALPHA, TUNING)
        assert pair.total.compared == m
        assert pair.total.preference == pytest.approx(delta, abs=1e-12)
        assert pair.bound.low == pytest.approx(delta - half, abs=1e-12)
        assert pair.bound.high == pytest.approx(delta + half, abs=1e-12)
        assert pair.bound.clustered
        # the sample-ratio guard on who led: scipy's log-pmfs, running maximum
        n_all = sum(leads)
        log_e = stats.dirichlet_multinomial.logpmf(
            leads, [50.0, 50.0], n_all
        ) - stats.multinomial.logpmf(leads, n_all, [0.5, 0.5])
        srm_max = max(srm_max, float(log_e))
        assert state.srm_p_value((("web",), "A", "B")) == pytest.approx(
            min(1.0, math.exp(-srm_max)), rel=1e-9
        )
    assert pair.winner == "A" and pair.decided_end is not None


def test_the_winner_is_null_until_the_band_excludes_zero_and_then_kept():
    settings = Settings(alpha=ALPHA, tuning_n=TUNING, min_n=100)
    state = PreferenceState()
    cell = (("web",), "A", "B")
    winners = []
    # a slight edge for B, then nothing
    plan = [(60, 40, 100)] + [(200, 320, 80)] * 5 + [(300, 200, 100)] * 3
    for look, (a, b, t) in enumerate(plan):
        d = [1] * a + [-1] * b + [0] * t
        users = [f"u{look}-{i}" for i in range(len(d))]
        sums, _ = window_sums(d, users, [i % 2 == 0 for i in range(len(d))], replicates=0)
        state = fold_window(state, (look + 1) * 60_000, {cell: sums}, settings)
        winners.append(state.pairs[cell].winner)
    assert winners[0] is None
    first = winners.index("B")
    assert all(w is None for w in winners[:first]) and all(w == "B" for w in winners[first:])
    assert not state.pairs[cell].bound.clustered  # no replicates: list level


def test_the_family_splits_alpha_over_its_cells():
    settings = Settings(alpha=ALPHA, tuning_n=TUNING, min_n=2)
    d = [1, -1, 0, 1, 1]
    sums, _ = window_sums(d, ["u"] * 5, [True] * 5, replicates=0)
    cells = {(("web",), "A", "B"): sums, (("app",), "A", "B"): sums, (("app",), "A", "C"): sums}
    state = fold_window(PreferenceState(), 60_000, cells, settings)
    assert state.alpha(settings) == pytest.approx(ALPHA / 3)
    expected = mean_bound(0.4, np.var(d, ddof=1) / 5, 5, ALPHA / 3, TUNING, min_n=2)
    got = state.pairs[(("web",), "A", "B")].bound
    assert (got.low, got.high, got.evalue) == pytest.approx(
        (expected.low, expected.high, expected.evalue), abs=1e-12
    )
