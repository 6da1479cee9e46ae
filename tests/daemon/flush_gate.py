"""Holding a daemon's commit inside its flush, at a moment a test chooses.

A real broker outage leaves the loop in the same wait, but when it likes; the gate makes the
transactional producer's next flush wait for the test, then flush for real.
"""

from __future__ import annotations

import threading

import pytest
from kafka import KafkaProducer

import evald.daemon.main.runner as runner


class FlushGate:
    """Holds the next flush after ``armed`` is set until ``release`` is."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()

    def wait(self) -> None:
        if not self.armed.is_set():
            return
        self.armed.clear()
        self.entered.set()
        self.release.wait(120)


def gate_flushes(monkeypatch: pytest.MonkeyPatch) -> FlushGate:
    """Make the daemons this test starts flush through the returned gate."""
    gate = FlushGate()

    class GatedProducer(KafkaProducer):  # type: ignore[misc]
        def flush(self, timeout: float | None = None) -> None:
            gate.wait()
            super().flush(timeout=timeout)

    monkeypatch.setattr(runner, "KafkaProducer", GatedProducer)
    return gate
