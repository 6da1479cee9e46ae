import random

import pytest

from evald.segments import NONE, OTHER, LabelTable, SegmentIndex


def test_missing_and_overflowing_values():
    index = SegmentIndex(["model", "arm"], cap=2)
    a = index.segment_of({"model": "m1", "arm": "A", "other": "ignored"})
    assert index.segments[a] == ("m1", "A")
    assert index.segment_of({"model": "m1", "arm": "A"}) == a
    b = index.segment_of({"arm": "B"})
    assert index.labels_of(b) == {"model": NONE, "arm": "B"}
    index.segment_of({"model": "m2", "arm": "A"})
    c = index.segment_of({"model": "m3", "arm": "C"})  # both keys are full now
    assert index.segments[c] == (OTHER, OTHER)
    assert index.segment_of({"model": "m1", "arm": "B"}) != c  # known values still map
    assert index.value_counts() == [2, 2]


def test_segment_count_is_bounded_whatever_the_input():
    index = SegmentIndex(["k1", "k2"], cap=3)
    for i in range(5_000):
        index.segment_of({"k1": str(i), "k2": str(i * 7 % 11)})
    assert len(index) <= 4 * 4
    assert {s[0] for s in index.segments} <= {"0", "1", "2", OTHER}


def test_label_table_interns_and_recycles():
    table = LabelTable(SegmentIndex(["arm"], cap=10))
    first = table.acquire({"arm": "A", "x": "1"})
    assert table.acquire({"arm": "A", "x": "1"}) == first
    other = table.acquire({"arm": "B"})
    assert table.labels[first] == {"arm": "A", "x": "1"}
    assert table.segment[first] != table.segment[other]
    table.release(first)
    assert len(table) == 2
    table.release(first)
    assert len(table) == 1
    again = table.acquire({"arm": "C"})
    assert again == first  # the freed id is reused
    assert table.labels[again] == {"arm": "C"}


def test_combinations_past_max_segments_go_to_the_overflow_segment():
    index = SegmentIndex(["model", "arm"], cap=50, max_segments=2)
    a = index.segment_of({"model": "m1", "arm": "A"})
    b = index.segment_of({"model": "m2", "arm": "B"})
    assert index.overflow_id is None
    folded = index.segment_of({"model": "m1", "arm": "B"})  # a third, new combination
    assert index.segments[folded] == (OTHER, OTHER)
    assert index.overflow_id == folded
    assert index.segment_of({"model": "m3", "arm": "C"}) == folded
    # kept combinations still map to themselves, first come first kept
    assert index.segment_of({"arm": "A", "model": "m1"}) == a
    assert index.segment_of({"model": "m2", "arm": "B", "x": "y"}) == b
    assert len(index) == 3


def test_refused_combinations_do_not_use_up_the_value_caps():
    index = SegmentIndex(["model"], cap=2, max_segments=1)
    index.segment_of({"model": "m1"})
    for i in range(10):
        index.segment_of({"model": f"refused{i}"})
    assert index.value_counts() == [1]


def test_an_all_other_combination_reached_by_the_value_caps_is_the_overflow_segment():
    index = SegmentIndex(["model"], cap=1, max_segments=5)
    index.segment_of({"model": "m1"})
    natural = index.segment_of({"model": "m2"})  # past the value cap: (__other__,), kept
    assert index.segments[natural] == (OTHER,)
    assert index.overflow_id == natural
    for i in range(10):
        index.segment_of({"model": f"m{i}", "other": str(i)})
    assert len(index) == 2


def test_segment_count_never_exceeds_max_segments_plus_one():
    rng = random.Random(7)
    index = SegmentIndex(["k1", "k2", "k3"], cap=50, max_segments=40)
    ids = []
    for _ in range(20_000):
        labels = {k: str(rng.randrange(60)) for k in ("k1", "k2", "k3") if rng.random() < 0.9}
        ids.append(index.segment_of(labels))
    assert len(index) == 41
    assert len(set(index.segments)) == len(index)  # one id per tuple
    assert max(ids) == 40
    assert index.segments[index.overflow_id] == (OTHER, OTHER, OTHER)


def test_without_max_segments_only_the_value_caps_bound_the_segments():
    index = SegmentIndex(["k1", "k2"], cap=10)
    for i in range(100):
        index.segment_of({"k1": str(i % 10), "k2": str(i // 10)})
    assert len(index) == 100 and index.overflow_id is None


def test_id_of_maps_a_folded_segment_back_without_reading_its_markers_as_values():
    source = SegmentIndex(["model", "arm"], cap=1)
    for labels in ({"model": "a", "arm": "x"}, {"model": "b"}, {"arm": "y"}):
        source.segment_of(labels)
    assert source.segments == [("a", "x"), (OTHER, NONE), (NONE, OTHER)]
    target = SegmentIndex(["model", "arm"], cap=1)
    ids = [target.id_of(segment) for segment in reversed(source.segments)]
    assert [target.segments[i] for i in ids] == list(reversed(source.segments))
    assert target.value_counts() == [1, 1]  # the markers used up no cap
    assert target.segment_of({"model": "a", "arm": "x"}) == ids[2]
    with pytest.raises(ValueError, match="2 values"):
        target.id_of(["a"])
