"""Durations as milliseconds: ``"30m"``, ``"2m"``, ``"1h30m"``, ``"500ms"`` <-> ``int``.

Every time knob in evald is an integer number of milliseconds internally; humans write the
compact form. Plain integers (and digit-only strings) are milliseconds.
"""

from __future__ import annotations

import re

_UNIT_MS: dict[str, int] = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"([0-9]+)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:[0-9]+(?:ms|s|m|h|d))+")


#: the longest duration: 36500 days, a century. Longer ones mean nothing for event times
#: (9999 is the last year) and overflow the int64 arithmetic of buckets and watermarks.
MAX_MS = 36_500 * 86_400_000


class DurationError(ValueError):
    """A duration that is neither milliseconds nor a ``1h30m``-style string."""


def parse_duration(value: str | int) -> int:
    """Milliseconds of ``value``; raises :class:`DurationError` on anything else.

    Accepts a non-negative int (ms), a digit string (ms) or concatenated ``<n><unit>`` parts with
    units ``d h m s ms`` (``"1h30m"``, ``"90s"``, ``"250ms"``), up to :data:`MAX_MS`. Booleans
    and floats are refused so that a YAML ``yes`` or ``1.5`` never becomes a silent duration.
    """
    ms = _milliseconds(value)
    if ms > MAX_MS:
        raise DurationError("duration longer than 36500d (a century): use at most 36500d")
    return ms


def _milliseconds(value: str | int) -> int:
    if isinstance(value, bool):
        raise DurationError(f"expected a duration like '30m' or milliseconds, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise DurationError(f"duration must not be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise DurationError(f"expected a duration like '30m' or milliseconds, got {value!r}")
    text = value.strip().lower()
    if text.isascii() and text.isdecimal():  # int() reads "١٠٠" and refuses "²"; neither is ours
        return int(text) if len(text) <= 20 else MAX_MS + 1  # and 4,300 digits
    if not text or not _WHOLE.fullmatch(text):
        raise DurationError(
            f"invalid duration {value!r}: use milliseconds or parts like '30m', '1h30m', "
            "'90s', '500ms' (units d, h, m, s, ms)"
        )
    parts = _PART.findall(text)
    if any(len(n) > 20 for n, _ in parts):
        return MAX_MS + 1
    return sum(int(n) * _UNIT_MS[unit] for n, unit in parts)


def format_duration(ms: int) -> str:
    """Shortest ``1h30m``-style spelling of ``ms`` (``0`` -> ``"0ms"``); inverse of parsing."""
    if ms < 0:
        raise DurationError(f"duration must not be negative, got {ms}")
    if ms == 0:
        return "0ms"
    parts: list[str] = []
    for unit in ("d", "h", "m", "s", "ms"):
        n, ms = divmod(ms, _UNIT_MS[unit])
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)


def readable(seconds: float) -> str:
    """``45s``, ``2m03s``, ``1h05m``, ``3d04h`` (``-`` in front when negative): a span a person
    reads at a glance in a log line or a terminal view, never raw seconds or milliseconds."""
    sign, left = ("-" if seconds < 0 else ""), round(abs(seconds))
    if left < 60:
        return f"{sign}{left}s"
    minutes, secs = divmod(left, 60)
    if minutes < 60:
        return f"{sign}{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{sign}{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{sign}{days}d{hours:02d}h"
