"""Student-t intervals from mergeable sums: equal to scipy, NaN below the minimum n, additive."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from evald.statistics.intervals import Moments, t_interval, t_quantile
from evald.statistics.sequential import confidence_sequence
from evald.stats import mean_ci95


@pytest.mark.parametrize("level", [0.8, 0.95, 0.99])
@pytest.mark.parametrize("size", [2, 30, 31, 1000])
def test_equals_scipy_t_interval(size: int, level: float) -> None:
    y = np.random.default_rng(size).beta(0.5, 2.0, size)
    interval = t_interval(Moments.of(y), level=level, min_n=2)
    low, high = stats.t.interval(level, size - 1, loc=y.mean(), scale=stats.sem(y))
    assert interval.low == pytest.approx(low, abs=1e-9)
    assert interval.high == pytest.approx(high, abs=1e-9)
    assert interval.mean == pytest.approx(y.mean(), abs=1e-12)


def test_nan_below_the_minimum_n_and_undefined_values_skipped() -> None:
    y = np.r_[np.linspace(0, 1, 29), np.nan]
    small = t_interval(Moments.of(y), min_n=30)
    assert small.n == 29 and math.isnan(small.low) and math.isnan(small.high)
    assert small.mean == pytest.approx(0.5)
    assert math.isnan(t_interval(Moments()).mean)
    assert not math.isnan(t_interval(Moments.of(np.r_[y, 0.5]), min_n=30).low)


def test_variance_keeps_precision_off_zero_mean() -> None:
    y = 1000.0 + np.random.default_rng(1).normal(0, 1, 10000)
    assert Moments.of(y).variance == pytest.approx(np.var(y, ddof=1), rel=1e-7)


def test_overflowed_sums_give_no_interval_rather_than_one_of_width_zero() -> None:
    """Σy² of values near 1e200 is +inf and Σy²/n − (Σy)²/n² is inf − inf: NaN, which
    max(0, ·) used to turn into a variance of 0 — an interval of width 0 and a comparison
    certain of its difference (p = 0)."""
    y = 1e200 * (1.0 + np.random.default_rng(2).random(200))
    with np.errstate(over="ignore"):
        huge, other = Moments.of(y), Moments.of(1.1 * y)
    assert math.isnan(huge.variance) and math.isnan(t_interval(huge).low)
    assert math.isnan(mean_ci95(huge.n, huge.total, huge.squares)[1])
    bound = confidence_sequence(huge, other)
    assert math.isnan(bound.low) and bound.p_value == 1.0
    assert Moments.of(np.full(50, 0.25)).variance == 0.0  # constant values: width 0, rightly


@given(
    st.lists(st.floats(0, 1, allow_nan=False), min_size=0, max_size=60),
    st.lists(st.integers(0, 4), min_size=60, max_size=60),
)
def test_any_partitioning_gives_the_same_state(values: list[float], parts: list[int]) -> None:
    y = np.asarray(values)
    owner = np.asarray(parts[: y.size], dtype=int)
    merged = Moments()
    for p in (3, 1, 4, 0, 2):  # any order
        merged = merged + Moments.of(y[owner == p])
    whole = Moments.of(y)
    assert merged.n == whole.n
    assert merged.total == pytest.approx(whole.total, abs=1e-9)
    assert merged.squares == pytest.approx(whole.squares, abs=1e-9)


def test_json_round_trip() -> None:
    state = Moments.of([0.1, 0.5, 0.25])
    assert Moments.from_json(json.loads(json.dumps(state.to_json()))) == state


@pytest.mark.parametrize(("q", "dof"), [(0.975, 1), (0.975, 29), (0.95, 1000), (0.995, 123_456)])
def test_cached_t_quantile_is_scipys(q: float, dof: int) -> None:
    # computed once per (q, dof) for the scrape's sake; the value must stay scipy's exactly
    assert t_quantile(q, dof) == float(stats.t.ppf(q, dof))
    assert t_quantile(q, dof) == float(stats.t.ppf(q, dof))
