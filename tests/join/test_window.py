"""The attribution-window rule, the one place the join's comparisons with the window live."""

from __future__ import annotations

import numpy as np

from evald.join.window import complete_before, deadline, is_closed, misses_window

WINDOW = 600_000


def test_an_impression_closes_when_its_deadline_reaches_the_watermark() -> None:
    due = deadline(1_000, WINDOW)
    assert due == 601_000
    assert not is_closed(due, None)  # no event yet: nothing closes
    assert not is_closed(due, due - 1)
    assert is_closed(due, due)  # the boundary is closed
    assert is_closed(due, due + 1)


def test_deadlines_of_many_impressions_at_once() -> None:
    assert deadline(np.array([0, 5]), WINDOW).tolist() == [WINDOW, WINDOW + 5]


def test_complete_before_is_the_first_impression_time_still_open() -> None:
    watermark = 5_000_000
    first_open = complete_before(watermark, WINDOW)
    assert not is_closed(deadline(first_open, WINDOW), watermark)
    assert is_closed(deadline(first_open - 1, WINDOW), watermark)


def test_feedback_counts_inside_the_window_both_ends_included() -> None:
    assert misses_window(1_000, 999, WINDOW) == "early"
    assert misses_window(1_000, 1_000, WINDOW) is None
    assert misses_window(1_000, 1_000 + WINDOW, WINDOW) is None
    assert misses_window(1_000, 1_001 + WINDOW, WINDOW) == "late"
