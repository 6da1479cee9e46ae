"""The Makefile's set-up steps behave in a terminal as well as in CI."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_apt_get_reads_dev_null() -> None:
    """apt-get run from a terminal in the background (e.g. under `timeout`) restores the
    terminal's settings on exit and gets SIGTTOU, which stops it for good: it must not have the
    terminal as stdin."""
    assert shutil.which("make"), "make is needed to check the Makefile"
    # -n -B: print every recipe as if nothing were installed, without running it
    plan = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "tools", "java"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    calls = re.findall(r"apt-get (?:update|install)[^;&]*", plan)
    assert len(calls) == 6, plan  # update + install for promtool, tmux and Java/Maven
    for call in calls:
        assert "</dev/null" in call, call
