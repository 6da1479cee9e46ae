"""Lines of input files, each within a memory bound, plain or gzip-compressed.

A file whose first bytes are the gzip magic is read through ``gzip`` whatever its name (so
``-`` can be compressed too); a line longer than the limit is never held whole.
"""

from __future__ import annotations

import contextlib
import gzip
import sys
from collections.abc import Iterator
from typing import IO, Any

from evald.input_rule import gzipped

#: bytes read at a time while skipping the rest of an over-long line
SKIP_CHUNK = 1 << 16


class InputError(Exception):
    """An input that cannot be read (the message names it)."""


def bounded_lines(stream: IO[bytes], limit: int) -> Iterator[tuple[bytes, int, int]]:
    """(line without its newline, bytes consumed, line length) per line of ``stream``.

    A line longer than ``limit`` bytes comes back cut to its first ``limit`` bytes, with its
    full length: memory stays within ``limit`` plus one read buffer whatever the input.
    """
    cap = limit + 2  # room for the body and a CRLF
    readline = stream.readline
    while True:
        raw = readline(cap)
        if not raw:
            return
        consumed = len(raw)
        if len(raw) == cap and not raw.endswith(b"\n"):  # over-long: skip to its end
            head = raw[:limit]
            tail = b""
            while True:
                more = readline(SKIP_CHUNK)
                if not more:
                    break
                consumed += len(more)
                tail = (tail + more)[-2:]
                if more.endswith(b"\n"):
                    break
            ending = 2 if tail.endswith(b"\r\n") else 1 if tail.endswith(b"\n") else 0
            yield head, consumed, consumed - ending
            continue
        line = raw.rstrip(b"\r\n")
        yield line, consumed, len(line)


def _opened(path: str) -> contextlib.AbstractContextManager[Any]:
    """``path`` (``-``: stdin) opened for bytes, decompressed when it starts as gzip does (a
    stream that cannot be peeked at is read as it is)."""
    if path == "-":
        stream: IO[bytes] = sys.stdin.buffer
        ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext(stream)
    else:
        try:
            stream = ctx = open(path, "rb")  # noqa: SIM115 (closed by the caller's with)
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror}") from None
    if not gzipped(stream):
        return ctx
    return _decompressed(ctx, stream)


@contextlib.contextmanager
def _decompressed(
    ctx: contextlib.AbstractContextManager[Any], stream: IO[bytes]
) -> Iterator[IO[bytes]]:
    with ctx, gzip.GzipFile(fileobj=stream) as unpacked:
        yield unpacked  # type: ignore[misc]


def read_lines(paths: list[str], limit: int) -> Iterator[tuple[str, int, bytes, int, int]]:
    """(source name, line number, raw line without its newline (at most ``limit`` bytes),
    bytes consumed, full line length) per line of ``paths`` in order (none: stdin). A
    compressed file counts its decompressed bytes."""
    for path in paths or ["-"]:
        name = "<stdin>" if path == "-" else path
        with _opened(path) as stream:
            try:
                lines = enumerate(bounded_lines(stream, limit), start=1)
                for number, (line, size, length) in lines:
                    if length <= limit and not line.strip():
                        line = b""
                    yield name, number, line, size, length
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                raise InputError(f"cannot read {name}: {exc}") from None
