"""What every process a test starts needs, whichever directory its test lives in."""

from __future__ import annotations

import signal
import sys


def die_with_parent() -> None:
    """In the child (``preexec_fn``): be killed if the test process dies without running its
    finalizers (pytest killed by a timeout, a cancelled CI job), so no broker, daemon or
    server outlives the test run (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def like_a_terminal() -> None:
    """In the child (``preexec_fn``): what a process started from a terminal has, for tests of
    Ctrl-C. A test run started in the background by a shell without job control (``cmd &``)
    ignores SIGINT and SIGQUIT, its children inherit that, and Python installs no
    KeyboardInterrupt handler for a signal ignored at start: Ctrl-C would then do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    die_with_parent()


def announced_url(output: str) -> str | None:
    """The metrics URL a child evald announced in ``output`` ("serving http://.../metrics"),
    so a test can start it on port 0 and ask it which port it got."""
    for line in output.splitlines():
        if "serving http://" in line:
            return line.split("serving ", 1)[1].split()[0]
    return None
