"""Output files named on a command line, checked before anything is read or opened.

Why: opening a file for writing empties it. An output that is also an input is gone before it
is read (or, read first, replaced by the output), and two outputs in one file write over each
other; the command would still exit 0. `evald replay` and `evald judge` refuse both up front.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

__all__ = ["clash"]


def clash(outputs: Mapping[str, str | None], inputs: Iterable[str]) -> str | None:
    """Why ``outputs`` (flag -> path; None and ``-`` are no file) cannot be written as named,
    or None."""
    sources = [path for path in inputs if path != "-"]
    seen: dict[str, str] = {}
    for flag, path in outputs.items():
        if path is None or path == "-":
            continue
        if any(_same_file(path, source) for source in sources):
            return f"{flag} {path} is also an input: writing it would destroy the input"
        key = os.path.realpath(path)
        if key in seen:
            return f"{flag} {path} is also {seen[key]}: give each its own file"
        seen[key] = flag
    return None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # the output does not exist yet
        return False
