"""Backpressure: when to pause the impressions topic and when to let it flow again.

Pausing helps only while feedback is there to move the watermark: buffered, or behind the high
watermark on an owned partition. Without it (a flood of impressions whose feedback never
comes), a pause only stalls; impressions are released at once and not paused again for
``BACKPRESSURE_COOLDOWN_S``, and the engine's cap closes the earliest-deadline impression per
new one, at close to the uncapped rate (docs/design.md, "Backpressure and memory").

:func:`decide` is the whole rule, a pure function; :class:`Backpressure` keeps its state and
logs the changes; the runner applies the decision to the consumer (``Inputs``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = [
    "BACKPRESSURE_COOLDOWN_S",
    "BACKPRESSURE_LOG_INTERVAL_S",
    "Action",
    "Backpressure",
    "Decision",
    "ThrottledLog",
    "decide",
]

log = logging.getLogger("evald.daemon")

#: after backpressure let impressions through because no feedback was left to drain pending
#: ones, the engine's cap evicts; it is not paused again for this long (no pause/resume flapping)
BACKPRESSURE_COOLDOWN_S = 10.0
#: backpressure state changes are logged at most this often (with a count of those in between)
BACKPRESSURE_LOG_INTERVAL_S = 10.0


class Action(Enum):
    """What to do to the impressions fetch."""

    PAUSE = "pause"
    RESUME = "resume"


@dataclass(frozen=True)
class Decision:
    """The outcome of one :func:`decide`: the action (None: leave it), why, and the cooldown."""

    action: Action | None
    cooldown_until: float
    why: str = ""


def decide(
    *,
    paused: bool,
    pending: int,
    max_pending: int,
    pause_at: float,
    resume_at: float,
    feedback_waiting: bool,
    now: float,
    cooldown_until: float,
) -> Decision:
    """Pause near ``pause_at * max_pending`` while feedback can drain the pending impressions
    (and not within the cooldown); resume under ``resume_at * max_pending``, or at once, with a
    cooldown, when no feedback is left to drain them."""
    if not paused:
        if pending >= pause_at * max_pending and now >= cooldown_until and feedback_waiting:
            return Decision(Action.PAUSE, cooldown_until)
        return Decision(None, cooldown_until)
    if pending <= resume_at * max_pending:
        return Decision(Action.RESUME, cooldown_until, "drained")
    if not feedback_waiting:
        return Decision(
            Action.RESUME,
            now + BACKPRESSURE_COOLDOWN_S,
            "no feedback to drain them; the cap evicts",
        )
    return Decision(None, cooldown_until)


class ThrottledLog:
    """Logs a line at most once per ``interval_s``, counting the ones it swallowed."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._logged_at: float | None = None
        self._unlogged = 0

    def info(self, now: float, message: str, *args: Any) -> None:
        """Log ``message % args`` unless a line went out less than ``interval_s`` ago."""
        if self._logged_at is not None and now - self._logged_at < self.interval_s:
            self._unlogged += 1
            return
        if self._unlogged:
            message += " (%d more changes since the last line)"
            args = (*args, self._unlogged)
        log.info(message, *args)
        self._logged_at, self._unlogged = now, 0


class Backpressure:
    """The backpressure state of one daemon: paused or not, and the cooldown."""

    def __init__(self, pause_at: float, resume_at: float, max_pending: int = 1) -> None:
        self.pause_at = pause_at
        self.resume_at = resume_at
        self.max_pending = max_pending
        self.paused = False
        #: no new pause before this time (monotonic clock): set when feedback ran dry
        self.cooldown_until = 0.0
        self._log = ThrottledLog(BACKPRESSURE_LOG_INTERVAL_S)

    def start(self, max_pending: int) -> None:
        """A session's engine, whose pending cap is ``max_pending``: nothing is paused."""
        self.max_pending = max_pending

    def reset(self) -> None:
        """The session ended: its consumer, and what it paused, are gone."""
        self.paused = False

    def step(self, pending: int, feedback_waiting: bool, now: float) -> Action | None:
        """Decide for this cycle, record the new state and log a change (rate-limited)."""
        decision = decide(
            paused=self.paused,
            pending=pending,
            max_pending=self.max_pending,
            pause_at=self.pause_at,
            resume_at=self.resume_at,
            feedback_waiting=feedback_waiting,
            now=now,
            cooldown_until=self.cooldown_until,
        )
        self.cooldown_until = decision.cooldown_until
        if decision.action is Action.PAUSE:
            self.paused = True
            self._log.info(
                now, "backpressure: %d pending impressions, pausing impressions", pending
            )
        elif decision.action is Action.RESUME:
            self.paused = False
            self._log.info(
                now, "backpressure released (%s): %d pending impressions", decision.why, pending
            )
        return decision.action
