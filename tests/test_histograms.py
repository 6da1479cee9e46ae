"""Histograms as values: summed segment by segment across engines that number segments
differently, and what a process's commits held across its sessions."""

from __future__ import annotations

import numpy as np

from evald.histograms import Committed, Histograms
from evald.stats import Stats


def histograms(segments: tuple[tuple[str, ...], ...], scale: int) -> Histograms:
    n = len(segments)
    counts = np.arange(n * 2 * 3, dtype=np.int64).reshape(n, 2, 3) * scale
    sums = np.arange(n * 2, dtype=np.float64).reshape(n, 2) * scale
    return Histograms(segments, counts, sums, sums * 2, np.arange(n, dtype=np.int64), scale)


def test_plus_matches_segments_by_their_labels() -> None:
    a = histograms((("x",), ("y",)), 1)
    b = histograms((("y",), ("z",)), 10)
    total = a.plus(b)
    assert total.segments == (("x",), ("y",), ("z",))
    np.testing.assert_array_equal(total.counts[0], a.counts[0])
    np.testing.assert_array_equal(total.counts[1], a.counts[1] + b.counts[0])
    np.testing.assert_array_equal(total.counts[2], b.counts[1])
    assert total.abandoned.tolist() == [0, 1 + 0, 1]
    assert total.overflow == 11


def test_a_session_s_commits_add_to_the_sessions_before_and_its_tail_is_dropped() -> None:
    committed = Committed()
    committed.session_started()
    first = histograms((("x",),), 1)
    committed.commit(first, Stats(), [{"events/impression/accepted": 2}])
    # the session goes on scoring and dies before its next commit: nothing of it is kept
    committed.session_started()
    second = histograms((("y",), ("x",)), 5)
    lag = Stats()
    lag.observe_lag(0.2, 4)
    committed.commit(second, lag, [{"events/impression/accepted": 3}])
    held = committed.histograms
    assert held is not None and held.segments == (("x",), ("y",))
    np.testing.assert_array_equal(held.counts[0], first.counts[0] + second.counts[1])
    assert committed.counted.events[("impression", "accepted")] == 5
    assert committed.counted.lag_count == 4
    second.counts[:] = 0  # a copy was kept, not the engine's arrays
    assert held.counts[1].sum() > 0
