import random
import zlib

import pytest

from evald.daemon.main import snapshots
from evald.daemon.main.checkpoint import ResultRange, SnapshotRef

HOUR = 3_600_000


def ref(size: int, written_ms: int = 0) -> SnapshotRef:
    return SnapshotRef((7,), size, 0, written_ms)


def test_the_first_snapshot_comes_after_the_minimum_number_of_results() -> None:
    few = (ResultRange(0, snapshots.MIN_RESULTS_BETWEEN - 1),)
    enough = (ResultRange(0, 10), ResultRange(20, 20 + snapshots.MIN_RESULTS_BETWEEN - 10))
    assert not snapshots.due(few, None, 0)
    assert snapshots.due(enough, None, 0)


def test_a_big_snapshot_is_renewed_only_when_rereading_results_would_cost_more() -> None:
    big = ref(10_000_000)  # worth 50,000 results of RESULT_BYTES
    below = (ResultRange(0, 49_999),)
    assert not snapshots.due(below, big, 1)
    assert snapshots.due((ResultRange(0, 50_000),), big, 1)
    small = ref(1_000)
    assert not snapshots.due((ResultRange(0, snapshots.MIN_RESULTS_BETWEEN - 1),), small, 1)
    assert snapshots.due((ResultRange(0, snapshots.MIN_RESULTS_BETWEEN),), small, 1)


def test_an_old_snapshot_is_renewed_before_retention_can_reach_it() -> None:
    old = ref(1_000, written_ms=5)
    assert not snapshots.due((), old, 5 + HOUR - 1)
    assert snapshots.due((), old, 5 + HOUR)
    assert snapshots.MAX_AGE_MS == HOUR


def test_chunks_fit_a_record_and_join_back_checked() -> None:
    raw = random.Random(1).randbytes(3 * snapshots.CHUNK_BYTES + 7)
    parts = snapshots.chunks(raw)
    assert len(parts) == 4 and all(len(p) <= snapshots.CHUNK_BYTES for p in parts)
    good = SnapshotRef((1, 2, 3, 4), len(raw), zlib.crc32(raw), 0)
    assert snapshots.whole(parts, good) == raw
    assert snapshots.chunks(b"") == [b""]
    with pytest.raises(ValueError, match="CRC"):
        snapshots.whole(parts[:-1], good)
    with pytest.raises(ValueError, match="CRC"):
        snapshots.whole([parts[1], parts[0], *parts[2:]], good)
