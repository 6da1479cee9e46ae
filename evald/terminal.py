"""What a terminal stream can show: the live views fall back to ASCII where it cannot, and
show data (label values, queries) as text only, cut to the terminal's columns."""

from __future__ import annotations

import unicodedata
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


def encodable(text: str, stream: TextIO) -> str:
    """``text`` as ``stream`` can print it: a character its encoding lacks (a query or label
    value on an ASCII terminal, an error message's ellipsis) becomes '?', where writing it
    raised UnicodeEncodeError and ended the live view."""
    encoding = getattr(stream, "encoding", None)
    if encoding is None:
        return text
    try:
        return text.encode(encoding, "replace").decode(encoding)
    except LookupError:
        return text


#: characters a terminal must not be sent from data: controls (an escape sequence in a label
#: value clears the screen or moves the cursor), format characters (a bidi override turns
#: the line around), lone surrogates (no encoding takes them), line and paragraph separators
_UNSAFE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _columns(char: str) -> int:
    """Terminal columns of one character: 2 wide (East Asian), 0 combining, else 1."""
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def columns(text: str) -> int:
    """Terminal columns ``text`` takes as :func:`shown` shows it (an unsafe character is a
    ``?``, one column)."""
    if text.isascii() and text.isprintable():
        return len(text)
    return sum(1 if unicodedata.category(c) in _UNSAFE else _columns(c) for c in text)


def ljust(text: str, width: int) -> str:
    """``text`` padded on the right to ``width`` terminal columns, not characters: padded by
    characters, the table's columns after a wide character stand out of line."""
    return text + " " * (width - columns(text))


def rjust(text: str, width: int) -> str:
    """``text`` padded on the left to ``width`` terminal columns (see :func:`ljust`)."""
    return " " * (width - columns(text)) + text


def shown(line: str, width: int, ellipsis: str = "…") -> str:
    """``line`` as it may go to a terminal of ``width`` columns: every unsafe character a
    ``?``, and cut (ending in ``ellipsis``) where its columns, not its characters, pass the
    width (a wide character takes two: a line of them longer than the terminal wraps, and the
    redrawn frame scrolls)."""
    if width <= 0:  # (``line[:-1]`` would keep nearly all of it)
        return ""
    if line.isascii() and line.isprintable():
        return line if len(line) <= width else line[: width - 1] + ellipsis
    chars = ["?" if unicodedata.category(c) in _UNSAFE else c for c in line]
    columns = [_columns(c) for c in chars]
    if sum(columns) <= width:
        return "".join(chars)
    kept, used = [], 0
    for char, wide in zip(chars, columns, strict=True):
        if used + wide > width - 1:
            break
        kept.append(char)
        used += wide
    return "".join(kept) + ellipsis


def wrapped(text: str, width: int, indent: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` terminal columns (:func:`columns`), broken
    between words (at spaces), each line after the first starting with ``indent``: cut at the
    width, a line lost its end. A word wider than a line by itself stays whole on its own line,
    for :func:`shown` to cut."""
    lead = text[: len(text) - len(text.lstrip(" "))]
    first, *words = text[len(lead) :].split(" ")
    lines, line = [], lead + first
    for word in words:
        if columns(f"{line} {word}") <= width or not line.strip():
            line = f"{line} {word}"
        else:
            lines.append(line)
            line = indent + word
    return [*lines, line]


def fitted(
    lines: list[str],
    height: int,
    ellipsis: str = "…",
    what: str = "lines",
    width: int | None = None,
) -> list[str]:
    """``lines``, at most ``height`` of them: the last ones, past the terminal's rows, said
    in a last line of their own (``… 3 more lines``, ``what`` naming them; a frame taller than
    the terminal scrolls on every redraw, its first lines out of sight), in the longest of its
    forms that fits ``width`` columns (:func:`longest`; None: the longest); on one row that
    line alone, on none nothing."""
    if len(lines) <= height:
        return lines
    if height <= 0:
        return []
    cut = len(lines) - height + 1
    forms = [f"{ellipsis} {cut} more {what}: a taller terminal shows them"]
    if width is not None:
        forms += [f"{ellipsis} {cut} more {what}", f"{ellipsis} {cut} more", f"{ellipsis}{cut}"]
    return [*lines[: height - 1], longest(forms, width, ellipsis)]


def longest(forms: list[str], width: int | None, ellipsis: str = "…") -> str:
    """The first of ``forms`` (longest first) that fits ``width`` terminal columns, so that a
    line saying what was cut is not cut itself (its count or its end lost); narrower than the
    last, ``ellipsis`` alone: something is cut. None: the first."""
    if width is None:
        return forms[0]
    for form in forms:
        if columns(form) <= width:
            return form
    return ellipsis if width >= 1 else ""


#: The fewest rows a live view is drawn to fit with its content: its first line and the line
#: saying how many more a taller terminal shows. A terminal of one row gets that line alone.
MIN_ROWS = 2


def rows(height: int, footer: int) -> tuple[int, int]:
    """(the view's rows, its footer's rows) on a terminal of ``height`` rows whose frames end
    in ``footer`` lines (the warnings printed before the view): the view keeps ``MIN_ROWS``
    (one on a terminal of one row, as on one that says it has none), the footer what is left,
    so the whole frame fits (a taller one scrolls on every redraw). From 2 rows a footer keeps
    one row at least, the view giving it up: a warning (a password sent in the clear) must
    not vanish from the view without a word, so it or the line counting them stays."""
    height = max(1, height)
    view = max(min(height, MIN_ROWS), height - footer)
    if footer and height >= 2:
        view = min(view, height - 1)
    return view, height - view
