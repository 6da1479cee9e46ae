"""The click models' tables: key index, pair table, rank counts, horizon, sessions."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.clicks.counts import RankCounts
from evald.clicks.horizon import SPAN, Horizon
from evald.clicks.keyindex import KeyIndex, first_appearance
from evald.clicks.listlog import Base64Log
from evald.clicks.pairs import EVICT_SHARE, PairTable
from evald.clicks.sessions import Sessions, Vocabulary, concat, dedupe, pair_keys

keys_strategy = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=300)


@settings(max_examples=60, deadline=None)
@given(keys_strategy, keys_strategy)
def test_key_index_answers_as_a_dict(first: list[int], probes: list[int]) -> None:
    index = KeyIndex()
    reference: dict[int, int] = {}
    for half, chunk in enumerate((first[: len(first) // 2], first[len(first) // 2 :])):
        fresh = [k for k in dict.fromkeys(chunk) if k not in reference]
        values = np.arange(len(reference), len(reference) + len(fresh))
        keys = np.asarray(fresh, np.int64)
        found, ends = index.probe(keys)
        assert (found == -1).all()
        index.add(keys, values, ends if half else None)  # placed from where the probes ended
        reference.update(zip(fresh, values.tolist(), strict=True))
    asked = np.asarray(first + probes, np.int64)
    expected = [reference.get(k, -1) for k in asked.tolist()]
    assert index.find(asked).tolist() == expected
    assert len(index) == len(reference)


@settings(max_examples=60, deadline=None)
@given(keys_strategy, st.lists(st.booleans(), max_size=300), keys_strategy)
def test_key_index_remap_renumbers_and_removes_as_a_dict(
    first: list[int], removed: list[bool], later: list[int]
) -> None:
    """Evictions remove entries in place (tombstones); finds and later inserts still answer
    as a dict, through rounds of inserts (reusing tombstones, growing the table) and removals."""
    index = KeyIndex()
    reference: dict[int, int] = {}
    for round_ in range(4):
        chunk = first if round_ == 0 else [k ^ round_ for k in later]
        fresh = [k for k in dict.fromkeys(chunk) if k not in reference]
        values = np.arange(len(reference), len(reference) + len(fresh))
        index.add(np.asarray(fresh, np.int64), values)
        reference.update(zip(fresh, values.tolist(), strict=True))
        gone = [
            i < len(removed) and removed[(i + round_) % len(removed)] for i in range(len(reference))
        ]
        renumber = np.full(len(reference), -1)
        renumber[~np.asarray(gone, bool)] = np.arange(len(reference) - sum(gone))
        index.remap(renumber)
        reference = {k: int(renumber[v]) for k, v in reference.items() if renumber[v] >= 0}
        asked = np.asarray(first + later + chunk, np.int64)
        assert index.find(asked).tolist() == [reference.get(k, -1) for k in asked.tolist()]
        assert len(index) == len(reference)


def test_key_index_rebuilds_without_its_tombstones_once_they_fill_it() -> None:
    index = KeyIndex()  # 64 buckets
    index.add(np.arange(30, dtype=np.int64), np.arange(30))
    index.remap(np.where(np.arange(30) < 25, -1, np.arange(30) - 25))  # 25 tombstones, 5 kept
    index.add(np.arange(100, 105, dtype=np.int64), np.arange(5, 10))  # 35 + 5 > 32: rebuilt
    asked = np.asarray([*range(30), *range(100, 105)], np.int64)
    assert index.find(asked).tolist() == [-1] * 25 + list(range(10))
    assert len(index) == 10


def test_key_index_rebuild_forgets_the_rest() -> None:
    index = KeyIndex()
    index.add(np.arange(1000, dtype=np.int64), np.arange(1000))
    index.rebuild(np.asarray([5, 7]), np.asarray([0, 1]))
    assert index.find(np.asarray([5, 7, 6])).tolist() == [0, 1, -1]


def test_first_appearance_keeps_input_order() -> None:
    distinct, position = first_appearance(np.asarray([9, 3, 9, 1, 3]))
    assert distinct.tolist() == [9, 3, 1]
    assert position.tolist() == [0, 1, 0, 2, 1]


def test_pair_table_drops_the_lightest_then_the_oldest() -> None:
    table = PairTable(cap=16)
    keys = np.arange(1, 18, dtype=np.int64)  # 17 pairs: one over the cap
    slots = table.insert(keys, table.lookup(keys))
    table.weight[slots] = 5.0
    table.weight[slots[[3, 9]]] = 1.0  # the two lightest, pair 4 older than pair 10
    dropped = table.evict()
    # one over the cap drops down to cap - cap // EVICT_SHARE: two pairs
    assert len(dropped) == 17 - (16 - 16 // EVICT_SHARE)
    assert sorted(dropped.tolist()) == sorted(slots[[3, 9]].tolist())
    assert table.lookup(np.asarray([4, 10, 5])).tolist() == [-1, -1, slots[4]]
    # a dropped pair is cold: seen again, it gets a free slot back, smallest first
    again = table.insert(np.asarray([10]), table.lookup(np.asarray([10])))
    assert again.tolist() == [min(dropped.tolist())]


def test_pair_table_state_round_trips() -> None:
    table = PairTable(cap=20)
    keys = np.asarray([5, 2, 5, 9], np.int64)
    table.insert(keys, table.lookup(keys))
    copy = PairTable.build(table.meta(), table.arrays())
    assert copy.lookup(keys).tolist() == table.lookup(keys).tolist()
    assert copy.insert(np.asarray([77]), np.asarray([-1])).tolist() == [3]


def test_rank_counts_add_by_cell_and_drop_slots() -> None:
    counts = RankCounts()
    counts.add(
        np.asarray([0, 1, 0]),
        np.asarray([0, 0, 0]),
        np.asarray([2, 2, 2]),
        np.ones(3),
        np.asarray([1.0, 0, 0]),
    )
    slot, _segment, rank, n, c = counts.view()
    assert (slot.tolist(), rank.tolist(), n.tolist(), c.tolist()) == (
        [0, 1],
        [2, 2],
        [2.0, 1.0],
        [1.0, 0.0],
    )
    counts.drop_slots(np.asarray([0]))
    assert counts.view()[0].tolist() == [1]
    counts.add(np.asarray([1]), np.asarray([0]), np.asarray([2]), np.ones(1), np.ones(1))
    assert counts.view()[3].tolist() == [2.0]  # found again after the rebuild
    copy = RankCounts.build("x", counts.arrays("x"))
    assert [a.tolist() for a in copy.view()] == [a.tolist() for a in counts.view()]


def test_horizon_halves_weight_per_half_life_and_moves_its_reference() -> None:
    horizon = Horizon(half_life=1000)
    assert horizon.first_jump(np.asarray([5, 6])) == 0  # the first time sets the reference
    assert horizon.advance(5) == 1.0
    assert horizon.weights(np.asarray([5, 1005, -995])).tolist() == [1.0, 2.0, 0.5]
    far = 5 + SPAN * 1000 + 1
    assert horizon.first_jump(np.asarray([6, far, far + 1])) == 1
    assert horizon.advance(far) == pytest.approx(2.0 ** (-(far - 5) / 1000))
    assert Horizon(None).weights(np.asarray([0, 10**12])).tolist() == [1.0, 1.0]


def test_dedupe_sums_weights_of_identical_sessions() -> None:
    s = Sessions.build([[1, 2], [1, 2], [2, 1], [1, 2]], [[1, 0], [1, 0], [1, 0], [0, 0]])
    d = dedupe(s)
    assert d.pairs.tolist() == [[1, 2], [2, 1], [1, 2]]
    assert d.clicks.tolist() == [[True, False], [True, False], [False, False]]
    assert d.weights.tolist() == [2.0, 1.0, 1.0]
    assert len(concat([s, d])) == 7


def test_sessions_build_cuts_to_depth_and_refuses_mismatched_rows() -> None:
    s = Sessions.build([[1, 2, 3], [4]], [[0, 0, 1], [1]], depth=2)
    assert s.pairs.tolist() == [[1, 2], [4, 0]]
    assert s.lengths.tolist() == [2, 1]
    assert s.shown().tolist() == [[True, True], [True, False]]
    with pytest.raises(ValueError, match="session 0: 2 pairs but 1 click marks"):
        Sessions.build([[1, 2]], [[1]])


def test_pair_keys_and_vocabulary() -> None:
    keys = pair_keys(np.asarray([1, 2]), np.asarray([[10, 11], [10, 11]]))
    assert len({int(k) for k in keys.ravel()}) == 4  # same items under two queries differ
    vocab = Vocabulary()
    assert [vocab.id("a"), vocab.id("b"), vocab.id("a"), vocab.get("zz")] == [1, 2, 1, 0]
    assert len(vocab) == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=7), max_size=6), max_size=4))
def test_base64_log_equals_encoding_the_whole_log_each_time(runs: list[list[bytes]]) -> None:
    text = Base64Log()
    for run in runs:  # each run is a new log (a snapshot started it over) grown batch by batch
        batches: list[bytes] = []
        assert text.text(batches) == ""
        for batch in run:
            batches.append(batch)
            assert text.text(batches) == base64.b64encode(b"".join(batches)).decode()
            assert text.text(batches) == base64.b64encode(b"".join(batches)).decode()
