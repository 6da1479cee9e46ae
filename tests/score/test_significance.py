"""Paired tests and corrections equal scipy (and ranx, which calls scipy for its t-test)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ranx.statistical_tests import paired_student_t_test
from scipy import stats

from evald.score.significance import bonferroni, holm, paired_t, randomization

#: per-query values as measures give them: often exactly equal, often simple fractions
value = st.one_of(st.floats(0, 1), st.integers(0, 12).map(lambda k: k / 12))
values = st.lists(st.tuples(value, value), min_size=2, max_size=9).map(
    lambda pairs: (np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]))
)


def mean_difference(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    return np.mean(x - y, axis=axis)


@pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")  # scipy, near ties
@settings(max_examples=200, deadline=None)
@given(pair=values)
def test_paired_t_equals_scipy_and_ranx(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = pair
    t, p = paired_t(a, b)
    expected = stats.ttest_rel(b, a)
    if math.isnan(expected.pvalue):
        assert math.isnan(p)
        return
    assert t == pytest.approx(expected.statistic, rel=1e-9, abs=1e-9)
    assert p == pytest.approx(expected.pvalue, rel=1e-9, abs=1e-12)
    assert p == pytest.approx(paired_student_t_test(a, b)[0], rel=1e-9, abs=1e-12)


def exact_p(d: list[Fraction]) -> float:
    """The exact two-sided p-value in exact arithmetic: every sign pattern, sums as fractions."""
    observed = sum(d)
    nulls = [
        sum(v if not (code >> i) & 1 else -v for i, v in enumerate(d))
        for code in range(2 ** len(d))
    ]
    less = sum(s <= observed for s in nulls) / len(nulls)
    greater = sum(s >= observed for s in nulls) / len(nulls)
    return min(1.0, 2 * min(less, greater))


twelfths = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=2, max_size=9)


@settings(max_examples=100, deadline=None)
@given(pairs=twelfths)
def test_exact_randomization_counts_ties_as_exact_arithmetic_does(
    pairs: list[tuple[int, int]],
) -> None:
    """Per-query values such as 1/3, 5/12 and 1/12 make sign patterns tie exactly (5/12 =
    1/3 + 1/12): those ties are counted as ties, whatever the rounding of the float sums."""
    a = np.array([x / 12 for x, _ in pairs])
    b = np.array([y / 12 for _, y in pairs])
    ours = randomization(a, b, permutations=2 ** len(a), seed=0)
    assert ours.exact and ours.permutations == 2 ** len(a)
    assert ours.p == exact_p([Fraction(y - x, 12) for x, y in pairs])


@pytest.mark.parametrize("seed", range(20))
def test_exact_randomization_equals_scipys_exact_permutation_test(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 13))
    a = rng.random(n)
    b = a + rng.normal(0.0, 0.2, n)
    ours = randomization(a, b, permutations=10_000, seed=0)
    expected = stats.permutation_test(
        (b, a), mean_difference, permutation_type="samples", n_resamples=np.inf
    )
    assert ours.exact
    assert ours.p == pytest.approx(expected.pvalue, abs=1e-12)


def test_sampled_randomization_is_seeded_and_close_to_the_exact_value() -> None:
    rng = np.random.default_rng(7)
    a = rng.random(16)
    b = a + rng.normal(0.05, 0.2, 16)
    exact = randomization(a, b, permutations=2**16, seed=0)
    sampled = randomization(a, b, permutations=5000, seed=1)
    assert exact.exact and not sampled.exact and sampled.permutations == 5000
    assert sampled == randomization(a, b, permutations=5000, seed=1)
    assert sampled != randomization(a, b, permutations=5000, seed=2)
    # 5000 draws: the standard error of a p-value near 0.3 is about 0.0065
    assert abs(sampled.p - exact.p) < 0.03
    scipy_sampled = stats.permutation_test(
        (b, a), mean_difference, permutation_type="samples", n_resamples=5000, rng=1
    )
    assert abs(sampled.p - scipy_sampled.pvalue) < 0.04


def test_sampled_p_value_is_never_zero() -> None:
    a = np.zeros(40)
    b = np.ones(40)
    result = randomization(a, b, permutations=999, seed=0)
    assert result.p == pytest.approx(2 / 1000)


def test_corrections_on_a_worked_example() -> None:
    # Holm: sorted 0.01, 0.03, 0.04, 0.2 -> 4*0.01, 3*0.03, max(2*0.04, 0.09), 0.2
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert bonferroni([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.16, 0.12, 0.8])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    nan_kept = holm([math.nan, 0.02])
    assert math.isnan(nan_kept[0]) and nan_kept[1] == 0.02


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=10))
def test_holm_lies_between_the_raw_p_and_bonferroni_and_keeps_the_order(ps: list[float]) -> None:
    """Holm is never above Bonferroni, never below the raw p-value, and keeps the p order."""
    adjusted = holm(ps)
    for p, h, b in zip(ps, adjusted, bonferroni(ps), strict=True):
        assert p <= h + 1e-15 and h <= b + 1e-15
    order = sorted(range(len(ps)), key=ps.__getitem__)
    assert [adjusted[i] for i in order] == sorted(adjusted)
