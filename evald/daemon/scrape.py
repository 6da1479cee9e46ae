"""How long a /metrics scrape may wait for the engine the poll loop is using.

Why: the loop holds the daemon's lock around every engine access. A commit lets go of it while
it waits on the broker (engine_lock.py), but the loop still holds it across a whole poll's
processing and across restoring a partition, which reads its checkpoint and results from the
broker. A scrape that waits for the lock holds one of the HTTP server's two rendering threads
(the probes have their own since, evald.http), so it waits at most ``wait_s``; the engine
collector then serves the last complete page again, with ``evald_engine_series_age_seconds``
saying how old (the daemon's own series, ``evald_ready`` among them, do not need the lock).
"""

from __future__ import annotations

from types import TracebackType

from evald.daemon.main.engine_lock import EngineLock

__all__ = ["EngineBusy", "ScrapeLock"]

#: how long a scrape waits for the loop to let go of the engine
SCRAPE_WAIT_S = 1.0


class EngineBusy(TimeoutError):
    """The loop held the engine longer than a scrape waits."""


class ScrapeLock:
    """The daemon's lock as a context manager that gives up after ``wait_s``."""

    def __init__(self, lock: EngineLock, wait_s: float = SCRAPE_WAIT_S) -> None:
        self._lock = lock
        self.wait_s = wait_s

    def __enter__(self) -> ScrapeLock:
        if not self._lock.acquire(timeout=self.wait_s):
            raise EngineBusy(
                f"the poll loop held the engine for over {self.wait_s:g}s (a large poll, or a "
                "restore reading from the broker?)"
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()
