"""Output files named on a command line, checked before anything is read or opened.

Why: opening a file for writing empties it. An output that is also an input is gone before it
is read (or, read first, replaced by the output), and two outputs in one file write over each
other; the command would still exit 0. `evald replay` and `evald judge` refuse both up front.
Only regular files count: `/dev/null` or a terminal may take any number of outputs.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping

__all__ = ["clash"]


def clash(outputs: Mapping[str, str | None], inputs: Iterable[str]) -> str | None:
    """Why ``outputs`` (flag -> path; None and ``-`` are no file) cannot be written as named,
    or None."""
    sources = {_identity(path) for path in inputs if path != "-"}
    seen: dict[object, str] = {}
    for flag, path in outputs.items():
        if path is None or path == "-":
            continue
        key = _identity(path)
        if key is None:
            continue
        if key in sources:
            return f"{flag} {path} is also an input: writing it would destroy the input"
        if key in seen:
            return f"{flag} {path} is also {seen[key]}: give each its own file"
        seen[key] = flag
    return None


def _identity(path: str) -> object:
    """What names one file: its device and inode when it exists (a symbolic or hard link is
    the same file), else its resolved path; None for an existing file that is not a regular
    one (a device, a pipe, a terminal), which writing does not destroy."""
    try:
        status = os.stat(path)
    except OSError:  # not there yet: the path it will be created at
        return os.path.realpath(path)
    if not stat.S_ISREG(status.st_mode):
        return None
    return (status.st_dev, status.st_ino)
