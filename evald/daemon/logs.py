"""How `evald run` writes its log: readable lines by default, one JSON object per line on request.

Times are UTC ISO 8601 with milliseconds in both forms, never raw epoch numbers, so a log line
can be read and correlated with the dashboard without conversion. Warnings and errors that repeat
are rate-limited (:class:`RepeatLimit`): kafka-python logs a refused metadata request or a
missing partition on every retry, hundreds of lines a second, which buries the one line that
says what is wrong. Event times inside messages
(watermarks) go through :func:`event_time`. JSON lines carry the structured fields a message was
logged with (``extra={"status": {...}}``), so log pipelines get numbers, not parsed text.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TextIO

__all__ = [
    "FORMATS",
    "JsonFormatter",
    "RepeatLimit",
    "TextFormatter",
    "event_time",
    "setup_logging",
]

FORMATS = ("text", "json")

#: LogRecord attributes that are not extra fields
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}


def _iso(seconds: float) -> str:
    moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def event_time(ms: int | None) -> str:
    """An event time in epoch milliseconds as ``2026-01-01T00:05:00.000Z`` (``none`` if unset)."""
    return "none" if ms is None else _iso(ms / 1000)


class TextFormatter(logging.Formatter):
    """``2026-11-24T02:47:26.123Z INFO evald.daemon: message``."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_iso(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, extras, ``error``."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


class RepeatLimit(logging.Filter):
    """Passes at most ``burst`` warnings or errors of one kind per ``window_s``; a kind is the
    logger, the level and the message's format string, so "Topic %s is not authorized" is one
    kind whatever the topic. The first line of a kind after a window that dropped some says
    how many were left out (a flood that stops is counted when its kind next appears). INFO
    and DEBUG lines (the status line) always pass."""

    #: kinds remembered at most; past that all are forgotten (each starts a fresh burst)
    MAX_KINDS = 1_024

    def __init__(
        self, burst: int = 5, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()  # kafka-python logs from its I/O thread too
        #: kind -> [window start, lines in the window, lines dropped in it]
        self._kinds: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        kind = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            window = self._kinds.get(kind)
            if window is None or now - window[0] >= self.window_s:
                dropped = 0 if window is None else int(window[2])
                if len(self._kinds) >= self.MAX_KINDS:
                    self._kinds.clear()
                self._kinds[kind] = [now, 1, 0]
            elif window[1] < self.burst:
                window[1] += 1
                return True
            else:
                window[2] += 1
                return False
        if dropped:
            record.msg = f"{record.getMessage()} ({dropped} earlier lines like this not logged)"
            record.args = None
        return True


class Benign(logging.Filter):
    """kafka-python records that say nothing is wrong, logged at INFO instead of ERROR or
    WARNING (a user reads those as a fault); every other record passes as it is:

    * a LeaveGroup naming a member the coordinator no longer knows (``UnknownMemberIdError``).
      evald leaves the group on every stop and when it gives a session up; when the broker had
      removed the member already (its session expired, or the group rebalanced without it, the
      case evald gives the session up for), being unknown is what leaving asks for.
    * "No partition metadata for topic ...": the group's first assignment, computed before the
      consumer's metadata names the topics just subscribed to; kafka-python assigns nothing
      for them and rejoins once the metadata is in (evald logs the empty assignment first).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO and _benign(record):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def _benign(record: logging.LogRecord) -> bool:
    message = str(record.msg)
    args = record.args if isinstance(record.args, tuple) else ()
    if record.name == "kafka.coordinator" and message.startswith("LeaveGroup request"):
        return any(type(arg).__name__ == "UnknownMemberIdError" for arg in args)
    return record.name.startswith("kafka.coordinator.assignors") and message.startswith(
        "No partition metadata for topic"
    )


def setup_logging(level: str, log_format: str = "text", stream: TextIO | None = None) -> None:
    """Route every logger to ``stream`` (stderr) in ``log_format``; kafka-python's chatter is
    kept at WARNING unless the level asks for DEBUG."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RepeatLimit())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("kafka").setLevel(max(logging.WARNING, root.level))
    for name in ("kafka.coordinator", "kafka.coordinator.assignors.range",
                 "kafka.coordinator.assignors.roundrobin"):  # fmt: skip
        source = logging.getLogger(name)  # a logger's filters see only its own records
        if not any(isinstance(f, Benign) for f in source.filters):
            source.addFilter(Benign())
