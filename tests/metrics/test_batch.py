"""Batch construction: padding, judgments, the ideal, depth cuts and bad data."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.metrics import Batch, evaluate, parse_measures, required_depth

ALL = parse_measures(
    "P@3,R@3,F1@3,CG@3,DCG@3,nDCG@3,nDCG,nDCG(dcg='exp-log2')@3,AP,AP@3,AP(denom='min')@3,"
    "RR,RR@3,Success@3,RBP(p=0.8),RBP(p=0.8,graded=True),RBPResidual(p=0.8),ERR@3,AUC,GAUC,"
    "KendallTau,P(rel=2)@3"
)


def test_from_lists_layout() -> None:
    batch = Batch.from_lists(
        [["a", "b", "c"], ["x"]],
        [{"a": 2, "c": 0, "z": 3}, {}],
    )
    np.testing.assert_array_equal(batch.grades, [[2, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(batch.judged, [[True, False, True], [False, False, False]])
    np.testing.assert_array_equal(batch.lengths, [3, 1])
    np.testing.assert_array_equal(batch.ideal, [[3, 2], [0, 0]])  # judged > 0, served or not
    assert batch.grades.dtype == np.float64 and batch.ideal.dtype == np.float64
    assert batch.lengths.dtype == np.int64 and batch.judged.dtype == np.bool_
    assert (batch.n, batch.depth, batch.truncated) == (2, 3, False)


def test_repeated_item_counts_once() -> None:
    batch = Batch.from_lists([["a", "b", "a"]], [{"a": 1}])
    np.testing.assert_array_equal(batch.grades, [[1, 0, 0]])
    np.testing.assert_array_equal(batch.judged, [[True, False, False]])
    values = evaluate(parse_measures("P@3,R@3"), batch)
    assert [float(v[0]) for v in values.values()] == [1 / 3, 1.0]


def test_negative_grades_are_judged_non_relevant() -> None:
    batch = Batch.from_lists([["a", "b"]], [{"a": -2, "b": 1}])
    np.testing.assert_array_equal(batch.grades, [[0, 1]])
    np.testing.assert_array_equal(batch.judged, [[True, True]])
    np.testing.assert_array_equal(batch.ideal, [[1]])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_grades_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        Batch.from_lists([["a"]], [{"a": bad}])
    with pytest.raises(ValueError, match="finite"):
        Batch.from_lists([["a"]], [{"a": 1, "unserved": bad}])
    with pytest.raises(ValueError, match="finite"):
        Batch.from_served_grades([[1.0, bad]])


def test_rankings_and_qrels_must_pair_up() -> None:
    with pytest.raises(ValueError, match="2 rankings but 1 qrels"):
        Batch.from_lists([["a"], ["b"]], [{"a": 1}])


def test_empty_batch_and_empty_lists() -> None:
    empty = Batch.from_lists([], [])
    for values in evaluate(ALL, empty).values():
        assert values.shape == (0,) and values.dtype == np.float64
    batch = Batch.from_served_grades([[], [1.0]])
    np.testing.assert_array_equal(batch.lengths, [0, 1])
    values = evaluate(parse_measures("P@1,RR"), batch)
    assert [v.tolist() for v in values.values()] == [[0.0, 1.0], [0.0, 1.0]]


def test_from_served_grades_every_served_item_is_judged() -> None:
    batch = Batch.from_served_grades([[0, 2, 1], [3]])
    np.testing.assert_array_equal(batch.grades, [[0, 2, 1], [3, 0, 0]])
    np.testing.assert_array_equal(batch.judged, [[True, True, True], [True, False, False]])
    np.testing.assert_array_equal(batch.ideal[:, :2], [[2, 1], [3, 0]])
    same = Batch.from_served_grades(np.array([[0, 2, 1]], dtype=np.int64))
    np.testing.assert_array_equal(same.grades, batch.grades[:1])
    assert same.grades.dtype == np.float64


def test_depth_cut_keeps_the_ideal_and_refuses_deeper_measures() -> None:
    grades = [[0, 0, 0, 0, 3, 1], [1]]
    cut = Batch.from_served_grades(grades, depth=2)
    assert cut.depth == 2 and cut.truncated
    np.testing.assert_array_equal(cut.lengths, [6, 1])
    np.testing.assert_array_equal(cut.ideal[0, :2], [3, 1])  # from the whole served list
    full = Batch.from_served_grades(grades)
    shallow = parse_measures("P@2,nDCG@2,Success@1")
    for m, values in evaluate(shallow, cut).items():
        np.testing.assert_array_equal(values, evaluate([m], full)[m])
    for deep in ("P@3", "RR", "AUC"):
        with pytest.raises(ValueError, match="depth=2"):
            evaluate(parse_measures(deep), cut)


def test_depth_beyond_every_list_stores_no_padding() -> None:
    # a huge cutoff must not allocate a huge matrix; the kernels treat missing ranks as empty
    batch = Batch.from_lists([["a"], ["b", "c"]], [{"a": 1}, {}], depth=1_000_000)
    assert batch.depth == 2 and not batch.truncated
    np.testing.assert_array_equal(batch.judged, [[True, False], [False, False]])
    measure = parse_measures("P@1000000")[0]
    assert evaluate([measure], batch)[measure].tolist() == [1e-6, 0.0]
    assert Batch.from_served_grades([[1.0]], depth=50).depth == 1


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth"):
        Batch.from_served_grades([[1.0]], depth=0)


grade_lists = st.lists(
    st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 3.0, 4.0]), max_size=15), max_size=10
)


@settings(max_examples=100, deadline=None)
@given(grades=grade_lists)
def test_served_grades_equal_lists_with_the_same_judgments(grades: list[list[float]]) -> None:
    rankings = [[f"i{j}" for j in range(len(g))] for g in grades]
    qrels = [dict(zip(r, g, strict=True)) for r, g in zip(rankings, grades, strict=True)]
    a = evaluate(ALL, Batch.from_served_grades(grades))
    b = evaluate(ALL, Batch.from_lists(rankings, qrels))
    for m in ALL:
        np.testing.assert_allclose(a[m], b[m], rtol=0, atol=1e-12, err_msg=str(m))


@settings(max_examples=100, deadline=None)
@given(grades=grade_lists, cutoffs=st.lists(st.integers(1, 20), min_size=1, max_size=4))
def test_required_depth_batches_score_the_same(
    grades: list[list[float]], cutoffs: list[int]
) -> None:
    names = [f"{f}@{k}" for k in cutoffs for f in ("nDCG", "P", "AP", "RR", "RBP(p=0.8)", "ERR")]
    measures = parse_measures(names)
    depth = required_depth(measures)
    assert depth == max(cutoffs)
    cut = evaluate(measures, Batch.from_served_grades(grades, depth=depth))
    full = evaluate(measures, Batch.from_served_grades(grades))
    for m in measures:
        np.testing.assert_allclose(cut[m], full[m], rtol=0, atol=1e-12, err_msg=str(m))


def _reference_rows(
    ranking: list[str], qrels: dict[str, float]
) -> tuple[list[float], list[bool], list[float]]:
    """The documented layout of one list, spelled out item by item: served grades (negatives
    judged as 0, repeats unjudged), judged flags, and the positive judged grades sorted."""
    seen: set[str] = set()
    grades: list[float] = []
    judged: list[bool] = []
    for item in ranking:
        known = item in qrels and item not in seen
        seen.add(item)
        grades.append(max(float(qrels[item]), 0.0) if known else 0.0)
        judged.append(known)
    ideal = sorted((float(g) for g in qrels.values() if g > 0), reverse=True)
    return grades, judged, ideal


lists_with_judgments = st.lists(
    st.tuples(
        st.lists(st.sampled_from("abcdefgh"), max_size=12),
        st.dictionaries(
            st.sampled_from("abcdefghxyz"), st.sampled_from([-1, -0.5, 0, 0.5, 1, 2, 3])
        ),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(rows=lists_with_judgments, depth=st.one_of(st.none(), st.integers(1, 14)))
def test_from_lists_matches_the_documented_layout_list_by_list(
    rows: list[tuple[list[str], dict[str, float]]], depth: int | None
) -> None:
    batch = Batch.from_lists([r for r, _ in rows], [q for _, q in rows], depth=depth)
    longest = max([len(r) for r, _ in rows], default=0)
    width = max(longest, 1) if depth is None else min(depth, max(longest, 1))
    positives = max([sum(g > 0 for g in q.values()) for _, q in rows], default=0)
    assert batch.grades.shape == batch.judged.shape == (len(rows), width)
    assert batch.ideal.shape == (len(rows), max(positives, 1))
    for i, (ranking, qrels) in enumerate(rows):
        grades, judged, ideal = _reference_rows(ranking, qrels)
        pad = width - min(len(ranking), width)
        assert batch.lengths[i] == len(ranking)
        assert batch.grades[i].tolist() == grades[:width] + [0.0] * pad
        assert batch.judged[i].tolist() == judged[:width] + [False] * pad
        assert batch.ideal[i].tolist() == ideal + [0.0] * (batch.ideal.shape[1] - len(ideal))
