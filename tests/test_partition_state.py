"""The partition's state as a checkpoint's fields: its counters come back as written, and a
checkpoint written before they existed reads with none."""

from __future__ import annotations

from evald.partition_state import PartitionState


def test_counters_round_trip_and_are_left_out_when_empty() -> None:
    state = PartitionState(5, {"impression": 1, "feedback": 2}, counters={"abandoned": 3})
    doc = state.to_json()
    assert doc["counters"] == {"abandoned": 3}
    assert PartitionState.from_json(doc) == state
    bare = PartitionState(5, {"impression": 1, "feedback": 2})
    assert "counters" not in bare.to_json()
    assert PartitionState.from_json(bare.to_json()).counters == {}
