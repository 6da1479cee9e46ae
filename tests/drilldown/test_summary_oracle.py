"""The query summary against a brute-force Misra–Gries written out in plain Python, list by
list, as docs/drilldown.md ("Summaries per segment and window") states it: when a new query
makes more than 2k held, the (k+1)-th largest counter c is subtracted from every counter, the
queries at zero or below are forgotten, and the offset grows by c. Held queries, counters,
lists seen, sums, finite counts, offset and total must be equal, not close."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evald.drilldown.summary import Summary


class Oracle:
    """Misra–Gries with each query's lists seen, sums and finite counts, one list at a time."""

    def __init__(self, capacity: int, measures: int) -> None:
        self.k, self.m = capacity, measures
        self.rows: dict[str, list] = {}  # query -> [counter, seen, sums, finite]
        self.offset = 0
        self.total = 0

    def add(self, query: str, values: list[float]) -> None:
        self.total += 1
        row = self.rows.setdefault(query, [0, 0, [0.0] * self.m, [0] * self.m])
        row[0] += 1
        row[1] += 1
        for j, v in enumerate(values):
            if math.isfinite(v):
                row[2][j] += v
                row[3][j] += 1
        if len(self.rows) > 2 * self.k:
            c = sorted((r[0] for r in self.rows.values()), reverse=True)[self.k]
            self.offset += c
            self.rows = {q: r for q, r in self.rows.items() if r[0] - c > 0}
            for r in self.rows.values():
                r[0] -= c

    def held(self) -> dict[str, tuple]:
        return {q: (r[1], r[0] + self.offset, r[2], r[3]) for q, r in self.rows.items()}


def held(summary: Summary) -> dict[str, tuple]:
    return {
        e.query: (e.lists, e.lists_upper, e.sums.tolist(), e.finite.tolist())
        for e in summary.entries()
    }


def hostile(seed: int, n: int) -> tuple[list[str], np.ndarray]:
    """Zipf heads, a new query every few lists (capacity overflow), runs of one query, ties,
    Unicode; values with NaN and infinities (not finite: left out of the sums)."""
    rng = np.random.default_rng(seed)
    pool = ["a", "b", "é", "e\u0301", "\u0130", "x" * 100, "q"]
    out: list[str] = []
    while len(out) < n:
        kind = int(rng.integers(0, 4))
        if kind == 0:
            out += [f"z{int(rng.zipf(1.3)) % 500}" for _ in range(int(rng.integers(1, 30)))]
        elif kind == 1:
            out += [f"new{len(out)}-{i}" for i in range(int(rng.integers(1, 30)))]
        elif kind == 2:
            out += [str(rng.choice(pool))] * int(rng.integers(1, 20))
        else:  # round-robin over a few: counters tie
            out += [f"t{i % 5}" for i in range(int(rng.integers(5, 40)))]
    values = rng.random((n, 3))
    values[rng.random((n, 3)) < 0.1] = np.nan
    values[rng.random((n, 3)) < 0.02] = np.inf
    return out[:n], values


def fill(summary: Summary, queries: list[str], values: np.ndarray, seed: int) -> None:
    """Added in batches of random sizes (a summary is a function of the lists, not the cuts)."""
    rng = np.random.default_rng(seed)
    finite = np.isfinite(values)
    clean = np.where(finite, values, 0.0)
    lo = 0
    while lo < len(queries):
        hi = min(len(queries), lo + int(rng.integers(1, 80)))
        summary.add(queries[lo:hi], clean[lo:hi], finite[lo:hi])
        lo = hi


def run_oracle(capacity: int, queries: list[str], values: np.ndarray) -> Oracle:
    oracle = Oracle(capacity, values.shape[1])
    for q, row in zip(queries, values.tolist(), strict=True):
        oracle.add(q, row)
    return oracle


@pytest.mark.parametrize("capacity", [1, 2, 5, 32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_summary_is_the_plain_misra_gries_to_the_bit(capacity: int, seed: int) -> None:
    queries, values = hostile(seed, 4_000)
    summary = Summary(capacity, 3)
    fill(summary, queries, values, seed)
    oracle = run_oracle(capacity, queries, values)
    assert held(summary) == oracle.held()
    assert (summary.offset, summary.total) == (oracle.offset, oracle.total)
    assert len(summary) <= 2 * capacity
    assert oracle.offset * (capacity + 1) <= oracle.total  # the stated bound on the offset
    exact: dict[str, int] = {}
    for q in queries:
        exact[q] = exact.get(q, 0) + 1
    for q, (lists, upper, _, _) in oracle.held().items():
        assert lists <= exact[q] <= upper
    for q, n in exact.items():  # a query over N / (k + 1) is held; one not held, <= offset
        assert q in oracle.rows if n > oracle.total / (capacity + 1) else True
        assert q in oracle.rows or n <= oracle.offset


def test_the_oracle_catches_a_purge_at_the_k_th_largest_counter() -> None:
    """Negative control: a summary that subtracts the k-th largest counter (one off) differs
    from the oracle on the same stream."""

    class OffByOne(Summary):
        __slots__ = ()

        def purge(self) -> None:
            self.capacity -= 1
            try:
                super().purge()
            finally:
                self.capacity += 1

    queries, values = hostile(0, 4_000)
    planted = OffByOne(5, 3)
    fill(planted, queries, values, 0)
    oracle = run_oracle(5, queries, values)
    assert held(planted) != oracle.held() or planted.offset != oracle.offset


def test_a_merge_is_the_query_by_query_sum_of_its_parts_with_the_bounds() -> None:
    """Three partitions' summaries merged (as a longer window or a segment is read): each
    held query's counts and sums are its parts' added in order, the offsets add, and the
    bounds hold against the exact counts over all three streams."""
    queries, values = hostile(5, 6_000)
    parts = [slice(0, 1_000), slice(1_000, 4_500), slice(4_500, 6_000)]
    oracles = [run_oracle(3, queries[p], values[p]) for p in parts]
    merged = Summary(3, 3)
    for i, p in enumerate(parts):
        one = Summary(3, 3)
        fill(one, queries[p], values[p], i)
        merged.merge(one)
    want: dict[str, list] = {}
    for oracle in oracles:
        for q, r in oracle.rows.items():
            w = want.setdefault(q, [0, 0, [0.0] * 3, [0] * 3])
            w[0] += r[0]
            w[1] += r[1]
            w[2] = [a + b for a, b in zip(w[2], r[2], strict=True)]
            w[3] = [a + b for a, b in zip(w[3], r[3], strict=True)]
    offset = sum(o.offset for o in oracles)
    assert held(merged) == {q: (w[1], w[0] + offset, w[2], w[3]) for q, w in want.items()}
    assert (merged.offset, merged.total) == (offset, len(queries))
    exact: dict[str, int] = {}
    for q in queries:
        exact[q] = exact.get(q, 0) + 1
    for q, n in exact.items():
        entry = merged.entry(q)
        if entry is None:
            assert n <= offset
        else:
            assert entry.lists <= n <= entry.lists_upper


def test_a_merged_summary_over_twice_the_capacity_takes_new_queries() -> None:
    """A restore folding two of the writer's segments into one (the overflow segment) merges
    their summaries: more than 2k held. The next new query purges it as the rule says (the
    oracle's purge of the merged state), where the table's growth once went negative."""
    a, b = Summary(2, 1), Summary(2, 1)
    a.add([f"a{i}" for i in range(4)], np.ones((4, 1)), np.ones((4, 1), bool))
    b.add(["b0", "b0", "b1", "b2", "b3"], np.ones((5, 1)), np.ones((5, 1), bool))
    a.merge(b)
    assert len(a) == 8
    a.add(["new"], np.full((1, 1), 0.5), np.ones((1, 1), bool))
    # counters 1 (a0-a3, b1-b3, new) and 2 (b0): the 3rd largest is 1, so b0 alone is left
    assert held(a) == {"b0": (2, 2, [2.0], [2])}
    assert (a.offset, a.total) == (1, 10)
