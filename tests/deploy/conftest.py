"""Fixtures for the deployment tests: tool lookup; makes `deploy.generator` importable."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator

import pytest
from deploy_support import REPO

# `deploy.generator` is run as `python -m deploy.generator` from the repository root; make it
# importable however pytest was started.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not found: install Debian's 'prometheus' package (make tools)")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool (Debian's prometheus package; `make test` installs it)."""
    return _tool("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    """Path of the Prometheus server binary."""
    return _tool("prometheus")


@pytest.fixture(scope="session")
def demo_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `evald demo` for the session (event time 300x wall time, so 1h windows close in
    ~15s; the treatment arm regresses after 6s), serving /metrics on a free loopback port;
    stopped at the end."""
    from live_support import start_demo

    proc, base = start_demo(tmp_path_factory.mktemp("demo"), speed=300.0, duration=600.0)
    try:
        yield base
    finally:
        proc.stop()
