"""Attached feedback chains and held feedback, each through its public interface."""

from __future__ import annotations

import numpy as np

from evald.join.feedback import AttachedFeedback, HeldEntry, HeldFeedback


def test_chains_credit_the_first_rank_of_each_item_and_recycle_entries() -> None:
    attached = AttachedFeedback(capacity=2)  # grows on the third entry
    head_a = attached.add(0, hash("x"), 1.0, evid=7, off=11)
    head_a = attached.add(head_a, hash("y"), 3.0, evid=0, off=0)
    head_a = attached.add(head_a, hash("nope"), 1.0, evid=0, off=12)
    head_b = attached.add(0, hash("x"), 2.0, evid=0, off=0)
    head_b = attached.add(head_b, hash("ghost"), 1.0, evid=0, off=0)
    assert attached.has_event(head_a, 7) and not attached.has_event(head_b, 7)
    assert sorted(attached.offsets(head_a)) == [10, 11]
    assert attached.low_offset() == 10
    items = np.array([[hash("x"), hash("y"), hash("x")], [hash("z"), hash("x"), 0]], np.int64)
    mask = np.array([[True, True, True], [True, True, False]])
    grades = np.zeros(items.shape)
    missing = attached.credit(np.array([head_a, head_b], np.int32), items, mask, grades)
    assert grades.tolist() == [[1.0, 3.0, 0.0], [0.0, 2.0, 0.0]]
    # "nope" and "ghost": graded once, when their impression closes, re-fed or not
    assert missing == 2
    assert attached.low_offset() is None
    assert attached.add(0, 1, 1.0, 0, 0) - 1 in range(5)  # a freed entry is reused


def _entry(rid: str, deadline: int, evid: int = 0, replayed: bool = False) -> HeldEntry:
    return HeldEntry(rid, deadline - 10, 1, 1.0, evid, deadline, replayed, deadline)


def test_held_feedback_is_claimed_or_expired_once() -> None:
    held = HeldFeedback()
    held.add(_entry("a", 100, evid=5))
    held.add(_entry("a", 300))
    held.add(_entry("b", 200, replayed=True))
    held.add(_entry("c", 50))
    assert len(held) == 4 and held.waiting() == 3
    assert held.has_event("a", 5) and not held.has_event("b", 5)
    assert sorted(held.offsets()) == [49, 99, 199, 299]
    assert [e.deadline for e in held.claim("a")] == [100, 300]
    assert list(held.claim("a")) == []
    assert held.min_deadline() == 50
    assert held.expire_oldest() == 1  # "c"
    assert held.expire_due(250) == 0  # "b" was re-fed: not counted; "a"'s are gone already
    assert len(held) == 0 and held.waiting() == 0
    held.add(_entry("d", 400))
    assert held.expire_all() == 1 and len(held) == 0
