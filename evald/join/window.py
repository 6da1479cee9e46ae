"""The attribution-window rule: the one home of "when does an impression close, when does
feedback count for it" (docs/semantics.md).

An impression served at ``ts`` closes once the partition's watermark reaches its deadline
``ts + window``; feedback at ``fb_ts`` counts for it when ``ts <= fb_ts <= ts + window``; feedback
whose impression is not pending waits until the watermark reaches ``fb_ts + window`` (no
impression that could still arrive on time can claim it after that). Everything else in the
join asks these functions instead of restating the comparison.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

T = TypeVar("T", int, np.ndarray)


def deadline(ts: T, window: int) -> T:
    """Watermark at which an event at ``ts`` closes: its impression, or its wait when held."""
    return ts + window


def open_deadline(ts: int, window: int, watermark: int | None) -> int | None:
    """Deadline of an event at ``ts`` (``deadline``), or None when it is closed already: the
    per-event form of ``deadline`` then ``is_closed``, one call."""
    due = ts + window
    return None if watermark is not None and due <= watermark else due


def is_closed(due: int, watermark: int | None) -> bool:
    """Whether something with deadline ``due`` is closed at ``watermark`` (None: no event yet)."""
    return watermark is not None and due <= watermark


def complete_before(watermark: int, window: int) -> int:
    """First impression time not yet closed at ``watermark``: every earlier one is final."""
    return watermark - window + 1


def misses_window(imp_ts: int, fb_ts: int, window: int) -> str | None:
    """Why feedback at ``fb_ts`` does not count for an impression at ``imp_ts``: "early"
    (before it was served), "late" (after its window), or None when it counts."""
    if fb_ts < imp_ts:
        return "early"
    if fb_ts > imp_ts + window:
        return "late"
    return None
