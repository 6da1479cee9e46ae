"""Stop signals for foreground loops, handled without taking a lock in the signal handler.

Why not ``threading.Event``: Python runs a signal handler in the main thread between two
bytecodes. When that thread is inside ``Event.wait()`` at a moment it holds the Event's lock
(it takes it again on every wake-up), an ``Event.set()`` in the handler waits for a lock its
own thread holds: a deadlock that only kill -9 ends (seen on `make kafka`, once in 15 Ctrl-C).

Here the handler only stores the signal's name, and the C-level wakeup file descriptor
(``signal.set_wakeup_fd``) writes the signal's number to a pipe that :meth:`StopSignals.wait`
selects on, so a wait ends at once, on whichever thread the kernel delivered the signal to.
Installed only in the main thread (the only one Python delivers signals to); elsewhere nothing
is installed and ``wait`` just sleeps. On leaving, the previous handlers come back, unless a
stop signal arrived: then these signals are ignored from there on, since the process is
stopping and a repeat would only interrupt its clean-up.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """A context manager: while open, ``signals`` ask the loop to stop (:attr:`reason`)."""

    def __init__(self, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        self.signals = tuple(signals)
        self._numbers = frozenset(int(sig) for sig in self.signals)
        #: the name of the first signal received ("" before one arrives)
        self.reason = ""
        self._previous: dict[signal.Signals, Any] = {}
        self._previous_fd: int | None = None
        self._pipe: tuple[int, int] | None = None
        self._closing = False
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            # once a stop is under way, a repeat (Ctrl-C pressed again) must not cut short
            # what follows (flushing, stopping children) with a KeyboardInterrupt
            signal.signal(sig, signal.SIG_IGN if self.reason else handler)
        self._previous.clear()
        self._closing = True
        if self._watcher is not None:
            self._wake()
            self._watcher.join(timeout=5)
        if self._pipe is not None:
            signal.set_wakeup_fd(-1 if self._previous_fd is None else self._previous_fd)
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # no lock, no I/O: only an attribute; the wakeup fd has already woken any wait
        if not self.reason:
            self.reason = signal.Signals(signum).name

    def is_set(self) -> bool:
        return bool(self.reason)

    def watch(self, act: Callable[[str], None]) -> None:
        """Call ``act`` with the first stop signal's name, on a thread of its own: the handler
        may take no lock, ``act`` may (set an Event the main thread waits on, start a timer)."""

        def run() -> None:
            while not self._closing:
                if self.wait(0.5):
                    act(self.reason)
                    return

        self._watcher = threading.Thread(target=run, name="stop-signals", daemon=True)
        self._watcher.start()

    def _wake(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(BlockingIOError):
                os.write(self._pipe[1], b"\0")

    def wait(self, timeout: float) -> bool:
        """Block until a stop signal or ``timeout`` seconds; True when one was received."""
        if self.reason or timeout <= 0:
            return bool(self.reason)
        if self._pipe is None:
            time.sleep(timeout)
            return bool(self.reason)
        deadline = time.monotonic() + timeout
        while not self.reason and not self._closing:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([self._pipe[0]], [], [], left)
            if ready:
                with contextlib.suppress(BlockingIOError):
                    self._note(os.read(self._pipe[0], 512))
        return bool(self.reason)

    def _note(self, numbers: bytes) -> None:
        """The wakeup fd's bytes are the numbers of the signals received: the first stop
        signal among them is the reason (other signals' bytes are drained and ignored). Read
        here rather than left to the Python-level handler: Python runs that in the main thread
        only, and (3.11) a signal the kernel hands to another thread may reach it late, or
        while the main thread blocks in a lock, not at all."""
        if not self.reason:
            for number in numbers:
                if number in self._numbers:
                    self.reason = signal.Signals(number).name
                    return
