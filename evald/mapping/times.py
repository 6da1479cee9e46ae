"""Event times as a mapping declares them: RFC 3339 text or an epoch number in s / ms / µs / ns.

The unit is declared, never guessed: a value in another unit converts to a time far from now,
and the decoder's plausibility bound (``min_event_time`` / ``max_event_lead``) rejects it with a
message naming the declared unit. Messages say what is wrong in words.

A field may declare two formats, RFC 3339 and one epoch unit (UBI writers mix them in one
file): the JSON type of each value chooses (text: RFC 3339, a number: the epoch unit), so
nothing is guessed from a value's size either (:func:`chosen`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from evald.events import MAX_TS_MS, parse_timestamp

TimeFormat = Literal["rfc3339", "epoch_s", "epoch_ms", "epoch_us", "epoch_ns"]
#: the formats a time field declares: one, or RFC 3339 and one epoch unit
Formats = tuple[str, ...]

#: how a declared format reads in a message
UNIT_WORDS: dict[str, str] = {
    "rfc3339": "RFC 3339 text",
    "epoch_s": "epoch seconds",
    "epoch_ms": "epoch milliseconds",
    "epoch_us": "epoch microseconds",
    "epoch_ns": "epoch nanoseconds",
}

#: milliseconds per declared epoch unit, as (multiplier, divisor)
SCALE: dict[str, tuple[int, int]] = {
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


#: epoch ms of each ``YYYY-MM-DDTHH:MM:SS`` second seen lately (events of a stream share them);
#: read, never written, by the mapping fast path, which inlines :func:`canonical_ms`' lookups
SECONDS: dict[str, int] = {}
_MAX_SECONDS = 4096
#: the three digits of a millisecond fraction -> their value (ASCII digits only)
MILLIS: dict[str, int] = {f"{n:03d}": n for n in range(1000)}


def canonical_ms(text: str) -> int | None:
    """:func:`parse_timestamp` of the common UTC spelling ``YYYY-MM-DDTHH:MM:SS[.fff]Z``,
    several times faster; None: another spelling (or not a time), for the general parser to
    decide and explain. The second is parsed by the general parser once and remembered."""
    size = len(text)
    if size == 24:
        if text[19] != ".":
            return None
        millis = MILLIS.get(text[20:23])
        if millis is None:
            return None
    elif size == 20:
        millis = 0
    else:
        return None
    if text[-1] not in "Zz":
        return None
    prefix = text[:19]
    second = SECONDS.get(prefix)
    if second is None:
        second = _second_of(prefix)
        if second is None:
            return None
    return second + millis


def _second_of(prefix: str) -> int | None:
    """Epoch ms of ``YYYY-MM-DDTHH:MM:SS`` (UTC), remembered; None: not that spelling."""
    if not prefix.isascii() or prefix[10] not in "Tt" or prefix[13] != ":" or prefix[16] != ":":
        return None
    seconds = prefix[17:19]
    if not seconds.isdigit() or int(seconds) > 59:
        return None
    try:
        second = parse_timestamp(prefix + "Z")
    except ValueError:
        return None
    if len(SECONDS) >= _MAX_SECONDS:
        SECONDS.clear()
    SECONDS[prefix] = second
    return second


def check_formats(formats: Formats) -> Formats:
    """``formats`` if a field can declare them (one, or RFC 3339 plus one epoch unit: a value's
    JSON type then chooses); ValueError saying why not."""
    if not formats:
        raise ValueError("declare at least one format")
    if len(set(formats)) != len(formats):
        raise ValueError("a format is listed twice")
    epochs = [f for f in formats if f != "rfc3339"]
    if len(epochs) > 1:
        raise ValueError(
            f"{' and '.join(epochs)}: a number cannot tell its unit, declare one epoch unit "
            "(with rfc3339 for text)"
        )
    return formats


def chosen(value: Any, formats: Formats) -> str:
    """The format of ``formats`` that reads ``value``: the only one, else by its JSON type
    (text: ``rfc3339``, anything else: the epoch unit, whose reader words what is wrong)."""
    if len(formats) == 1:
        return formats[0]
    epoch = formats[0] if formats[1] == "rfc3339" else formats[1]
    return "rfc3339" if type(value) is str else epoch


def formats_in_words(formats: Formats) -> str:
    """``rfc3339 or epoch_ms`` spelt for a message: RFC 3339 text or epoch milliseconds."""
    return " or ".join(UNIT_WORDS[f] for f in formats)


def read_time(value: Any, formats: Formats) -> int:
    """Epoch milliseconds of ``value`` read as the format of ``formats`` its JSON type chooses;
    raises :class:`TimeValueError`."""
    fmt = chosen(value, formats)
    if len(formats) > 1 and fmt != "rfc3339" and type(value) not in (int, float):
        raise TimeValueError(
            f"expected RFC 3339 text or a number of {UNIT_WORDS[fmt]}, got {_kind(value)}"
        )
    return to_millis(value, fmt)


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
                "declare format epoch_s, epoch_ms, epoch_us or epoch_ns; both: [rfc3339, epoch_ms])"
            )
        try:
            return parse_timestamp(value)
        except ValueError as exc:
            raise TimeValueError(_rfc3339_words(value, str(exc))) from None
    multiplier, divisor = SCALE[fmt]
    if type(value) is int:
        ms = value * multiplier // divisor
    elif type(value) is float and math.isfinite(value):
        ms = _floor_ms(value * multiplier / divisor)
    else:
        raise TimeValueError(f"expected a number of {UNIT_WORDS[fmt]}, got {_kind(value)}")
    if not 0 <= ms <= MAX_TS_MS:
        raise TimeValueError(
            f"{value!r} read as {UNIT_WORDS[fmt]} is outside years 1970..9999: is the value in "
            "another unit?",
            implausible=True,
        )
    return ms


def _floor_ms(scaled: float) -> int:
    """``floor(scaled)``; -1 (out of range) where a finite number scaled past the float range
    (1e306 seconds is infinite milliseconds), which ``math.floor`` cannot convert."""
    return math.floor(scaled) if math.isfinite(scaled) else -1


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


def millis_reader(fmt: str) -> Callable[[Any], int | None]:
    """:func:`to_millis` for ``fmt``, specialised once, for a fast path: the epoch ms, or None
    wherever :func:`to_millis` raises (the caller then asks it for the words)."""
    if fmt == "rfc3339":

        def rfc3339(value: Any) -> int | None:
            if type(value) is not str:
                return None
            ms = canonical_ms(value)
            if ms is None:
                try:
                    return parse_timestamp(value)
                except ValueError:
                    return None
            return ms

        return rfc3339
    multiplier, divisor = SCALE[fmt]

    def epoch(value: Any) -> int | None:
        kind = type(value)
        if kind is int:  # integer arithmetic: exact for any size
            ms = value * multiplier // divisor
        elif kind is float and math.isfinite(value):
            ms = _floor_ms(value * multiplier / divisor)
        else:
            return None
        return ms if 0 <= ms <= MAX_TS_MS else None

    return epoch
