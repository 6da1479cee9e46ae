"""Event times as a mapping declares them: RFC 3339 text or an epoch number in s / ms / µs / ns.

The unit is declared, never guessed: a value in another unit converts to a time far from now,
and the decoder's plausibility bound (``min_event_time`` / ``max_event_lead``) rejects it with a
message naming the declared unit. Messages say what is wrong in words.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from datetime import datetime
from typing import Any, Literal

from evald.events import MAX_TS_MS, parse_timestamp

TimeFormat = Literal["rfc3339", "epoch_s", "epoch_ms", "epoch_us", "epoch_ns"]

#: how a declared format reads in a message
UNIT_WORDS: dict[str, str] = {
    "rfc3339": "RFC 3339 text",
    "epoch_s": "epoch seconds",
    "epoch_ms": "epoch milliseconds",
    "epoch_us": "epoch microseconds",
    "epoch_ns": "epoch nanoseconds",
}

#: milliseconds per declared epoch unit, as (multiplier, divisor)
_SCALE: dict[str, tuple[int, int]] = {
    "epoch_s": (1_000, 1),
    "epoch_ms": (1, 1),
    "epoch_us": (1, 1_000),
    "epoch_ns": (1, 1_000_000),
}


class TimeValueError(ValueError):
    """A time value the declared format cannot read; ``implausible``: it reads, but as a time
    outside 0 .. 9999-12-31 (almost always a wrong unit)."""

    def __init__(self, message: str, *, implausible: bool = False) -> None:
        super().__init__(message)
        self.implausible = implausible


#: the common RFC 3339 spelling, read without datetime: UTC, seconds, up to 6 fraction digits
_CANONICAL = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?[Zz]"
)
_DAY_MS = 86_400_000


@functools.lru_cache(maxsize=1024)
def _day_ms(date: str) -> int:
    """Epoch ms of a ``YYYY-MM-DD`` day (raises ValueError for no such day)."""
    return (dt.date.fromisoformat(date) - _EPOCH_DAY).days * _DAY_MS


_EPOCH_DAY = dt.date(1970, 1, 1)


def canonical_ms(text: str) -> int | None:
    """:func:`parse_timestamp` of the canonical UTC form, faster; None: not that form (or not
    a valid time), for the general parser to decide and explain."""
    match = _CANONICAL.fullmatch(text)
    if match is None:
        return None
    date, hours, minutes, seconds, fraction = match.groups()
    h, m, sec = int(hours), int(minutes), int(seconds)
    if h > 23 or m > 59 or sec > 59 or date < "1970":
        return None
    try:
        day = _day_ms(date)
    except ValueError:
        return None
    millis = int((fraction + "00")[:3]) if fraction else 0
    return day + h * 3_600_000 + m * 60_000 + sec * 1_000 + millis


def to_millis(value: Any, fmt: str) -> int:
    """Epoch milliseconds of ``value`` read as ``fmt``; raises :class:`TimeValueError`."""
    if fmt == "rfc3339":
        if type(value) is str:
            ms = canonical_ms(value)
            if ms is not None:
                return ms
        else:
            raise TimeValueError(
                f"expected RFC 3339 text, got {_kind(value)} (if the field holds epoch numbers, "
                "declare format epoch_s, epoch_ms, epoch_us or epoch_ns)"
            )
        try:
            return parse_timestamp(value)
        except ValueError as exc:
            raise TimeValueError(_rfc3339_words(value, str(exc))) from None
    multiplier, divisor = _SCALE[fmt]
    if type(value) is int:
        ms = value * multiplier // divisor
    elif type(value) is float and math.isfinite(value):
        ms = math.floor(value * multiplier / divisor)
    else:
        raise TimeValueError(f"expected a number of {UNIT_WORDS[fmt]}, got {_kind(value)}")
    if not 0 <= ms <= MAX_TS_MS:
        raise TimeValueError(
            f"{value!r} read as {UNIT_WORDS[fmt]} is outside years 1970..9999: is the value in "
            "another unit?",
            implausible=True,
        )
    return ms


def _rfc3339_words(value: str, reason: str) -> str:
    if "no UTC offset" in reason or _local_time(value):
        return f"{value!r} has no UTC offset (add 'Z' or '+hh:mm')"
    if "out of range" in reason:
        return f"{value!r} is before 1970 or after 9999"
    return f"{value!r} is not RFC 3339 text (like 2024-05-01T12:00:00Z)"


def _local_time(value: str) -> bool:
    """A date and time without an offset (which RFC 3339 requires)."""
    try:
        return datetime.fromisoformat(value.strip().upper()).tzinfo is None
    except ValueError:
        return False


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return "a list" if isinstance(value, list) else "an object"
