"""The sample-ratio guard: equal to scipy, valid under peeking, finds a broken split."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from evald.statistics.srm import SampleRatio, srm_log_evalue, srm_log_evalues


@pytest.mark.parametrize(
    ("counts", "split"),
    [([500, 480], [1, 1]), ([9000, 1100], [0.9, 0.1]), ([30, 35, 20], [1, 1, 1]), ([0, 7], [1, 3])],
)
def test_equals_dirichlet_multinomial_over_multinomial(counts: list[int], split: list[float]):
    p = np.asarray(split, dtype=float) / sum(split)
    expected = stats.dirichlet_multinomial.logpmf(counts, 100.0 * p, sum(counts))
    expected -= stats.multinomial.logpmf(counts, sum(counts), p)
    assert srm_log_evalue(counts, split) == pytest.approx(expected, abs=1e-9)


def test_bad_input_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="positive weights"):
        srm_log_evalue([1, 2], [1, 0])
    with pytest.raises(ValueError, match="one non-negative count per arm"):
        srm_log_evalue([1, 2, 3], [1, 1])


def _ever_flagged(split: tuple[float, float], true_p: float, runs: int, seed: int) -> float:
    """Share of runs (300 windows of 40 assignments each) whose guard ever fires at α = 0.05."""
    treated = np.random.default_rng(seed).binomial(40, true_p, (runs, 300)).cumsum(axis=1)
    total = 40 * np.arange(1, 301)
    log_e = srm_log_evalues(np.stack([total - treated, treated], axis=-1), split)
    return float((log_e.max(axis=1) >= math.log(1 / 0.05)).mean())


def test_fold_equals_the_array_form() -> None:
    rng = np.random.default_rng(1)
    window_counts = rng.multinomial(50, [0.3, 0.3, 0.4], 40)
    state, cumulative = SampleRatio((0, 0, 0)), window_counts.cumsum(axis=0)
    for row in window_counts:
        state = state.look(tuple(row), (3, 3, 4))
    assert state.counts == tuple(cumulative[-1])
    expected = srm_log_evalues(cumulative, (3, 3, 4)).max()
    assert state.max_log_evalue == pytest.approx(max(0.0, expected), abs=1e-12)


def test_aa_peeking_stays_within_alpha() -> None:
    runs = 2000
    share = _ever_flagged((1, 1), 0.5, runs, seed=20261124)
    assert share <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs), share


def test_finds_a_broken_split() -> None:
    assert _ever_flagged((1, 1), 0.47, 100, seed=2) > 0.8


def test_p_value_and_json() -> None:
    state = SampleRatio((0, 0)).look((5200, 4800), (1, 1))
    assert state.p_value == pytest.approx(math.exp(-state.max_log_evalue))
    assert state.mismatch(alpha=0.05)
    assert SampleRatio.from_json(json.loads(json.dumps(state.to_json()))) == state
