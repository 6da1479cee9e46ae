"""The backpressure rule as a pure function, and the state kept around it."""

from __future__ import annotations

from typing import Any

import pytest

from evald.daemon.main.backpressure import (
    BACKPRESSURE_COOLDOWN_S,
    Action,
    Backpressure,
    Decision,
    decide,
)

LIMITS: dict[str, Any] = {"max_pending": 100, "pause_at": 0.9, "resume_at": 0.6}


def rule(
    paused: bool, pending: int, waiting: bool, now: float = 50.0, cooldown: float = 0.0
) -> Decision:
    return decide(
        paused=paused,
        pending=pending,
        feedback_waiting=waiting,
        now=now,
        cooldown_until=cooldown,
        **LIMITS,
    )


@pytest.mark.parametrize(
    ("paused", "pending", "waiting", "cooldown", "expected"),
    [
        # running: pause at pause_at * max_pending, only while feedback can drain them
        (False, 89, True, 0.0, Decision(None, 0.0)),
        (False, 90, True, 0.0, Decision(Action.PAUSE, 0.0)),
        (False, 90, False, 0.0, Decision(None, 0.0)),
        # ... and not within the cooldown
        (False, 95, True, 60.0, Decision(None, 60.0)),
        # paused: resume at resume_at * max_pending
        (True, 61, True, 0.0, Decision(None, 0.0)),
        (True, 60, True, 0.0, Decision(Action.RESUME, 0.0, "drained")),
        # paused with nothing left to drain them: resume now, and no new pause for a while
        (
            True,
            95,
            False,
            0.0,
            Decision(
                Action.RESUME,
                50.0 + BACKPRESSURE_COOLDOWN_S,
                "no feedback to drain them; the cap evicts",
            ),
        ),
    ],
)
def test_decide(
    paused: bool, pending: int, waiting: bool, cooldown: float, expected: Decision
) -> None:
    assert rule(paused, pending, waiting, cooldown=cooldown) == expected


def test_the_state_follows_the_decisions_and_the_cooldown_holds() -> None:
    bp = Backpressure(0.9, 0.6, max_pending=100)
    assert bp.step(95, True, 0.0) is Action.PAUSE and bp.paused
    assert bp.step(95, True, 1.0) is None and bp.paused
    assert bp.step(95, False, 2.0) is Action.RESUME and not bp.paused
    assert bp.step(95, True, 2.0 + BACKPRESSURE_COOLDOWN_S - 0.1) is None
    assert bp.step(95, True, 2.0 + BACKPRESSURE_COOLDOWN_S) is Action.PAUSE
