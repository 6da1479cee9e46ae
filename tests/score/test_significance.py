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

from evald.score import significance
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


@pytest.mark.parametrize(
    ("grouped", "block", "draws"), [(1.0, 1 << 22, 20_000), (0.0, 1 << 22, 20_000), (0.0, 8, 4000)]
)
def test_both_ways_of_drawing_signs_sample_the_exact_null_distribution(
    monkeypatch: pytest.MonkeyPatch, grouped: float, block: int, draws: int
) -> None:
    """Per distinct difference (Binomial(k, 1/2) of k equal ones flip), per query (a random
    bit each), and per query with the queries split over two blocks."""
    monkeypatch.setattr(significance, "_GROUPED", grouped)
    monkeypatch.setattr(significance, "_BLOCK", block)
    rng = np.random.default_rng(11)
    a = rng.integers(0, 3, 16) / 2  # grades make ties: few distinct differences
    b = np.clip(a + rng.integers(-1, 3, 16) / 2, 0, 1)
    exact = randomization(a, b, permutations=2**16, seed=0)
    sampled = randomization(a, b, permutations=draws, seed=4)
    assert exact.exact and not sampled.exact
    # the standard error of a two-sided p-value is at most 1/sqrt(draws): 0.007, 0.016
    assert abs(sampled.p - exact.p) < 4 / draws**0.5, (sampled.p, exact.p)
    assert sampled == randomization(a, b, permutations=draws, seed=4)


_DEFAULT_RNG = np.random.default_rng


class _CountingGenerator:
    """numpy's generator, recording the most random values one call asked for."""

    def __init__(self, seed: int) -> None:
        self._rng = _DEFAULT_RNG(seed)
        self.largest = 0

    def bytes(self, length: int) -> bytes:
        self.largest = max(self.largest, 8 * length)  # a bit per sign
        return self._rng.bytes(length)

    def __getattr__(self, name: str) -> object:
        method = getattr(self._rng, name)

        def counted(*args: object, size: object = None, **kwargs: object) -> object:
            self.largest = max(self.largest, int(np.prod(size or 1)))
            return method(*args, size=size, **kwargs)

        return counted


@pytest.mark.parametrize("distinct", [True, False])
def test_signs_are_drawn_in_bounded_blocks_whatever_the_number_of_queries(
    monkeypatch: pytest.MonkeyPatch, distinct: bool
) -> None:
    """1,000 sign patterns of every query were drawn at once, as float64: 10 million queries
    asked for 80 GB (a MemoryError)."""
    generators: list[_CountingGenerator] = []

    def default_rng(seed: int) -> _CountingGenerator:
        generators.append(_CountingGenerator(seed))
        return generators[-1]

    rng = np.random.default_rng(2)
    n = 20_000
    a = rng.random(n) if distinct else rng.integers(0, 4, n) / 4
    b = np.clip(a + rng.normal(0.01, 0.2, n), 0, 1) if distinct else rng.integers(0, 4, n) / 4
    monkeypatch.setattr(significance, "_BLOCK", 4096)
    monkeypatch.setattr(significance.np.random, "default_rng", default_rng)
    result = randomization(a, b, permutations=3000, seed=0)
    assert result.permutations == 3000 and 0 < result.p <= 1
    (generator,) = generators
    assert 0 < generator.largest <= 4096
    # the same test as the t-test's normal limit, within sampling error (n is large)
    assert abs(result.p - paired_t(a, b)[1]) < 0.05


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
