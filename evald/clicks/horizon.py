"""Horizon: the rolling horizon of the click statistics, as an exponential decay in event time.

A session's statistics count with weight 2^((ts - ref) / half_life): a session one half-life
older than another counts half as much. All statistics are stored relative to one reference
time ``ref``, so adding, comparing and merging them needs no per-row time. When an event runs
more than ``SPAN`` half-lives past ``ref``, the reference moves to it and every stored
statistic is multiplied by the factor ``advance`` returns (weights stay below 2^SPAN, far
from overflow). The reference moves only at a session's time, in input order, so the same
sessions in the same order give the same floats however they were batched.

``half_life`` None: no decay, every session counts 1 (the horizon is everything seen).
"""

from __future__ import annotations

import numpy as np

#: half-lives an event may run ahead of the reference before the reference moves to it
SPAN = 16


class Horizon:
    """The decay's reference time and the weight of a session time."""

    def __init__(self, half_life: int | None) -> None:
        if half_life is not None and half_life <= 0:
            raise ValueError("half_life must be > 0 ms (or None: no decay)")
        self.half_life = half_life
        self.ref: int | None = None

    def first_jump(self, ts: np.ndarray) -> int:
        """Index of the first session whose time moves the reference (len(ts): none)."""
        if self.half_life is None or len(ts) == 0:
            return len(ts)
        if self.ref is None:
            return 0
        ahead = np.flatnonzero(ts > self.ref + SPAN * self.half_life)
        return int(ahead[0]) if len(ahead) else len(ts)

    def advance(self, ts: int) -> float:
        """Move the reference to ``ts``; returns the factor stored statistics are multiplied
        by (1.0 the first time: nothing is stored yet)."""
        if self.half_life is None:
            return 1.0
        old, self.ref = self.ref, int(ts)
        if old is None:
            return 1.0
        return float(np.exp2(-(self.ref - old) / self.half_life))

    def weights(self, ts: np.ndarray) -> np.ndarray:
        """float64 (n,): each session's weight relative to the reference."""
        if self.half_life is None or self.ref is None:
            return np.ones(len(ts))
        return np.exp2((np.asarray(ts, np.int64) - self.ref) / self.half_life)

    def factor_to(self, ref: int | None) -> float:
        """The factor that re-expresses statistics stored at this reference at ``ref``."""
        if self.half_life is None or self.ref is None or ref is None:
            return 1.0
        return float(np.exp2(-(ref - self.ref) / self.half_life))
