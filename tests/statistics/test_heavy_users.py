"""One user holding most of an arm (a crawler, a monitoring account): the sandwich sees almost no
spread, so before the guard an A/A comparison with a crawler in its small arm was flagged in
89% of streams. The lists are worth Kish's N²/Σ_u N_u² users, which the replicate sums give;
below MIN_USERS (and half the lists) in either term no band, no interval and no CUSUM step is
published. Unequal splits without a crawler keep their bands and stay within α, and ordinary
heavy-tailed traffic (windows of ~66 lists worth ~27 users) keeps every window."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evald.statistics.bootstrap import BootstrapState, poisson_weights, replicate_sums, user_cluster
from evald.statistics.clustered import (
    MIN_REPLICATES,
    MIN_USERS,
    ClusterSums,
    contrast,
    effective_users,
    few_users,
    mean_variance,
    sums_of_rows,
)
from evald.statistics.cusum import Cusum
from evald.statistics.fold import standardized
from evald.statistics.intervals import Moments
from evald.statistics.sequential import confidence_sequence
from evald.statistics.simulation import Traffic, cusum_alarms, sequence_flags, simulate

STREAMS = 150
ALPHA = 0.05


def sums_of(values: np.ndarray, users: list[str], replicates: int = 100) -> ClusterSums:
    keys = np.array([user_cluster(u) for u in users], dtype=np.uint64)
    w = poisson_weights(keys, replicates).astype(np.float64)
    return ClusterSums(
        Moments.of(values),
        len(values),
        replicate_sums(values, w),
        replicate_sums(np.ones_like(values), w),
    )


def test_effective_users_is_kish_from_the_per_user_totals() -> None:
    rng = np.random.default_rng(5)
    lists = np.minimum(np.ceil(np.exp(rng.normal(1.0, 1.2, 400))), 600).astype(np.int64)
    lists[0] = 2000  # one heavy user
    keys = np.array([user_cluster(f"u{i}") for i in range(lists.size)], dtype=np.uint64)
    w = poisson_weights(keys, 4000).astype(np.float64)
    n = float(lists.sum())
    kish = n * n / float(np.sum(lists.astype(np.float64) ** 2))
    estimate = float(effective_users(n, lists.astype(np.float64) @ w))
    assert estimate == pytest.approx(kish, rel=0.05)
    # every list its own user: n; no replicate moved: +inf (nothing to say)
    assert float(effective_users(3.0, np.array([3.0, 3.0]))) == math.inf


def test_one_users_lists_give_no_clustered_interval_band_or_cusum_step() -> None:
    y = np.random.default_rng(0).random(200)
    one = np.full(200, user_cluster("crawler"), dtype=np.uint64)
    interval = BootstrapState.of(one, y).interval()
    assert math.isnan(interval.low) and math.isnan(interval.high)  # was a zero-width interval
    crowd = BootstrapState.of(np.arange(200, dtype=np.uint64), y).interval()
    assert crowd.half_width > 0
    control, treatment = sums_of(y[:100], ["a"] * 100), sums_of(y[100:], ["b"] * 100)
    bound = confidence_sequence(control, treatment)
    assert math.isnan(bound.low) and bound.clustered and bound.p_value == 1.0
    assert math.isnan(standardized(contrast(control, treatment))[0])  # the CUSUM skips it
    assert math.isnan(mean_variance(treatment)[0])  # an interleaving preference alike
    many = sums_of(y[100:], [f"u{i}" for i in range(100)])
    assert users_worth(many) >= MIN_USERS
    assert math.isfinite(
        confidence_sequence(sums_of(y[:100], [f"v{i}" for i in range(100)]), many).low
    )


def users_worth(sums: ClusterSums) -> float:
    """``effective_users`` of the lists of ``sums`` (whose replicates are known)."""
    assert sums.weights is not None
    return float(effective_users(sums.moments.n, sums.weights))


def worth(sums: np.ndarray, arm: int) -> list[float]:
    """Per stream, the users ``arm``'s lists over the whole stream are worth."""
    return [users_worth(row) for row in sums_of_rows(sums[arm, :, 0].sum(axis=1))]


def test_lists_that_are_each_their_own_user_are_never_withheld_for_the_estimates_noise() -> None:
    """Kish's number is estimated (±14% at B = 100): 30 lists of 30 users were withheld in
    46% of windows by a bare ``< 30``; fewer than half the lists is the second condition."""
    rng = np.random.default_rng(8)
    for n in (30, 34, 40):
        for _ in range(100):
            keys = rng.integers(1, 2**63, n, dtype=np.uint64)
            y = rng.random(n)
            assert math.isfinite(BootstrapState.of(keys, y).interval().low)
            users = [f"{n}-{i}-{rng.integers(1 << 40)}" for i in range(n)]
            assert math.isfinite(mean_variance(sums_of(y, users))[0])
    five = sums_of(rng.random(60), [f"u{i % 5}" for i in range(60)])  # 12 lists each
    assert five.few_users() and math.isnan(mean_variance(five)[0])
    twenty = sums_of(rng.random(60), [f"u{i % 20}" for i in range(60)])  # 3 lists each
    assert not twenty.few_users() and math.isfinite(mean_variance(twenty)[0])


def limit(rate: float, streams: int = STREAMS) -> float:
    return rate + 3 * math.sqrt(rate * (1 - rate) / streams)


def test_a_crawler_in_the_small_arm_does_not_flag_an_aa_comparison() -> None:
    traffic = Traffic(strength=0.2, segments=1, treatment_share=0.1, heavy_user=10_000)
    sums = simulate(traffic, STREAMS, 31)
    flagged = float((sequence_flags(sums, ALPHA, 5000.0) > 0).mean())
    alarmed = float((cusum_alarms(sums) > 0).mean())
    assert flagged <= limit(ALPHA) and alarmed <= limit(0.0297), (flagged, alarmed)
    assert max(worth(sums, 1)) < MIN_USERS < min(worth(sums, 0))  # the crawler's arm
    # the negative control: the same streams at list level (lists independent) are flagged
    assert (sequence_flags(sums, ALPHA, 5000.0, list_level=True) > 0).mean() > 0.5


@pytest.mark.parametrize(("share", "banded"), [(0.1, 1.0), (0.02, 0.6)])
def test_unequal_splits_keep_their_bands_and_stay_within_alpha(share: float, banded: float) -> None:
    """The guard leaves the small arm its band, unless (at 2%: about 100 users with
    heavy-tailed lists) one of its users holds much of it: 68% of streams keep it there."""
    sums = simulate(Traffic(strength=0.2, segments=1, treatment_share=share), STREAMS, 32)
    assert np.mean(np.array(worth(sums, 1)) >= MIN_USERS) >= banded
    assert (sequence_flags(sums, ALPHA, 5000.0) > 0).mean() <= limit(ALPHA)
    assert (sequence_flags(sums, ALPHA, 5000.0, list_level=True) > 0).mean() > limit(ALPHA)


def test_the_cusum_of_a_ten_percent_arm_of_ordinary_traffic_holds_its_run_length() -> None:
    """The 10% arm's windows (~80 lists worth ~20 users, no heavy user) step; standardized by
    their own variance, which moves with their mean, the CUSUM against control alarmed in 11%
    of A/A streams (its run length promising 3%). By the stream's pooled variance and the
    stream's correlation between windows: within the limit (3.7% over 750 streams)."""
    sums = simulate(Traffic(strength=0.2, segments=1, treatment_share=0.1), STREAMS, 32)
    assert (cusum_alarms(sums) > 0).mean() <= limit(0.0297)
    # the negative control: the same windows, each standardized by its own variance
    assert np.mean([own_variance_cusum(sums[:, i, 0]).alarmed for i in range(STREAMS)]) > limit(
        0.0297
    )


def own_variance_cusum(windows: np.ndarray) -> Cusum:
    """A stream's CUSUM against control with z = Δ/√V of each window's own contrast (2 arms,
    windows, columns): the step before the pooled variance."""
    state = Cusum()
    for c, t in zip(sums_of_rows(windows[0]), sums_of_rows(windows[1]), strict=True):
        z, replicates = standardized(contrast(c, t))
        state = state.step(z, min(c.n, t.n), replicates=replicates)
    return state


def test_ordinary_heavy_tailed_traffic_keeps_every_window_and_its_power() -> None:
    """1,500 users over 34 windows and 2 surfaces: ~66 lists per arm, surface and window, worth
    ~27 users. Almost no window is withheld (1 of 13,600), A/A stays within the run length's
    share, and a 30% drop from window 18 alarms in 91% of streams (95.5% by each window's own
    variance, which also alarmed more in A/A; a guard at 30 users withheld 63% of the windows
    and alarmed in 6%)."""
    aa = simulate(Traffic(users=1500, strength=0.2), 100, 9)
    replicates = (aa.shape[-1] - 4) // 2
    assert few_users(aa[..., 0], aa[..., 4 + replicates :]).mean() < 0.001
    assert (cusum_alarms(aa) > 0).mean() <= limit(0.0297, 100)
    drop = simulate(Traffic(users=1500, strength=0.2, shift=0.3, shift_at=17), 100, 9)
    assert (cusum_alarms(drop) > 0).mean() >= 0.9


def test_the_cusum_of_a_small_arm_with_users_enough_holds_its_run_length() -> None:
    """At four times the users a 10% arm's windows (~330 lists) are worth over 30 users: the
    CUSUM against control steps in every window and alarms within 3 SE of its run length's
    share (6% of 100 A/A streams; 4.3% of 300 with another seed; 16% at list level)."""
    sums = simulate(Traffic(users=20_000, strength=0.2, segments=1, treatment_share=0.1), 100, 33)
    replicates = (sums.shape[-1] - 4) // 2
    small = sums[1, :, 0]  # (streams, windows, columns)
    assert (effective_users(small[..., 0], small[..., 4 + replicates :]) >= MIN_USERS).all()
    assert (cusum_alarms(sums) > 0).mean() <= 0.0297 + 3 * math.sqrt(0.0297 * 0.97 / 100)
    assert (cusum_alarms(sums, list_level=True) > 0).mean() > 0.0297 + 3 * math.sqrt(0.03 / 100)


def test_few_replicates_withhold_nothing_and_enough_still_withhold_a_crawler() -> None:
    """Kish's number from B replicates has relative sd √(2/B): at B = 5 the guard withheld 8%
    of windows of 20 independent lists (B = 10: 3%). Below MIN_REPLICATES it is off; at
    MIN_REPLICATES one user's lists are still withheld."""
    rng = np.random.default_rng(12)
    withheld = []
    for replicates in (5, 10):
        for _ in range(200):
            keys = rng.integers(1, 2**63, 20, dtype=np.uint64)
            w = poisson_weights(keys, replicates).astype(np.float64)
            withheld.append(bool(few_users(20.0, w.sum(axis=0))))
    assert not any(withheld)
    crawler = sums_of(
        rng.random(200), ["crawler"] * 190 + [f"u{i}" for i in range(10)], MIN_REPLICATES
    )
    assert crawler.few_users() and math.isnan(mean_variance(crawler)[0])
    assert not sums_of(rng.random(200), ["crawler"] * 200, MIN_REPLICATES - 1).few_users()
