"""`make demo` installs evald's runtime dependencies only, into a venv of its own."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_demo_installs_the_runtime_environment_only() -> None:
    assert shutil.which("make"), "make is needed to check the Makefile"
    # -n: print the commands without running them; -B: as if nothing were built yet
    # --no-print-directory: under `make test` this make is nested and would print
    # "Entering/Leaving directory" lines around the plan
    plan = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    installs = [line for line in plan if "pip install" in line and "--upgrade pip" not in line]
    assert installs, plan
    for line in installs:
        assert "[" not in line, f"extras (test/dev tools) installed for the demo: {line}"
        assert line.startswith(".venv-demo/"), f"the demo shares the dev venv: {line}"
    assert plan[-1] == ".venv-demo/bin/evald demo"
