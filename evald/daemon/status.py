"""`evald run`'s periodic status line: is it consuming, producing, keeping up, rejecting?

A daemon that logs nothing after "ready" cannot be told from a stuck one without Grafana. Every
``--status-interval`` a thread copies the counters (under the daemon's lock, as a scrape does),
and logs one line with the rates since the previous line (and, while not ready, why not)::

    status: consumed 3,012/s · results 2,900/s · lag 1,234 · watermark delay 3m07s
      · pending 40,211 · rejected 12 (+3)

The same numbers go into the record as ``extra={"status": {...}}`` for ``--log-format json``.
:func:`sample` and :func:`status` are pure; :class:`StatusReporter` only decides when.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evald.durations import readable

if TYPE_CHECKING:
    from evald.daemon.stats import DaemonStats
    from evald.engine import Engine

__all__ = ["Sample", "StatusReporter", "format_status", "sample", "status"]

log = logging.getLogger("evald.daemon.status")


@dataclass(frozen=True)
class Sample:
    """The counters one status line is computed from, copied at wall time ``at`` (seconds)."""

    at: float
    consumed: int  # records fed to the engine (every kind and outcome)
    results: int  # results written to the results topic in committed transactions
    rejected: int
    pending: int
    lag: int | None  # records behind over every owned partition; None before the first fetch
    watermark_ms: int | None  # the slowest partition's watermark


def sample(engine: Engine | None, stats: DaemonStats, at: float) -> Sample:
    """Copy the numbers from the current engine (None between sessions) and the daemon stats."""
    with stats.lock:
        lag = sum(stats.lag.values()) if stats.lag else None
        results = stats.results_produced
    if engine is None:
        return Sample(at, 0, results, 0, 0, lag, None)
    marks = [m for m in engine.watermarks().values() if m is not None]
    return Sample(
        at=at,
        consumed=sum(engine.stats.events.values()),
        results=results,
        rejected=sum(engine.stats.rejected.values()),
        pending=engine.pending(),
        lag=lag,
        watermark_ms=min(marks) if marks else None,
    )


def _delta(now: int, then: int) -> int:
    # a new session starts a new engine whose counters begin at 0
    return now - then if now >= then else now


def status(prev: Sample, cur: Sample, ready: tuple[bool, str] = (True, "ok")) -> dict[str, Any]:
    """The status fields: rates over ``cur.at - prev.at``, levels from ``cur``, and the
    readiness (``/readyz``) with its reason."""
    span = max(cur.at - prev.at, 1e-9)
    delay = None if cur.watermark_ms is None else round(cur.at - cur.watermark_ms / 1000, 3)
    return {
        "ready": ready[0],
        "reason": ready[1],
        "consumed_per_s": round(_delta(cur.consumed, prev.consumed) / span, 1),
        "results_per_s": round(_delta(cur.results, prev.results) / span, 1),
        "lag": cur.lag,
        "watermark_delay_s": delay,
        "pending": cur.pending,
        "rejected": cur.rejected,
        "rejected_new": _delta(cur.rejected, prev.rejected),
    }


def format_status(fields: dict[str, Any]) -> str:
    """One readable line from :func:`status`'s fields."""
    lag = "-" if fields["lag"] is None else f"{fields['lag']:,}"
    delay = fields["watermark_delay_s"]
    state = "" if fields["ready"] else f" (not ready: {fields['reason']})"
    return (
        f"status{state}: consumed {fields['consumed_per_s']:,.0f}/s"
        f" · results {fields['results_per_s']:,.0f}/s · lag {lag}"
        f" · watermark delay {'-' if delay is None else readable(delay)}"
        f" · pending {fields['pending']:,}"
        f" · rejected {fields['rejected']:,} (+{fields['rejected_new']:,})"
    )


class StatusReporter:
    """Logs a status line every ``interval`` seconds from a daemon thread until :meth:`stop`.

    ``engine`` returns the current engine (the daemon rebuilds it per session); ``lock`` is the
    daemon's, held only while copying; ``clock`` is wall time, injectable for tests.
    """

    def __init__(
        self,
        engine: Callable[[], Engine | None],
        stats: DaemonStats,
        lock: AbstractContextManager[Any],
        interval: float,
        *,
        ready: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
        clock: Callable[[], float] = time.time,
        logger: logging.Logger = log,
    ) -> None:
        self.engine = engine
        self.stats = stats
        self.lock = lock
        self.interval = interval
        self.ready = ready
        self.clock = clock
        self.logger = logger
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prev: Sample | None = None

    def report(self) -> dict[str, Any] | None:
        """Take a sample; log and return the status since the previous one (None the first
        time: a rate needs two samples)."""
        with self.lock:
            cur = sample(self.engine(), self.stats, self.clock())
        prev, self._prev = self._prev, cur
        if prev is None:
            return None
        fields = status(prev, cur, self.ready())
        self.logger.info("%s", format_status(fields), extra={"status": fields})
        return fields

    def start(self) -> StatusReporter:
        self.report()
        self._thread = threading.Thread(target=self._loop, name="evald-status", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.report()
            except Exception:  # a status line must never take the daemon down
                self.logger.exception("status line failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
