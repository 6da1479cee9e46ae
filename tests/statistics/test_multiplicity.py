"""Family-wise error control: Holm on always-valid p-values over measures × segments."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evald.statistics.multiplicity import bonferroni_alpha, holm_reject
from evald.statistics.sequential import log_evalue


def test_holm_steps_down() -> None:
    assert holm_reject([0.01, 0.04, 0.03, 0.5], 0.05) == [True, False, False, False]
    assert holm_reject([0.01, 0.02, 0.03], 0.09) == [True, True, True]
    assert holm_reject([0.2, 0.001], 0.05) == [False, True]
    assert holm_reject([], 0.05) == []
    assert bonferroni_alpha(0.05, 10) == pytest.approx(0.005)
    with pytest.raises(ValueError):
        bonferroni_alpha(0.05, 0)


@given(
    st.lists(st.sampled_from([0.0, 0.001, 0.01, 0.0125, 0.02, 0.025, 0.05, 0.3, 1.0]), max_size=7),
    st.sampled_from([0.05, 0.1]),
)
def test_holm_is_closed_testing_with_bonferroni(p_values: list[float], alpha: float) -> None:
    """Holm rejects H_i exactly when every intersection hypothesis holding i is rejected by
    Bonferroni (min over S of p ≤ α/|S|): the brute force over all subsets, ties included."""
    m = len(p_values)
    closed = [
        all(
            min(p_values[j] for j in subset) <= alpha / len(subset)
            for size in range(1, m + 1)
            for subset in itertools.combinations(range(m), size)
            if i in subset
        )
        for i in range(m)
    ]
    assert holm_reject(p_values, alpha) == closed


def test_family_of_always_valid_p_values_stays_within_alpha() -> None:
    """600 families of 6 A/A comparisons (3 measures × 2 segments), each looked at after every
    one of 200 windows: the share of families where Holm ever flags anything stays ≤ α + 3 SE,
    while testing each comparison alone at α flags far more families."""
    families, members, windows, per_window, alpha = 600, 6, 200, 25, 0.05
    rng = np.random.default_rng(20261124)
    shape = (families, members)
    sums, squares = np.zeros((2, *shape)), np.zeros((2, *shape))
    holm_flagged = np.zeros(families, dtype=bool)
    single_flagged = np.zeros(families, dtype=bool)
    min_p = np.ones(shape)
    for w in range(1, windows + 1):
        y = rng.random((2, *shape, per_window))
        sums += y.sum(axis=-1)
        squares += np.square(y).sum(axis=-1)
        n = w * per_window
        if n < 100:
            continue
        var = (squares - sums * sums / n) / (n - 1)
        se2 = (var[0] + var[1]) / n
        log_e = log_evalue(2 * n, se2, sums[1] / n - sums[0] / n, alpha, 5000.0)
        min_p = np.minimum(min_p, np.minimum(1.0, np.exp(-log_e)))
        single_flagged |= (min_p <= alpha).any(axis=1)
        holm_flagged |= [any(holm_reject(row, alpha)) for row in min_p]
    limit = alpha + 3 * math.sqrt(alpha * (1 - alpha) / families)
    assert holm_flagged.mean() <= limit, holm_flagged.mean()
    assert single_flagged.mean() > holm_flagged.mean() * 2
