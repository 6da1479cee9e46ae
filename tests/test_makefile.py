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


def test_the_editable_install_is_a_plain_path_line() -> None:
    """`make venv` installs evald editable as one .pth line naming the project root. The other
    way setuptools has for a flat layout, an import finder, printed a warning box on every
    build ("Editable installation. Please be careful with folders ..."); pyproject.toml's
    package-dir picks this one."""
    import sys
    import sysconfig

    assert sys.prefix != sys.base_prefix, "run the tests from make test's .venv"
    site = Path(sysconfig.get_paths()["purelib"])
    (pth,) = site.glob("__editable__.evald-*.pth")
    assert pth.read_text(encoding="utf-8").strip() == str(ROOT)
    assert not list(site.glob("__editable___evald_*_finder.py"))
