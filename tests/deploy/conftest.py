"""Fixtures for the deployment tests: tool lookup; makes `deploy.generator` importable."""

from __future__ import annotations

import shutil
import sys

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
