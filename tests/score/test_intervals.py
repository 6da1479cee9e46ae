"""`evald score --mean`'s interval: Wilson for binary measures, Wilson with the effective
sample size for other bounded ones, the t interval for unbounded ones; checked against scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from evald.score.intervals import mean_interval, wilson

Z = stats.norm.ppf(0.975)


def _sums(values: np.ndarray) -> tuple[int, float, float]:
    return len(values), float(values.mean()), float(np.square(values - values.mean()).sum())


def _interval(values: list[float] | np.ndarray, span: tuple[float, float] | None = (0.0, 1.0)):
    array = np.asarray(values, dtype=np.float64)
    interior = 0 if span is None else int(np.count_nonzero((array > span[0]) & (array < span[1])))
    return mean_interval(*_sums(array), span=span, interior=interior)


@pytest.mark.parametrize(("k", "n"), [(0, 5), (1, 5), (3, 3), (7, 12), (50, 51), (400, 1000)])
def test_wilson_is_scipys(k: int, n: int) -> None:
    want = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson(k / n, n, Z) == pytest.approx((want.low, want.high), abs=1e-12)


def test_a_binary_measure_gets_the_wilson_interval_of_its_successes() -> None:
    values = [1.0] * 28 + [0.0] * 2
    want = stats.binomtest(28, 30).proportion_ci(confidence_level=0.95, method="wilson")
    assert _interval(values) == pytest.approx((want.low, want.high), abs=1e-12)


def _score_ends(p: float, effective: float) -> tuple[float, float]:
    """The two roots in [0, 1] of (p − μ)² = z² μ(1 − μ) / n*, found numerically."""

    def gap(mu: float) -> float:
        return (p - mu) ** 2 - Z * Z * mu * (1 - mu) / effective

    return optimize.brentq(gap, 0.0, p), optimize.brentq(gap, p, 1.0)


def test_a_graded_measure_gets_the_score_interval_of_its_effective_sample_size() -> None:
    rng = np.random.default_rng(3)
    values = rng.beta(6, 2, size=40)
    p, sem = values.mean(), stats.sem(values)
    effective = p * (1 - p) / sem**2 * (Z / stats.t.ppf(0.975, len(values) - 1)) ** 2
    assert _interval(values) == pytest.approx(_score_ends(p, effective), abs=1e-10)


def test_with_many_queries_inside_the_range_it_is_the_t_interval() -> None:
    values = np.random.default_rng(5).beta(5, 3, size=20_000)
    t = stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=stats.sem(values))
    assert _interval(values) == pytest.approx(t, abs=2e-4)


def test_few_queries_near_a_bound_stay_inside_it_where_the_t_interval_does_not() -> None:
    rr = [1.0, 1.0, 0.2]  # RR of three queries
    _, t_high = stats.t.interval(0.95, 2, loc=np.mean(rr), scale=stats.sem(rr))
    assert t_high > 1.5  # the t interval: a mean of RR above 1.5
    low, high = _interval(rr)
    assert 0.0 <= low < np.mean(rr) < high <= 1.0


def test_an_unbounded_measure_keeps_the_t_interval() -> None:
    counts = [3.0, 10.0, 7.0, 0.0, 12.0]
    want = stats.t.interval(0.95, 4, loc=np.mean(counts), scale=stats.sem(counts))
    assert _interval(counts, span=None) == pytest.approx(want, abs=1e-12)


def test_a_range_other_than_the_unit_interval_is_rescaled() -> None:
    tau = np.array([0.9, 1.0, 0.8, 1.0, 0.95])  # KendallTau in [-1, 1]
    low, high = _interval(tau, span=(-1.0, 1.0))
    rescaled = _interval((tau + 1) / 2)
    assert rescaled is not None
    assert (low, high) == pytest.approx((2 * rescaled[0] - 1, 2 * rescaled[1] - 1), abs=1e-12)
    assert high <= 1.0


def test_fewer_than_two_values_or_no_spread() -> None:
    assert _interval([0.4]) is None
    assert _interval([0.4, 0.4, 0.4]) == pytest.approx((0.4, 0.4), abs=1e-15)


def test_coverage_near_a_bound_with_few_queries() -> None:
    """Seeded simulation: RR over 5 queries, the first relevant document at rank 1 with
    probability 0.85, else at rank 2-5 (true mean 0.898). The interval covers the true mean
    at least about 95% of the time and never leaves [0, 1]; the t interval (the negative
    control) reaches past 1 in a good share of the runs and covers less."""
    rng = np.random.default_rng(11)
    ranks = np.array([1, 2, 3, 4, 5])
    probs = np.array([0.85, 0.05, 0.04, 0.03, 0.03])
    truth, runs, n = float(probs @ (1 / ranks)), 1500, 5
    covered = covered_t = outside_t = 0
    for _ in range(runs):
        values = 1 / rng.choice(ranks, size=n, p=probs)
        low, high = _interval(values)
        assert 0.0 <= low <= high <= 1.0
        covered += low <= truth <= high
        half = stats.t.ppf(0.975, n - 1) * stats.sem(values)
        covered_t += abs(values.mean() - truth) <= half
        outside_t += values.mean() + half > 1.0
    assert covered / runs >= 0.94, covered / runs
    assert covered_t / runs < covered / runs
    assert outside_t / runs > 0.3, outside_t / runs


def test_each_measure_has_the_range_of_its_values() -> None:
    from evald.metrics import parse_measure, value_range

    assert value_range(parse_measure("RR")) == (0.0, 1.0)
    assert value_range(parse_measure("nDCG(gains={0:0,1:1,2:3})@10")) == (0.0, 1.0)
    assert value_range(parse_measure("KendallTau")) == (-1.0, 1.0)
    assert value_range(parse_measure("GMAP")) == (math.log(0.00001), 0.0)
    for unbounded in ("NumRet", "NumRel", "NumRelRet", "DCG@5", "CG@5", "nDCG(gains={0:-1,1:1})"):
        assert value_range(parse_measure(unbounded)) is None, unbounded
