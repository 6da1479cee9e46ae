"""Measures no reference tool computes the way we define them, checked against oracles
written from their papers' formulas (plain per-list Python), plus the global conventions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import kendalltau

from evald.metrics import (
    Batch,
    evaluate,
    mean_of,
    parse_measure,
    parse_measures,
    weights_of,
)

grade = st.sampled_from([0.0, 0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.5, 2.5])
lists = st.lists(st.lists(grade, max_size=14), min_size=1, max_size=8)
judged_lists = st.lists(st.lists(st.one_of(st.none(), grade), max_size=14), min_size=1, max_size=8)
SETTINGS = settings(max_examples=150, deadline=None)


def one(name: str, batch: Batch) -> np.ndarray:
    measure = parse_measure(name)
    return evaluate([measure], batch)[measure]


def as_batch(rows: list[list[float | None]]) -> Batch:
    """Served items i0.. with grade None = unjudged."""
    rankings = [[f"i{j}" for j in range(len(r))] for r in rows]
    qrels = [{f"i{j}": g for j, g in enumerate(r) if g is not None} for r in rows]
    return Batch.from_lists(rankings, qrels)


# -- ERR: Chapelle, Metzler, Zhang, Grinspan (CIKM 2009), Algorithm 2 ---------------------------


def err_oracle(grades: list[float], gmax: int, k: int | None) -> float:
    p, total = 1.0, 0.0
    for r, g in enumerate(grades[:k] if k else grades, start=1):
        big_r = (2 ** min(g, gmax) - 1) / 2**gmax
        total += p * big_r / r
        p *= 1 - big_r
    return total


@SETTINGS
@given(rows=lists, gmax=st.sampled_from([1, 3, 4, 5]), k=st.sampled_from([None, 1, 3, 10, 20]))
def test_err_equals_the_papers_cascade(rows: list[list[float]], gmax: int, k: int | None) -> None:
    name = ("ERR" if gmax == 4 else f"ERR(gmax={gmax})") + (f"@{k}" if k else "")
    got = one(name, Batch.from_served_grades(rows))
    np.testing.assert_allclose(got, [err_oracle(r, gmax, k) for r in rows], rtol=0, atol=1e-12)


def test_err_worked_example() -> None:
    # grades 4, 0, 2 with gmax 4: R = 15/16, 0, 3/16
    expected = 15 / 16 + 0 + (1 - 15 / 16) * 1 * (3 / 16) / 3
    assert float(one("ERR@3", Batch.from_served_grades([[4, 0, 2]]))[0]) == pytest.approx(
        expected, abs=1e-15
    )


# -- RBP: Moffat & Zobel (TOIS 2008), graded form and residual ---------------------------------


def rbp_oracle(row: list[float | None], p: float, gain: object, k: int | None) -> float:
    top = row[:k] if k else row
    return (1 - p) * sum(gain(g) * p**i for i, g in enumerate(top) if g is not None)


@SETTINGS
@given(rows=judged_lists, p=st.sampled_from([0.5, 0.8, 0.95]), k=st.sampled_from([None, 2, 20]))
def test_rbp_binary_and_graded(rows: list[list[float | None]], p: float, k: int | None) -> None:
    batch = as_batch(rows)
    cut = f"@{k}" if k else ""
    binary = one(f"RBP(p={p},rel=2){cut}", batch)
    np.testing.assert_allclose(
        binary, [rbp_oracle(r, p, lambda g: g >= 2, k) for r in rows], rtol=0, atol=1e-12
    )
    graded = one(f"RBP(p={p},graded=True){cut}", batch)
    tops = [max([g for g in r if g is not None], default=0.0) for r in rows]
    expected = [
        rbp_oracle(r, p, lambda g, top=top: g / top, k) if top > 0 else 0.0
        for r, top in zip(rows, tops, strict=True)
    ]
    np.testing.assert_allclose(graded, expected, rtol=0, atol=1e-12)


def test_rbp_residual_by_hand() -> None:
    p = 0.8
    rows: list[list[float | None]] = [[1, None, 0, None], [1, 0], [0, 0], []]
    batch = as_batch(rows)
    got = one("RBPResidual(p=0.8)", batch)
    expected = [
        (1 - p) * (p**1 + p**3) + p**4,  # unjudged ranks 2 and 4, then everything past rank 4
        p**2,  # fully judged: only what lies past the served end
        0.0,  # nothing relevant: 0 like every measure
        0.0,
    ]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-15)
    # with a cutoff past the end, ranks 5..6 are known empty: the tail starts after rank 6
    got6 = one("RBPResidual(p=0.8)@6", batch)
    assert float(got6[0]) == pytest.approx((1 - p) * (p**1 + p**3) + p**6, abs=1e-15)
    got2 = one("RBPResidual(p=0.8)@2", batch)
    assert float(got2[0]) == pytest.approx((1 - p) * p + p**2, abs=1e-15)


@SETTINGS
@given(rows=judged_lists)
def test_rbp_plus_residual_bounds_any_completion(rows: list[list[float | None]]) -> None:
    """RBP <= RBP with unjudged items made relevant <= RBP + residual (the residual's meaning)."""
    batch = as_batch(rows)
    low = one("RBP(p=0.8)", batch)
    residual = one("RBPResidual(p=0.8)", batch)
    optimistic = as_batch([[1.0 if g is None else g for g in r] for r in rows])
    high = one("RBP(p=0.8)", optimistic)
    relevant = batch.ideal[:, 0] >= 1
    assert np.all(low[relevant] <= high[relevant] + 1e-12)
    assert np.all(high[relevant] <= low[relevant] + residual[relevant] + 1e-12)


# -- AUC, GAUC, Kendall tau-b --------------------------------------------------------------------


def auc_oracle(row: list[float | None], rel: float) -> tuple[float, int]:
    judged = [(i, g) for i, g in enumerate(row) if g is not None]
    pos = [i for i, g in judged if g >= rel]
    neg = [i for i, g in judged if g < rel]
    pairs = [(a, b) for a in pos for b in neg]
    if not pairs:
        return 0.0, 0
    return sum(a < b for a, b in pairs) / len(pairs), len(judged)


@SETTINGS
@given(rows=judged_lists, rel=st.sampled_from([1, 2]))
def test_auc_counts_ordered_pairs(rows: list[list[float | None]], rel: int) -> None:
    batch = as_batch(rows)
    name = "AUC" if rel == 1 else f"AUC(rel={rel})"
    expected = [auc_oracle(r, rel) for r in rows]
    np.testing.assert_allclose(one(name, batch), [e[0] for e in expected], rtol=0, atol=1e-12)
    gauc = parse_measure("G" + name)
    values = evaluate([gauc], batch)[gauc]
    np.testing.assert_array_equal(weights_of(gauc, batch), [e[1] for e in expected])
    total = sum(e[1] for e in expected)
    weighted = sum(a * w for a, w in expected) / total if total else 0.0
    assert mean_of(gauc, values, batch) == pytest.approx(weighted, abs=1e-12)


def test_gauc_worked_example() -> None:
    # list 1: relevant at rank 1 and 3, non-relevant at 2 and 4 -> 3 of 4 pairs, 4 judged items
    # list 2: perfect, 2 judged; list 3: no negatives -> left out of GAUC
    batch = Batch.from_served_grades([[1, 0, 1, 0], [1, 0], [1, 1, 1]])
    gauc = parse_measure("GAUC")
    values = evaluate([gauc], batch)[gauc]
    np.testing.assert_allclose(values, [0.75, 1.0, 0.0])
    assert mean_of(gauc, values, batch) == pytest.approx((0.75 * 4 + 1.0 * 2) / 6)
    auc = parse_measure("AUC")
    assert mean_of(auc, values, batch) == pytest.approx(1.75 / 3)


@SETTINGS
@given(rows=judged_lists)
def test_kendall_tau_b_equals_scipy(rows: list[list[float | None]]) -> None:
    got = one("KendallTau", as_batch(rows))
    expected = []
    for row in rows:
        ranks = [-i for i, g in enumerate(row) if g is not None]  # earlier = larger
        grades = [g for g in row if g is not None]
        tau = kendalltau(ranks, grades, variant="b").statistic if len(grades) > 1 else math.nan
        expected.append(0.0 if math.isnan(tau) else tau)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_kendall_tau_rules() -> None:
    batch = Batch.from_served_grades([[3, 2, 1], [1, 2, 3], [2, 2, 2], [5], [], [2, 2, 1]])
    tau = one("KendallTau", batch)
    assert tau[:5].tolist() == [1.0, -1.0, 0.0, 0.0, 0.0]  # all tied / <2 items -> 0
    # [2, 2, 1]: C = 2, D = 0, n0 = 3, one tied pair: 2 / sqrt(3 * 2)
    assert float(tau[5]) == pytest.approx(2 / math.sqrt(6), abs=1e-15)


def test_kendall_tau_large_depth_is_chunked_consistently() -> None:
    rng = np.random.default_rng(7)
    grades = rng.integers(0, 4, size=(900, 120)).astype(float)  # > one chunk of pairs
    got = one("KendallTau", Batch.from_served_grades(grades))
    for i in (0, 450, 899):
        expected = kendalltau(-np.arange(120), grades[i], variant="b").statistic
        assert float(got[i]) == pytest.approx(expected, abs=1e-12)


# -- global conventions --------------------------------------------------------------------------

EVERY = parse_measures(
    "P@3,R@3,F1@3,CG@3,CG,DCG@3,DCG,nDCG@3,nDCG,nDCG(dcg='exp-log2')@3,AP,AP@3,"
    "AP(denom='min')@3,RR,RR@3,Success@3,RBP(p=0.8),RBP(p=0.8)@3,RBP(p=0.8,graded=True),"
    "RBPResidual(p=0.8),RBPResidual(p=0.8)@3,ERR@3,ERR,AUC,GAUC,KendallTau,P(rel=2)@3"
)


@SETTINGS
@given(rows=judged_lists)
def test_no_judged_relevant_item_scores_zero_everywhere(rows: list[list[float | None]]) -> None:
    nothing = as_batch([[None if g is None else 0.0 for g in r] for r in rows])
    for measure, values in evaluate(EVERY, nothing).items():
        assert np.all(values == 0.0), str(measure)


@SETTINGS
@given(rows=judged_lists)
def test_values_are_float64_and_bounded(rows: list[list[float | None]]) -> None:
    batch = as_batch(rows)
    for measure, values in evaluate(EVERY, batch).items():
        assert values.dtype == np.float64 and values.shape == (len(rows),)
        assert np.all(np.isfinite(values))
        if measure.family == "KendallTau":
            assert np.all(np.abs(values) <= 1 + 1e-12)
        elif measure.family in ("DCG", "CG"):
            assert np.all(values >= 0)
        else:
            assert np.all((values >= 0) & (values <= 1 + 1e-12)), str(measure)


@SETTINGS
@given(rows=judged_lists, k=st.sampled_from([1, 3, 20]))
def test_cumulative_gain_sums_the_top_k_grades(rows: list[list[float | None]], k: int) -> None:
    batch = as_batch(rows)
    expected = [sum(g for g in r[:k] if g is not None) for r in rows]
    np.testing.assert_allclose(one(f"CG@{k}", batch), expected, rtol=0, atol=1e-12)
    full = [sum(g for g in r if g is not None) for r in rows]
    np.testing.assert_allclose(one("CG", batch), full, rtol=0, atol=1e-12)


def test_cutoff_beyond_the_list_counts_missing_ranks_as_non_relevant() -> None:
    batch = Batch.from_served_grades([[1, 1, 1]])
    values = {
        str(m): float(v[0])
        for m, v in evaluate(
            parse_measures("P@10,R@10,Success@10,nDCG@10,AP@10,AP(denom='min')@10"), batch
        ).items()
    }
    assert values == {
        "P@10": 0.3,
        "R@10": 1.0,
        "Success@10": 1.0,
        "nDCG@10": 1.0,
        "AP@10": 1.0,
        "AP(denom='min')@10": 1.0,
    }


def test_fractional_grades_are_gains() -> None:
    batch = Batch.from_served_grades([[0.5, 1.5]])
    dcg = 0.5 + 1.5 / math.log2(3)
    idcg = 1.5 + 0.5 / math.log2(3)
    assert float(one("nDCG@2", batch)[0]) == pytest.approx(dcg / idcg, abs=1e-15)
    assert float(one("P@2", batch)[0]) == 0.5  # binary at rel=1: only 1.5 is relevant


def test_mean_of_plain_measure_is_the_mean() -> None:
    batch = Batch.from_served_grades([[1, 0], [0, 1], [0, 0]])
    measure = parse_measure("RR")
    values = evaluate([measure], batch)[measure]
    assert mean_of(measure, values, batch) == pytest.approx(0.5)
    assert mean_of(measure, values[:0], Batch.from_served_grades([])) == 0.0


# -- the same list, the same bits, in any batch ----------------------------------------------

EVERY_FAMILY = (
    "CG, CG@5, DCG, DCG(dcg='exp-log2')@10, nDCG, nDCG@10, AP, AP@10, AP(denom='min')@10, RR, "
    "P@10, R@10, F1@10, Success@10, RBP(p=0.8), RBP(p=0.95, graded=True), RBPResidual(p=0.8), "
    "ERR, ERR@10, AUC, KendallTau"
)


@SETTINGS
@given(rows=judged_lists, longer=st.integers(1, 40))
def test_a_lists_value_does_not_depend_on_the_batch_it_is_scored_in(
    rows: list[list[float | None]], longer: int
) -> None:
    """Scored with a much longer list beside it (so its row is padded to another width), each
    list must get the same value to the last bit: the engine and `evald score` batch lists by
    what happens to close together, and results are compared across runs and restarts."""
    measures = parse_measures(EVERY_FAMILY)
    alone = [evaluate(measures, as_batch([row])) for row in rows]
    wide = [[0.25 * (j % 7) for j in range(len(max(rows, key=len)) + longer)], *rows]
    together = evaluate(measures, as_batch(wide))
    for i, values in enumerate(alone):
        for measure in measures:
            assert together[measure][i + 1] == values[measure][0], (measure, rows[i])
