"""Summary: the heavy-hitter bounds against exact counts, and batching-independent state."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from evald.drilldown.summary import Summary


def zipf_stream(seed: int, n: int, distinct: int) -> tuple[list[str], np.ndarray]:
    """``n`` queries drawn Zipf-like from ``distinct`` (fixed seed), and one value per list."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, distinct + 1) ** 1.1
    picks = rng.choice(distinct, size=n, p=weights / weights.sum())
    return [f"q{i}" for i in picks.tolist()], rng.random((n, 2))


def fill(summary: Summary, queries: list[str], values: np.ndarray, cuts: list[int]) -> None:
    bounds = [0, *cuts, len(queries)]
    for lo, hi in itertools.pairwise(bounds):
        summary.add(queries[lo:hi], values[lo:hi], np.ones_like(values[lo:hi], bool))


def check_bounds(summary: Summary, exact: Counter[str], n: int, capacity: int) -> None:
    assert summary.total == n
    assert summary.offset <= n / (capacity + 1)
    held = {e.query: e for e in summary.entries()}
    for query, true in exact.items():
        entry = held.get(query)
        if entry is None:
            assert true <= summary.offset, query  # missed only what the bound allows
            continue
        assert entry.lists <= true <= entry.lists_upper, query
        assert entry.lists_upper - entry.lists <= summary.offset
    for query, true in exact.items():
        if true > n / (capacity + 1):
            assert query in held, query


@pytest.mark.parametrize(("seed", "capacity"), [(1, 8), (2, 32), (3, 2)])
def test_counts_are_within_the_stated_bound_of_the_exact_ones(seed: int, capacity: int) -> None:
    queries, values = zipf_stream(seed, 20_000, 3_000)
    summary = Summary(capacity, 2)
    fill(summary, queries, values, [])
    assert summary.offset > 0  # purges happened: the bound is exercised, not vacuous
    assert len(summary) <= 2 * capacity
    check_bounds(summary, Counter(queries), len(queries), capacity)


def test_the_bound_check_fails_on_a_summary_that_forgets_its_offset() -> None:
    """Negative control: the same check catches a summary whose upper bound is too low."""
    queries, values = zipf_stream(1, 20_000, 3_000)
    summary = Summary(8, 2)
    fill(summary, queries, values, [])
    summary.offset = 0
    with pytest.raises(AssertionError):
        check_bounds(summary, Counter(queries), len(queries), 8)


def test_a_query_never_purged_has_exact_count_and_sums() -> None:
    queries, values = zipf_stream(4, 5_000, 400)
    summary = Summary(16, 2)
    fill(summary, queries, values, [])
    top = summary.entries()[0]
    mask = np.asarray([q == top.query for q in queries])
    assert top.lists == mask.sum()
    assert top.sums[0] == pytest.approx(values[mask, 0].sum(), rel=1e-12)


@pytest.mark.parametrize("seed", [5, 6])
def test_the_state_does_not_depend_on_how_the_stream_is_cut_into_batches(seed: int) -> None:
    """Purges at the same lists and sums added one value at a time: bit-identical (==)."""
    queries, values = zipf_stream(seed, 6_000, 800)
    whole = Summary(8, 2)
    fill(whole, queries, values, [])
    rng = np.random.default_rng(seed)
    cut = Summary(8, 2)
    fill(cut, queries, values, sorted(rng.choice(len(queries), 300, replace=False).tolist()))
    keys, table, scalars = whole.to_arrays()
    keys2, table2, scalars2 = cut.to_arrays()
    assert whole.offset > 0
    assert keys == keys2 and scalars == scalars2 and np.array_equal(table, table2)


def test_a_new_query_on_every_list_purges_where_one_list_at_a_time_would() -> None:
    """The label summaries' worst case (a session id new on every list, some repeated within
    the batch, among a few heavy pairs; values not all finite): one batch, purging dozens of
    times inside it, equals the lists added one at a time, bit for bit."""
    rng = np.random.default_rng(11)
    queries: list[str] = []
    for i in range(2_000):
        queries += [f"device {rng.integers(3)}", f"session {i}", f"session {i // 2}"]
    finite = rng.random((len(queries), 2)) > 0.1
    values = np.where(finite, rng.random((len(queries), 2)), 0.0)
    one = Summary(4, 2)
    for i in range(len(queries)):
        one.add(queries[i : i + 1], values[i : i + 1], finite[i : i + 1])
    batch = Summary(4, 2)
    batch.add(queries, values, finite)
    keys, table, scalars = one.to_arrays()
    keys2, table2, scalars2 = batch.to_arrays()
    assert one.offset > 100 and one.total == len(queries)
    assert keys == keys2 and scalars == scalars2 and np.array_equal(table, table2)
    assert [e.finite.dtype for e in batch.entries()] == [np.dtype(np.int64)] * len(batch)


def test_a_merge_keeps_the_bounds_over_both_streams() -> None:
    a_q, a_v = zipf_stream(7, 8_000, 1_000)
    b_q, b_v = zipf_stream(8, 8_000, 1_000)
    a, b = Summary(16, 2), Summary(16, 2)
    fill(a, a_q, a_v, [])
    fill(b, b_q, b_v, [])
    merged = Summary(16, 2)
    merged.merge(a)
    merged.merge(b)
    check_bounds(merged, Counter(a_q + b_q), 16_000, 16)


def test_arrays_round_trip_exactly_and_bad_ones_are_refused() -> None:
    queries, values = zipf_stream(9, 3_000, 500)
    summary = Summary(8, 2)
    fill(summary, queries, values, [])
    keys, table, scalars = summary.to_arrays()
    again = Summary.from_arrays(8, keys, table, scalars)
    keys2, table2, scalars2 = again.to_arrays()
    assert keys == keys2 and scalars == scalars2 and np.array_equal(table, table2)
    with pytest.raises(ValueError, match="repeat"):
        Summary.from_arrays(8, [keys[0], *keys[:-1]], table, scalars)
    with pytest.raises(ValueError, match="match"):
        Summary.from_arrays(8, keys[:-1], table, scalars)


def test_memory_is_fixed_by_the_capacity_whatever_the_distinct_queries() -> None:
    summary = Summary(4, 1)
    for i in range(2_000):
        summary.add([f"distinct {i}"], np.zeros((1, 1)), np.ones((1, 1), bool))
        assert len(summary) <= 8 and len(summary._counts) <= 9
