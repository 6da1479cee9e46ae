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
