"""Batched scoring: results do not depend on the batch size; means and GAUC aggregate right."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.metrics import Batch, evaluate, mean_of, parse_measures
from evald.score.records import Qid, Query
from evald.score.scoring import BatchScorer, MeanAccumulator

MEASURES = parse_measures("nDCG@3,RR,P@2,AP,GAUC,RBP(p=0.5)")


class Collect:
    """Row sink that keeps everything it is given."""

    def __init__(self) -> None:
        self.qids: list[Qid] = []
        self.columns: list[list[float]] = []

    def __call__(self, qids: Sequence[Qid], columns: Sequence[np.ndarray]) -> None:
        self.qids.extend(qids)
        if not self.columns:
            self.columns = [[] for _ in columns]
        for target, column in zip(self.columns, columns, strict=True):
            target.extend(column.tolist())


docs = st.sampled_from("abcdefgh")
queries = st.lists(
    st.builds(
        Query,
        qid=st.text("xyz", min_size=1, max_size=3),
        ranking=st.lists(docs, unique=True, max_size=6),
        qrels=st.dictionaries(docs, st.integers(0, 3).map(float), max_size=6),
    ),
    max_size=25,
)


def run_all(
    items: list[Query], batch_size: int, cell_budget: int = 10**9
) -> tuple[Collect, BatchScorer]:
    sink = Collect()
    scorer = BatchScorer(MEASURES, sink, batch_size=batch_size, cell_budget=cell_budget)
    for query in items:
        scorer.add(query)
    scorer.flush()
    return sink, scorer


@settings(max_examples=60, deadline=None)
@given(items=queries, batch_size=st.integers(1, 7), cell_budget=st.integers(1, 40))
def test_rows_and_means_do_not_depend_on_the_batch_size(
    items: list[Query], batch_size: int, cell_budget: int
) -> None:
    whole, whole_scorer = run_all(items, 10_000)
    split, split_scorer = run_all(items, batch_size, cell_budget)
    assert split.qids == whole.qids == [q.qid for q in items]
    # equal to the last few ulps: numpy may sum a row in another order in a wider batch
    for ours, reference in zip(split.columns, whole.columns, strict=True):
        assert ours == pytest.approx(reference, rel=1e-12, abs=1e-15)
    for a, b in zip(whole_scorer.means(), split_scorer.means(), strict=True):
        assert (a.name, a.n) == (b.name, b.n)
        if a.mean is None or b.mean is None:
            assert a.mean is b.mean is None
        else:
            assert a.mean == pytest.approx(b.mean, rel=1e-12, abs=1e-15)
    assert split_scorer.scored == len(items)


@settings(max_examples=40, deadline=None)
@given(items=queries.filter(bool))
def test_means_equal_the_engine_mean_over_one_batch(items: list[Query]) -> None:
    _, scorer = run_all(items, 3)
    batch = Batch.from_lists([q.ranking for q in items], [q.qrels for q in items])
    values = evaluate(MEASURES, batch)
    for row, measure in zip(scorer.means(), MEASURES, strict=True):
        if measure.family == "GAUC" and row.n == 0:
            assert row.mean is None  # no list with both classes: no GAUC, not a 0
            continue
        assert row.mean == pytest.approx(mean_of(measure, values[measure], batch), abs=1e-12)


def test_gauc_is_left_out_of_rows_and_weighted_by_judged_items_in_the_mean() -> None:
    items = [
        Query("a", ["r", "n"], {"r": 1, "n": 0}),  # AUC 1, two judged items
        Query("b", ["n1", "n2", "r"], {"r": 2, "n1": 0, "n2": 0}),  # AUC 0, three judged
        Query("c", ["r"], {"r": 1}),  # only relevant items: no pairs, weight 0
    ]
    sink, scorer = run_all(items, 2)
    assert len(sink.columns) == len(MEASURES) - 1
    gauc = next(row for row in scorer.means() if row.name == "GAUC")
    assert gauc.mean == pytest.approx((1 * 2 + 0 * 3) / 5)
    assert gauc.n == 2


def test_hand_computed_means() -> None:
    items = [
        Query("a", ["x", "y"], {"y": 1}),  # RR 1/2, P@2 1/2
        Query("b", ["y", "x"], {"y": 1}),  # RR 1, P@2 1/2
        Query("c", [], {"y": 1}),  # RR 0, P@2 0
    ]
    _, scorer = run_all(items, 2)
    means = {row.name: row.mean for row in scorer.means()}
    assert means["RR"] == pytest.approx(0.5)
    assert means["P@2"] == pytest.approx(1 / 3)


def test_no_queries_gives_no_mean_rather_than_zero() -> None:
    _, scorer = run_all([], 5)
    assert all(row.mean is None and row.n == 0 for row in scorer.means())


def test_accumulator_merges_batches_exactly() -> None:
    acc = MeanAccumulator()
    acc.add(np.array([0.1] * 10), np.ones(10))
    acc.add(np.array([0.7, 0.2]), np.array([3.0, 0.0]))
    assert acc.n == 11
    assert acc.mean() == pytest.approx((1.0 + 2.1) / 13)


def test_batch_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        BatchScorer(MEASURES, Collect(), batch_size=0)


class BatchSizes(Collect):
    """Row sink that records how many rows each scored batch had."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __call__(self, qids: Sequence[Qid], columns: Sequence[np.ndarray]) -> None:
        self.sizes.append(len(qids))
        super().__call__(qids, columns)


def test_long_lists_close_a_batch_early_to_bound_its_matrix() -> None:
    short = [Query(f"s{i}", ["a", "b"], {"a": 1}) for i in range(6)]
    long = Query("long", [f"d{i}" for i in range(50)], {"d3": 1})
    sink = BatchSizes()
    scorer = BatchScorer(parse_measures("RR"), sink, batch_size=100, cell_budget=60)
    for query in [*short[:3], long, *short[3:]]:
        scorer.add(query)
    scorer.flush()
    # 3 short lists (width 2) fit; the 50-wide list alone would make 4 x 50 > 60 cells, so the
    # short ones go first, the long one is scored alone, then the rest (3 x 2 cells)
    assert sink.sizes == [3, 1, 3]
    assert sink.qids == ["s0", "s1", "s2", "long", "s3", "s4", "s5"]
    assert sink.columns[0][3] == 0.25


def test_the_cut_off_depth_not_the_list_length_sets_the_width() -> None:
    long = [Query(f"q{i}", [f"d{j}" for j in range(50)], {"d0": 1}) for i in range(4)]
    sink = BatchSizes()
    scorer = BatchScorer(parse_measures("P@5"), sink, batch_size=100, cell_budget=20)
    for query in long:
        scorer.add(query)
    scorer.flush()
    assert sink.sizes == [4]  # 4 lists x 5 ranks = 20 cells: one batch


@settings(max_examples=60, deadline=None)
@given(items=queries, batch_size=st.integers(1, 9), cell_budget=st.integers(1, 30))
def test_every_batch_is_as_large_as_the_budget_allows_and_no_larger(
    items: list[Query], batch_size: int, cell_budget: int
) -> None:
    sink = BatchSizes()
    scorer = BatchScorer(parse_measures("RR"), sink, batch_size=batch_size, cell_budget=cell_budget)
    for query in items:
        scorer.add(query)
    scorer.flush()
    widths = [max(len(q.ranking), len(q.qrels), 1) for q in items]
    assert sum(sink.sizes) == len(items)
    start = 0
    for size in sink.sizes:
        batch = widths[start : start + size]
        assert size == 1 or max(batch) * size <= cell_budget
        chunk_end = (start // batch_size + 1) * batch_size  # add() scores every batch_size lists
        assert start + size <= chunk_end
        if start + size < min(chunk_end, len(items)):  # the next list was there to take: too wide
            assert max(widths[start : start + size + 1]) * (size + 1) > cell_budget
        start += size


@settings(max_examples=60, deadline=None)
@given(
    items=queries,
    batch_size=st.integers(1, 7),
    cuts=st.lists(st.integers(0, 25), max_size=6),
)
def test_columns_in_any_chunks_score_exactly_as_one_query_at_a_time(
    items: list[Query], batch_size: int, cuts: list[int]
) -> None:
    """add_many fills batches of exactly batch_size lists, whatever the chunks handed in."""
    one_sink, one = run_all(items, batch_size)
    sink = Collect()
    batches: list[int] = []

    def counting(qids: Sequence[Qid], columns: Sequence[np.ndarray]) -> None:
        batches.append(len(qids))
        sink(qids, columns)

    scorer = BatchScorer(MEASURES, counting, batch_size=batch_size)
    bounds = [0, *sorted(min(c, len(items)) for c in cuts), len(items)]
    for lo, hi in pairwise(bounds):
        part = items[lo:hi]
        scorer.add_many([q.qid for q in part], [q.ranking for q in part], [q.qrels for q in part])
    scorer.flush()
    assert sink.qids == one_sink.qids and sink.columns == one_sink.columns
    assert scorer.means() == one.means()
    full, rest = divmod(len(items), batch_size)
    assert batches == [batch_size] * full + ([rest] if rest else [])


def test_add_many_refuses_columns_of_different_lengths() -> None:
    scorer = BatchScorer(MEASURES, Collect())
    with pytest.raises(ValueError, match="as long as each other"):
        scorer.add_many(["q1", "q2"], [["a"]], [{}, {}])
