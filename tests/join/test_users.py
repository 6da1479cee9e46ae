"""UserIds: interned user ids of pending impressions, recycled when no impression uses them."""

from __future__ import annotations

from evald.join.pending import PendingImpressions
from evald.join.users import UserIds


def test_one_id_per_user_and_none_for_no_user():
    users = UserIds()
    alice = users.acquire("alice")
    assert users.acquire("alice") == alice and users.acquire("bob") not in (0, alice)
    assert users.acquire(None) == 0 and users.acquire("") == 0
    assert users.names([alice, 0]) == ["alice", None]


def test_an_entry_is_recycled_when_its_last_reference_goes():
    users = UserIds()
    alice = users.acquire("alice")
    users.acquire("alice")
    users.release([alice, 0])
    assert len(users) == 1  # one reference left
    users.release([alice])
    assert len(users) == 0
    assert users.acquire("carol") == alice  # the id is reused
    assert users.names([alice]) == ["carol"]


def test_pending_impressions_give_back_their_user_ids_and_a_reused_slot_has_none():
    pending = PendingImpressions(capacity=2)
    slots = [pending.new_slot() for _ in range(3)]  # grows the columns once
    for slot, user in zip(slots, ["u1", None, "u1"], strict=True):
        pending.fill(slot, 0, slot + 10, 0, ["a"], f"r{slot}", user)
    assert pending.user_ids(slots) == ["u1", None, "u1"]
    assert pending.user_count() == 1
    pending.release(slots[:1])
    assert pending.user_ids(slots[1:]) == [None, "u1"]
    again = pending.new_slot()
    assert again == slots[0]
    pending.fill(again, 0, 99, 0, ["a"], "r-again")  # no user id this time
    assert pending.user_ids([again]) == [None]
    pending.release([*slots[1:], again])
    assert pending.user_count() == 0  # the table empties with the pending state
