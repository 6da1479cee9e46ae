"""The injectable clock the tests move by hand, so time-dependent code runs without sleeping."""

from __future__ import annotations


class SettableClock:
    """Returns ``now`` (seconds); tests advance it by assigning or adding to it."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
