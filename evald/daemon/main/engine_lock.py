"""The daemon's engine lock: re-entrant, and let go of while the poll loop waits on the broker.

Why: the loop holds the lock around every engine access, and a commit waits on the broker (a
flush, the transaction's offsets, EndTxn) for up to ``kafka.request_timeout_ms`` /
``kafka.transaction_timeout_ms`` each. Scrapes and the status line only read the engine, and
only the committing thread changes it (the loop thread, or a rebalance callback while the loop
thread is blocked in ``poll()``), so while that thread waits on the broker nothing can change
under a reader: :meth:`EngineLock.released` lets them in for the wait. It refuses
to release a lock taken more than once, since an outer ``with`` up the stack would then run
its locked block with the engine unlocked without knowing it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

__all__ = ["EngineLock"]


class EngineLock:
    """A re-entrant lock that knows how often its owner took it (``threading.RLock`` hides
    that), so that :meth:`released` can check it is let go of entirely."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Like ``RLock.acquire``: True once taken (again, by its owner)."""
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner, self._depth = me, 1
        return True

    def release(self) -> None:
        """Undo one ``acquire`` of the calling thread."""
        if self._owner != threading.get_ident():
            raise RuntimeError("the engine lock is released by a thread that does not hold it")
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    def held(self) -> int:
        """How many times the calling thread holds the lock (0: it does not)."""
        return self._depth if self._owner == threading.get_ident() else 0

    @contextmanager
    def released(self) -> Iterator[None]:
        """Let readers in while the caller, which holds the lock exactly once, waits on
        something that does not touch the engine; the lock is taken back afterwards, also
        when the wait raises."""
        depth = self.held()
        if depth != 1:
            raise RuntimeError(
                f"the engine lock must be held exactly once to be released for a wait, "
                f"not {depth} times"
            )
        self.release()
        try:
            yield
        finally:
            self.acquire()

    def __enter__(self) -> EngineLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
