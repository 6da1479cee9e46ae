"""Stop signals that a loop waits on, with no lock taken in the handler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from child_processes import die_with_parent

from evald.signals import StopSignals

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import os, signal, sys, time
from evald.signals import StopSignals

with StopSignals() as stop:
    print("waiting", flush=True)
    began = time.monotonic()
    got = stop.wait(60)
    print(got, stop.reason, round(time.monotonic() - began, 1) < 30, flush=True)
# the stop is under way: a repeat must not interrupt what follows
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print("cleaned up", flush=True)
"""


def test_a_signal_ends_the_wait_at_once_and_a_repeat_is_ignored_afterwards() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "waiting\n"
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out == "True SIGTERM True\ncleaned up\n"
    assert proc.returncode == 0


def test_without_a_signal_the_wait_times_out_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        assert signal.getsignal(signal.SIGTERM) is not before
        began = time.monotonic()
        assert stop.wait(0.05) is False
        assert time.monotonic() - began >= 0.05
        assert not stop.is_set()
    assert signal.getsignal(signal.SIGTERM) is before


def test_outside_the_main_thread_nothing_is_installed() -> None:
    seen: list[object] = []

    def run() -> None:
        with StopSignals() as stop:
            seen.append(signal.getsignal(signal.SIGINT))
            seen.append(stop.wait(0.01))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [before, False]


ELSEWHERE = """
import signal, threading, time
from evald.signals import StopSignals

began = time.monotonic()
with StopSignals() as stop:
    stop.watch(lambda reason: print("stopping", reason, time.monotonic() - began < 2, flush=True))
    watcher = next(t for t in threading.enumerate() if t.name == "stop-signals")
    signal.pthread_kill(watcher.ident, signal.SIGINT)  # the kernel's choice of thread, forced
    time.sleep(3)  # the main thread in C: its Python-level handler runs only after this
"""


def test_a_signal_delivered_to_another_thread_reaches_the_watcher_at_once() -> None:
    """The kernel may hand a process's signal to any of its threads; Python runs the handler
    in the main thread only, once that thread is back in bytecode. The watcher reads the
    signal's number from the wakeup fd instead, so it acts while the main thread still sleeps
    (before it learnt the reason only from that handler: 3 s late here, never when the main
    thread stayed blocked)."""
    done = subprocess.run(
        [sys.executable, "-c", ELSEWHERE], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.stdout == "stopping SIGINT True\n", done.stdout + done.stderr
