"""Bytes of one result record (key and JSON value), made cheaply enough for the per-result path.

Why this exists: `evald run` writes one record per finalized impression, so whatever it costs to
serialise a result is paid ~0.3-0.4x per input record. ``json.dumps(doc, sort_keys=True,
separators=...)`` builds a fresh encoder and sorts three dicts per call, and
:func:`evald.events.format_timestamp` goes through ``datetime.strftime``. Here the encoder is
built once and the RFC 3339 date-and-hour prefix is cached, so only minutes, seconds and
milliseconds are formatted per result. The document is :func:`evald.result.document`, the one
``Result.to_json`` builds too (`evald replay --results` schema); only the key order inside the
JSON differs from a sorted dump, which no reader depends on.
"""

from __future__ import annotations

import json
from typing import Any

from evald.events import format_timestamp
from evald.result import Result, document

__all__ = ["ResultEncoder", "TimestampFormatter"]

_HOUR_MS = 3_600_000
_MINUTE_MS = 60_000


class TimestampFormatter:
    """``format_timestamp`` with the ``YYYY-MM-DDTHH:`` prefix cached per hour.

    Results arrive in roughly event-time order per partition, so a handful of hours is live at
    any time; the cache is dropped wholesale when it grows past ``max_hours`` (no LRU needed).
    """

    def __init__(self, max_hours: int = 256) -> None:
        self.max_hours = max_hours
        self._prefixes: dict[int, str] = {}

    def __call__(self, ms: int) -> str:
        """RFC 3339 UTC with milliseconds, identical to ``format_timestamp(ms)``."""
        hour, rest = divmod(ms, _HOUR_MS)
        prefix = self._prefixes.get(hour)
        if prefix is None:
            if len(self._prefixes) >= self.max_hours:
                self._prefixes.clear()
            # "2024-05-01T12:00:00.000Z"[:14] == "2024-05-01T12:"
            prefix = self._prefixes[hour] = format_timestamp(hour * _HOUR_MS)[:14]
        minutes, rest = divmod(rest, _MINUTE_MS)
        seconds, millis = divmod(rest, 1_000)
        return f"{prefix}{minutes:02d}:{seconds:02d}.{millis:03d}Z"


class ResultEncoder:
    """Encodes a :class:`Result` as the results-topic record: ``(key, value)`` bytes."""

    def __init__(self) -> None:
        self.format_ts = TimestampFormatter()
        self._encode = json.JSONEncoder(separators=(",", ":")).encode

    def document(self, result: Result) -> dict[str, Any]:
        """The JSON document, :func:`evald.result.document` with the time formatted here."""
        return document(result, self.format_ts(result.ts))

    def encode(self, result: Result) -> tuple[bytes, bytes]:
        """Key (the request_id, UTF-8) and value (compact JSON, ASCII-escaped) of the record."""
        return result.request_id.encode(), self._encode(self.document(result)).encode()
