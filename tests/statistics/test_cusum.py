"""The lower CUSUM: run lengths as Siegmund predicts, blind to traffic, deaf below the minimum n."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from evald.statistics.clustered import contrast, sums_of_rows
from evald.statistics.cusum import (
    POOL_HALF_LIFE,
    Cusum,
    cusum_update,
    difference_z,
    forgetting,
    run_statistic,
    siegmund_arl,
    standardized_z,
    stream_correlation,
)
from evald.statistics.intervals import Moments
from evald.statistics.simulation import Traffic, cusum_alarms, simulate


def _run_lengths(runs: int, k: float, h: float, drop: float, seed: int) -> np.ndarray:
    """Windows until C > h for ``runs`` chains of z ~ N(−drop, 1), via the module's update."""
    rng = np.random.default_rng(seed)
    statistic = np.zeros(runs)
    length = np.zeros(runs, dtype=np.int64)
    alive = np.ones(runs, dtype=bool)
    t = 0
    while alive.any():
        t += 1
        statistic = np.where(alive, cusum_update(statistic, rng.normal(-drop, 1.0, runs), k), 0)
        fired = alive & (statistic > h)
        length[fired] = t
        alive &= ~fired
    return length


@pytest.mark.parametrize("h", [4.0, 5.0])
def test_false_alarm_run_length_matches_siegmund(h: float) -> None:
    lengths = _run_lengths(1000, 0.5, h, 0.0, seed=int(h))
    assert lengths.mean() == pytest.approx(siegmund_arl(0.5, h), rel=0.10)


@pytest.mark.parametrize("h", [4.0, 5.0])
def test_detection_delay_for_a_one_standard_error_drop(h: float) -> None:
    lengths = _run_lengths(2000, 0.5, h, 1.0, seed=10 + int(h))
    assert lengths.mean() == pytest.approx(siegmund_arl(0.5, h, drop=1.0), rel=0.10)


def test_siegmund_values_of_the_shared_table() -> None:
    assert siegmund_arl(0.5, 4.0) == pytest.approx(338, abs=1)
    assert siegmund_arl(0.5, 4.0, 1.0) == pytest.approx(8.34, abs=0.01)
    assert siegmund_arl(0.5, 5.0) == pytest.approx(938, abs=1)
    assert siegmund_arl(0.5, 5.0, 1.0) == pytest.approx(10.34, abs=0.01)
    assert siegmund_arl(0.5, 5.0, 0.5) == pytest.approx(6.166**2)
    # a threshold far past any alarm: a run length too long for a double, not an OverflowError
    assert siegmund_arl(0.5, 1000.0) == math.inf
    assert siegmund_arl(0.5, 1000.0, 1.0) == pytest.approx((1001.166 - 1) / 0.5)


def test_windows_below_the_minimum_n_never_move_it() -> None:
    state = Cusum()
    for _ in range(50):
        state = state.step(-100.0, n=29, min_n=30)
        state = state.step(math.nan, n=500, min_n=30)
    assert state == Cusum()
    state = state.step(-100.0, n=30, min_n=30)
    assert state.alarmed and state.alarm_window == 1
    assert Cusum.from_json(json.loads(json.dumps(state.to_json()))) == state


def _zero_heavy(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A skewed measure: 0 for 60% of lists, else U² (cheap to draw)."""
    u = rng.random(shape)
    return np.where(u < 0.6, 0.0, np.square((u - 0.6) / 0.4))


def _alarm_share(traffic: list[int], runs: int, seed: int, stale_n: int | None = None) -> float:
    """Share of runs whose CUSUM (k 0.5, h 5) on treatment − control (``Cusum.step_contrast``)
    alarms; A/A data, window w holding traffic[w] lists per arm. ``stale_n`` standardizes each
    window's own z by a fixed n instead (the negative control)."""
    rng = np.random.default_rng(seed)
    states = [Cusum() for _ in range(runs)]
    for n in traffic:
        y = _zero_heavy(rng, (runs, 2, n))
        se = np.sqrt(y.var(axis=2, ddof=1).sum(axis=1) / n)
        z = (y[:, 1].mean(axis=1) - y[:, 0].mean(axis=1)) / se
        assert z[0] == pytest.approx(difference_z(Moments.of(y[0, 0]), Moments.of(y[0, 1])))
        if stale_n is not None:
            z *= math.sqrt(stale_n / n)
            states = [state.step(float(z_r), n) for state, z_r in zip(states, z, strict=True)]
        else:  # the daemon's step: the difference and its variance, standardized by the stream's
            pairs = zip(states, z * se, se * se, strict=True)
            states = [state.step_contrast(float(d), float(v), n, n) for state, d, v in pairs]
    return sum(s.alarmed for s in states) / runs


def test_a_traffic_change_with_an_unchanged_mean_does_not_alarm() -> None:
    """Traffic falls 12.5-fold half-way: the alarm share stays what steady traffic gives, while
    standardizing by the old traffic (as a fixed ratio or fixed-n bound does) alarms nearly
    always."""
    runs, steady = 300, [400] * 100
    changed = [400] * 50 + [16 * 2] * 50
    base = _alarm_share(steady, runs, seed=1)
    after = _alarm_share(changed, runs, seed=2)
    assert abs(after - base) <= 3 * math.sqrt(2 * 0.1 * 0.9 / runs) + 0.02, (base, after)
    assert after <= 0.2
    assert _alarm_share(changed, 100, seed=3, stale_n=400) > 0.9


def test_standardized_z_against_a_known_baseline() -> None:
    window = Moments.of([0.2, 0.4, 0.6, 0.8])
    assert standardized_z(window, 0.4, 0.2) == pytest.approx((0.5 - 0.4) / (0.2 / 2))
    assert math.isnan(standardized_z(Moments(), 0.4, 0.2))
    assert math.isnan(difference_z(Moments.of([0.5]), window))


def test_the_run_statistic_is_pages_recursion_when_the_run_is_no_more_varied_than_m() -> None:
    """Replicates whose run variance stays at most m (here: none): the same statistic,
    alarm and reset points as Page's recursion; without replicates, the recursion itself."""
    rng = np.random.default_rng(4)
    page, run, plain = Cusum(), Cusum(), Cusum()
    replicates = np.zeros(100)
    for z in rng.normal(-0.3, 1.0, 300):
        page = page.step(float(z), 100)
        run = run.step(float(z), 100, replicates=replicates)
        plain = plain.step(float(z), 100, replicates=None)
        assert run.statistic == pytest.approx(page.statistic, abs=1e-9)
        assert plain.statistic == page.statistic
    assert run.alarm_window == page.alarm_window is not None
    assert plain.run_replicates is None and run.run_replicates is not None


def test_a_run_of_windows_that_move_together_counts_as_one() -> None:
    """Every window's replicate deviations equal (the same users drive them all): the run's
    variance is m², so m windows of z = −1 weigh √m, not m."""
    zeta = np.random.default_rng(5).choice([-1.0, 1.0], 100)  # mean square 1
    state = Cusum()
    for m in range(1, 9):
        state = state.step(-1.0, 100, k=0.0, replicates=zeta)
        assert state.statistic == pytest.approx(m / math.sqrt(m), rel=1e-12)
    independent = Cusum()
    for _ in range(8):
        independent = independent.step(-1.0, 100, k=0.0)
    assert independent.statistic == pytest.approx(8.0)


def test_the_run_state_round_trips_and_an_old_state_reads_without_it() -> None:
    state = Cusum().step(-2.0, 100, replicates=np.linspace(-1, 1, 100))
    assert Cusum.from_json(json.loads(json.dumps(state.to_json()))) == state
    old = Cusum.from_json({"statistic": 1.5, "windows": 3, "alarm_window": None})
    assert old == Cusum(1.5, 3, None) and old.run_replicates is None


def test_a_contrast_of_steady_variance_steps_as_its_own_z() -> None:
    """Every window with the same variance and lists: the pooled variance is the window's, so
    the contrast step is Page's recursion on Δ/√V (without replicates) to rounding."""
    rng = np.random.default_rng(6)
    page, pooled = Cusum(), Cusum()
    for d in rng.normal(-0.01, 0.02, 200):
        page = page.step(float(d) / 0.02, 100)
        pooled = pooled.step_contrast(float(d), 0.02**2, 100, 100)
        assert pooled.statistic == pytest.approx(page.statistic, rel=1e-9, abs=1e-12)
    assert pooled.alarm_window == page.alarm_window is not None
    assert pooled.pooled_windows == 200 and pooled.stream_replicates is None


def test_a_window_is_standardized_by_the_streams_variance_not_its_own() -> None:
    """A window whose own variance came out a hundredth of the stream's (few users, all alike)
    weighs by the stream's: a drop of one pooled SE stays one SE, not ten."""
    state = Cusum()
    for _ in range(99):
        state = state.step_contrast(0.0, 1.0, 50, 50, k=0.0, half_life=math.inf)
    state = state.step_contrast(-1.0, 0.01, 50, 50, k=0.0, half_life=math.inf)
    assert state.statistic == pytest.approx(1.0 / math.sqrt(99.01 / 100), rel=1e-12)
    assert Cusum().step(-1.0 / math.sqrt(0.01), 50, k=0.0).statistic == pytest.approx(10.0)


def test_a_window_more_varied_than_the_stream_weighs_by_its_own_and_the_pool_forgets() -> None:
    """A window whose own variance is 4 times the stream's weighs by its own (a drop of 2 own
    SE counts 1); 24 windows later the stream's variance is half what it was."""
    steady = Cusum()
    for _ in range(1000):
        steady = steady.step_contrast(0.0, 1.0, 50, 50, k=0.0)
    assert steady.step_contrast(-2.0, 4.0, 50, 50, k=0.0).statistic == pytest.approx(1.0)
    state = steady
    for _ in range(24):
        state = state.step_contrast(0.0, 2.0, 50, 50, k=0.0)
    assert state.variance_sum / state.scale_sum * 0.04 == pytest.approx(1.5, rel=0.02)


def test_the_streams_correlation_between_windows() -> None:
    """Windows whose replicate deviations are all alike correlate at 1; independent ones at
    about 0; one window says nothing."""
    zeta = np.random.default_rng(7).choice([-1.0, 1.0], 100)
    assert float(stream_correlation(8 * zeta, 8.0, 8.0, 8)) == pytest.approx(1.0)
    independent = np.random.default_rng(8).normal(0.0, 1.0, (8, 4000)).sum(axis=0)
    assert float(stream_correlation(independent, 8.0, 8.0, 8)) == pytest.approx(0.0, abs=0.01)
    assert float(stream_correlation(zeta, 1.0, 1.0, 1)) == 0.0
    # a run of m windows correlating at 1 weighs √m, not m, even where its replicates say less
    assert float(run_statistic(-4.0, 4, np.zeros(100), 0.0, 1.0)) == pytest.approx(2.0)


def test_the_pooled_state_restores_exactly() -> None:
    """A checkpoint taken after any window, read back, continues bit for bit as the original."""
    rng = np.random.default_rng(9)
    windows = [
        (float(rng.normal(-0.01, 0.02)), float(rng.uniform(2e-4, 6e-4)), int(rng.integers(40, 90)))
        for _ in range(40)
    ]
    replicates = rng.normal(0.0, 0.02, (40, 100))
    state = Cusum()
    for i, (d, v, n) in enumerate(windows):
        restored = Cusum.from_json(json.loads(json.dumps(state.to_json())))
        assert restored == state
        state = state.step_contrast(d, v, n, 9 * n, replicates=replicates[i])
        assert restored.step_contrast(d, v, n, 9 * n, replicates=replicates[i]) == state
    assert state.pooled_windows == 40 and state.stream_replicates is not None


def _first_alarm(windows: np.ndarray, k: float, h: float) -> int:
    """The window (from 1; 0: none) at which one stream's CUSUM against control, folded as the
    daemon folds it, first alarms (2 arms, windows, columns)."""
    state = Cusum()
    rows = zip(sums_of_rows(windows[0]), sums_of_rows(windows[1]), strict=True)
    for i, (c, t) in enumerate(rows, 1):
        w = contrast(c, t)
        state = state.step_contrast(w.difference, w.variance, c.n, t.n, k, h, 30, w.replicates)
        if state.alarmed:
            return i
    return 0


@pytest.mark.parametrize("list_level", [False, True])
def test_the_simulations_array_form_steps_as_step_contrast(list_level: bool) -> None:
    """The figures of docs/statistics.md come from simulation.cusum_alarms: on A/A streams and
    streams with a drop, each alarms at the window ``Cusum.step_contrast`` alarms at."""
    aa = simulate(Traffic(users=1500, strength=0.2, windows=40), 3, 9)
    drop = simulate(Traffic(users=1500, strength=0.2, windows=40, shift=0.2, shift_at=5), 3, 9)
    sums = np.concatenate([aa, drop], axis=1)
    if list_level:
        sums = sums[..., :3]
    for h in (1.0, 3.0, 5.0):
        array = cusum_alarms(sums, k=0.25, h=h)
        stepped = [
            [_first_alarm(sums[:, i, j], 0.25, h) for j in range(sums.shape[2])]
            for i in range(sums.shape[1])
        ]
        assert array.tolist() == stepped
    assert (array > 0).any()


def test_the_correlation_counts_only_windows_with_replicates() -> None:
    """Windows correlating at 0.2: the stream's ρ says about 0.2 whether or not a window
    without replicates follows each, and after 1000 windows without any (replicates began:
    pooled afresh). It said 0.045 and 0.0005 when those windows counted."""
    rng = np.random.default_rng(2)
    shared = rng.normal(size=100)

    def correlated() -> np.ndarray:
        return math.sqrt(0.2) * shared + math.sqrt(0.8) * rng.normal(size=100)

    mixed, late = Cusum(), Cusum()
    for _ in range(1000):
        late = late.step_contrast(0.0, 1.0, 100, 100)
    for _ in range(200):
        mixed = mixed.step_contrast(0.0, 1.0, 100, 100, replicates=correlated())
        mixed = mixed.step_contrast(0.0, 1.0, 100, 100)
        late = late.step_contrast(0.0, 1.0, 100, 100, replicates=correlated())
    for state in (mixed, late):
        sums = (state.replicate_variance, state.replicate_sd, state.replicate_windows)
        assert 0.1 < float(stream_correlation(state.stream_replicates, *sums)) < 0.3
    assert late.replicate_windows == late.pooled_windows == 200


def test_a_window_without_replicates_in_a_run_keeps_the_streams_correlation() -> None:
    """Windows moving as one (ρ = 1): a sixth window of the run without replicates counts as
    the run's correlation says, √6 for 6 drops of one SE, as with its replicates (ρ = 0 made
    it 6·√(6/25)), but for the correlation's fading by one window (2^(−1/24))."""
    alike = np.random.default_rng(3).choice([-1.0, 1.0], 100)
    state = Cusum()
    for _ in range(5):
        state = state.step_contrast(-1.0, 1.0, 100, 100, k=0.0, replicates=alike)
    assert state.statistic == pytest.approx(math.sqrt(5))
    without = state.step_contrast(-1.0, 1.0, 100, 100, k=0.0)
    with_them = state.step_contrast(-1.0, 1.0, 100, 100, k=0.0, replicates=alike)
    assert with_them.statistic == pytest.approx(math.sqrt(6))
    faded = 6 * math.sqrt(6 / (6 * (1 + 5 * forgetting(POOL_HALF_LIFE))))
    assert without.statistic == pytest.approx(faded) and faded == pytest.approx(math.sqrt(6), 0.02)


def test_replicates_that_stopped_floor_the_runs_after_them_less_and_less() -> None:
    """Windows moving as one (ρ = 1), then the replicates stop (a restart with
    ``bootstrap_replicates: 0``, users without ids): their correlation fades as the pool does,
    so after 10 half-lives six drops of one SE are Page's 6 again. Frozen, ρ stayed 1 for ever
    and the same drops scored √6 ≈ 2.45, whatever the windows since."""
    alike = np.random.default_rng(3).choice([-1.0, 1.0], 100)
    state = Cusum()
    for _ in range(50):
        state = state.step_contrast(0.0, 1.0, 100, 100, replicates=alike)
    for _ in range(10 * int(POOL_HALF_LIFE)):
        state = state.step_contrast(0.0, 1.0, 100, 100)
    assert state.replicate_gap == 10 * POOL_HALF_LIFE
    assert Cusum.from_json(json.loads(json.dumps(state.to_json()))) == state
    for _ in range(6):
        state = state.step_contrast(-1.0, 1.0, 100, 100, k=0.0)
    assert state.statistic == pytest.approx(6.0, rel=0.01)
