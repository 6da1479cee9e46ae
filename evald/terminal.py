"""What a terminal stream can show: the live views fall back to ASCII where it cannot."""

from __future__ import annotations

from typing import TextIO


def can_encode(stream: TextIO, text: str) -> bool:
    """Whether ``stream`` can print ``text`` (arrows and '±' need UTF-8).

    A stream without an encoding (``io.StringIO``) holds str and takes anything.
    """
    encoding = getattr(stream, "encoding", None)
    if encoding is None:
        return True
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True
