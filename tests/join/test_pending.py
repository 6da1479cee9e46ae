"""PendingImpressions: slots, columns and arenas survive growth, release and compaction."""

from __future__ import annotations

import numpy as np

from evald.join.pending import PendingImpressions


def test_slots_keep_their_items_and_ids_through_growth_reuse_and_compaction() -> None:
    pending = PendingImpressions(capacity=4)
    rng = np.random.default_rng(8)
    live: dict[int, tuple[int, list[str], str]] = {}
    for k in range(6_000):
        if live and rng.random() < 0.4:
            gone = [s for s in list(live)[: int(rng.integers(1, 50))]]
            for slot in gone:
                del live[slot]
            pending.release(gone)
        items = [f"{k}-{j}" for j in range(int(rng.integers(0, 30)))]
        rid = f"r{k}" + "é" * int(rng.integers(0, 20))
        slot = pending.new_slot()
        pending.fill(slot, ts=k, key=k + 2, label=k % 3, item_ids=items, rid=rid)
        live[slot] = (k, items, rid)
    pending.compact_items()
    pending.compact_rids()
    idx = np.asarray(sorted(live), dtype=np.intp)
    assert sorted(pending.live_slots().tolist()) == idx.tolist()
    hashes, mask, lengths = pending.items(idx)
    assert pending.request_ids(idx) == [live[s][2] for s in idx.tolist()]
    assert pending.label_ids(idx) == [live[s][0] % 3 for s in idx.tolist()]
    for row, slot in enumerate(idx.tolist()):
        ts, items, _ = live[slot]
        assert pending.ts[slot] == ts and pending.key[slot] == ts + 2
        assert lengths[row] == len(items)
        assert hashes[row][mask[row]].tolist() == [hash(i) for i in items]


def test_a_slot_given_back_unused_is_the_next_one_handed_out() -> None:
    pending = PendingImpressions()
    slot = pending.new_slot()
    pending.free_slot(slot)
    assert pending.new_slot() == slot


def test_the_cluster_column_is_kept_per_slot_and_cleared_with_it():
    """The user's cluster key rides with the impression; a recycled slot starts without one."""
    pending = PendingImpressions(capacity=2)
    slots = [pending.new_slot() for _ in range(3)]  # grows the columns once
    for slot, key in zip(slots, [2**63 + 5, 0, 7], strict=True):
        pending.fill(slot, 0, slot + 10, 0, ["a"], f"r{slot}", key)
    assert pending.clusters(np.asarray(slots)).tolist() == [2**63 + 5, 0, 7]
    pending.release(slots[:1])
    again = pending.new_slot()
    assert again == slots[0]
    pending.fill(again, 0, 99, 0, ["a"], "r-again")  # no user id this time
    assert pending.clusters(np.asarray([again])).tolist() == [0]
    more = [pending.new_slot() for _ in range(6)]  # the columns grow again, this one too
    pending.fill(more[-1], 0, 123, 0, ["a"], "r-more", 9)
    assert pending.clusters(np.asarray([slots[2], more[-1]])).tolist() == [7, 9]


def test_the_clusters_are_zero_while_no_impression_had_a_user_id():
    pending = PendingImpressions(capacity=2)
    slot = pending.new_slot()
    pending.fill(slot, 0, 10, 0, ["a"], "r0")
    assert pending.clusters(np.asarray([slot])).tolist() == [0]
    pending.release([slot])
