"""Shared renderings: concurrent scrapes of the same output wait for one build and get its bytes.

Why: a burst of scrapers then costs one rendering, not one each, and never holds several bodies
in memory (:class:`SingleFlight`, used by :class:`evald.exposition.encoder.Encoder`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["SingleFlight"]


class _Flight(Generic[T]):
    __slots__ = ("done", "error", "result", "waiters")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.waiters = 0


class SingleFlight(Generic[T]):
    """At most one build per key at a time; callers arriving meanwhile share its result.

    Nothing is kept once a build finishes, so a caller that arrives after it sees fresh state:
    sharing never makes a sequential reader's answer older, it only merges concurrent ones.
    A build that raises raises in every caller that waited for it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[Hashable, _Flight[T]] = {}

    def run(self, key: Hashable, build: Callable[[], T]) -> T:
        with self._lock:
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
            else:
                flight.waiters += 1
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.result  # type: ignore[return-value]  # set before done, error is None
        try:
            result = flight.result = build()
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()
        return result

    def waiting(self) -> int:
        """Callers currently waiting for another caller's build (for tests and debugging)."""
        with self._lock:
            return sum(flight.waiters for flight in self._flights.values())
