"""Capped exponential backoff with full jitter, for retrying transient broker errors forever."""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """Delays for successive failures: ``initial * 2**n`` capped at ``maximum``, jittered.

    Full jitter (uniform in [delay/2, delay]) keeps a fleet of instances that lost the same
    broker from reconnecting in lock step. ``reset()`` after a success.
    """

    def __init__(
        self, initial_s: float, maximum_s: float, rand: Callable[[], float] = random.random
    ) -> None:
        if not 0 < initial_s <= maximum_s:
            raise ValueError("need 0 < initial_s <= maximum_s")
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self._rand = rand
        self.failures = 0

    def next_delay(self) -> float:
        """Record one more failure and return how long to wait before the next attempt."""
        ceiling = min(self.maximum_s, self.initial_s * (2 ** min(self.failures, 62)))
        self.failures += 1
        return ceiling * (0.5 + 0.5 * self._rand())

    def reset(self) -> None:
        """The last attempt worked: start again from ``initial_s``."""
        self.failures = 0
