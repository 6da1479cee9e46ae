"""How long a /metrics scrape may wait for the engine the poll loop is using.

Why: the loop holds the daemon's lock around every engine access, commits included, and a
commit waits on the broker: a flush, the transaction's offsets and the commit each for up to
``kafka.request_timeout_ms`` / ``kafka.transaction_timeout_ms``, over a minute in all while a
coordinator is dead. A scrape that waited for that lock held one of the HTTP server's two
worker threads; two scrapes held both, and /healthz and /readyz queued behind them: evald
answered nothing for 60 s after a group-coordinator kill, just when its probes mattered. A
scrape now waits at most ``wait_s`` and is served without the engine's series (the daemon's
own series, ``evald_ready`` among them, do not need the lock).
"""

from __future__ import annotations

import threading
from types import TracebackType

__all__ = ["EngineBusy", "ScrapeLock"]

#: how long a scrape waits for the loop to let go of the engine
SCRAPE_WAIT_S = 1.0


class EngineBusy(TimeoutError):
    """The loop held the engine longer than a scrape waits (a commit waiting on the broker)."""


class ScrapeLock:
    """The daemon's lock as a context manager that gives up after ``wait_s``."""

    def __init__(self, lock: threading.RLock, wait_s: float = SCRAPE_WAIT_S) -> None:
        self._lock = lock
        self.wait_s = wait_s

    def __enter__(self) -> ScrapeLock:
        if not self._lock.acquire(timeout=self.wait_s):
            raise EngineBusy(
                f"the poll loop held the engine for over {self.wait_s:g}s (a commit waiting "
                "on the broker?): this scrape leaves the engine's series out"
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()
