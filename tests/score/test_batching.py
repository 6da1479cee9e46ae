"""Lists -> Batch: exactly the matrices Batch.from_lists builds, however the lists are chunked."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.metrics import Batch
from evald.score.batching import Lists, build_batch, concat, cut_lists, lists_from, widths
from evald.score.scoring import cut_rankings

docs = st.sampled_from("abcdefghij")
grade = st.one_of(st.integers(0, 3), st.floats(0, 5, allow_nan=False), st.just(-1.0))
one_list = st.tuples(
    st.lists(docs, unique=True, max_size=9), st.dictionaries(docs, grade, max_size=8)
)


def assert_same(ours: Batch, theirs: Batch) -> None:
    for name in ("grades", "lengths", "ideal", "judged"):
        a, b = getattr(ours, name), getattr(theirs, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name  # bit for bit, -0.0 and all


@settings(max_examples=300, deadline=None)
@given(
    lists=st.lists(one_list, max_size=12),
    depth=st.one_of(st.none(), st.integers(1, 10)),
    cuts=st.lists(st.integers(0, 12), max_size=4),
)
def test_the_batch_is_the_one_from_lists_builds(
    lists: list[tuple[list[str], dict[str, float]]], depth: int | None, cuts: list[int]
) -> None:
    rankings = [r for r, _ in lists]
    qrels = [q for _, q in lists]
    qids = [f"q{i}" for i in range(len(lists))]
    bounds = [0, *sorted(min(c, len(lists)) for c in cuts), len(lists)]
    parts = [lists_from(qids[lo:hi], rankings[lo:hi], qrels[lo:hi]) for lo, hi in pairwise(bounds)]
    whole = concat(parts)
    assert whole.qids == qids
    assert_same(build_batch(whole, depth), Batch.from_lists(rankings, qrels, depth=depth))
    if lists:  # a slice is the batch of those lists alone
        lo, hi = len(lists) // 3, len(lists)
        assert_same(
            build_batch(whole.slice(lo, hi), depth),
            Batch.from_lists(rankings[lo:hi], qrels[lo:hi], depth=depth),
        )


def test_widths_are_served_ranks_up_to_the_depth_or_judgments_at_least_one() -> None:
    lists = lists_from(
        ["a", "b", "c"], [["x"] * 0, list("abcdef"), ["a"]], [{}, {}, dict.fromkeys("abc", 1)]
    )
    assert widths(lists, None).tolist() == [1, 6, 3]
    assert widths(lists, 4).tolist() == [1, 4, 3]


def test_unjudged_served_items_are_nan_until_the_batch_marks_them() -> None:
    lists = lists_from(["q"], [["a", "b"]], [{"b": 2, "z": 1}])
    assert math.isnan(lists.served[0]) and lists.served[1] == 2.0
    assert lists.judgments.tolist() == [2.0, 1.0]
    batch = build_batch(lists, None)
    assert batch.judged.tolist() == [[False, True]]
    assert batch.ideal.tolist() == [[2.0, 1.0]]


def test_non_finite_judgments_are_refused_as_from_lists_refuses_them() -> None:
    lists = lists_from(["q"], [["a"]], [{"a": math.inf}])
    with pytest.raises(ValueError, match="finite"):
        build_batch(lists, None)
    with pytest.raises(ValueError, match="finite"):
        Batch.from_lists([["a"]], [{"a": math.inf}])


def test_columns_of_different_lengths_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="as long as each other"):
        lists_from(["q"], [], [{}])
    empty = concat([])
    assert len(empty) == 0 and isinstance(empty, Lists)
    assert build_batch(empty, 3).grades.shape == (0, 1)
    assert np.array_equal(build_batch(empty, None).ideal, Batch.from_lists([], []).ideal)


@settings(max_examples=300, deadline=None)
@given(
    lists=st.lists(one_list, max_size=12),
    max_docs=st.one_of(st.none(), st.integers(1, 6)),
    judged_only=st.booleans(),
)
def test_cut_lists_is_cut_rankings_on_numbers(
    lists: list[tuple[list[str], dict[str, float]]], max_docs: int | None, judged_only: bool
) -> None:
    """-M then -J on looked-up lists leaves the lists -M then -J leaves on the docids."""
    qids = [f"q{i}" for i in range(len(lists))]
    rankings = [r for r, _ in lists]
    qrels = [q for _, q in lists]
    ours = cut_lists(lists_from(qids, rankings, qrels), max_docs, judged_only)
    cut = cut_rankings(rankings, qrels, max_docs, judged_only)
    theirs = lists_from(qids, cut, qrels)
    assert ours.qids == theirs.qids
    for name in ("lengths", "served", "counts", "judgments"):
        a, b = getattr(ours, name), getattr(theirs, name)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
