"""Whole-file readers for well-formed TREC runs and qrels: C-level passes instead of a Python
step per line.

They only ever *accept*: a file with anything unusual (a comment, a blank line, a line with a
field count other than the usual, a number that is not plainly decimal, a byte that is not
printable ASCII or a space or tab, a docid twice in one query, a negative grade ...) returns
None, and :mod:`evald.score.trec` reads it line by line, naming every problem. So what the fast
path accepts is exactly what the line reader accepts, as the same values (a property test
checks this), and it decides speed, never an outcome.

How: the file is cut into pieces of whole lines; per piece, numpy counts the fields of every
line from the bytes (a field starts where a non-blank byte follows a blank one), and one
``str.split`` of the whole piece gives the fields, which are then taken by column (every 6th
for a run). With printable ASCII and spaces and tabs only, that split and the line reader's
per-line ``split`` cut the same fields.
"""

from __future__ import annotations

from itertools import compress
from operator import ne

import numpy as np

#: bytes per piece: the fields of a whole 1M-line run at once would be 6M strings
_PIECE = 4 << 20
#: plain decimal numbers hold only these; within them ``float`` and the line reader's pattern
#: accept the same strings (a malformed one such as ``1e`` or ``--1`` makes float raise)
_DECIMAL_CHARS = str.maketrans("", "", "0123456789.+-eE")

_BLANK = np.zeros(256, dtype=bool)
_BLANK[[ord(" "), ord("\t"), ord("\n")]] = True
#: bytes the fast path accepts: printable ASCII, space, tab, newline, and CR before a newline
_ALLOWED = np.zeros(256, dtype=bool)
_ALLOWED[32:127] = True
_ALLOWED[[ord("\t"), ord("\n")]] = True


def _pieces(data: bytes) -> list[bytes]:
    """``data`` cut after newlines into pieces of about ``_PIECE`` bytes."""
    out, start = [], 0
    while start < len(data):
        stop = data.find(b"\n", start + _PIECE)
        stop = len(data) if stop < 0 else stop + 1
        out.append(data[start:stop])
        start = stop
    return out


def _columns(piece: bytes, count: int) -> list[str] | None:
    """The piece's fields, ``count`` per line, flat; None unless every line has exactly
    ``count`` fields of plain characters and none starts with ``#``."""
    raw = np.frombuffer(piece, dtype=np.uint8)
    if not _ALLOWED[raw].all():
        return None  # control bytes, CR, non-ASCII (UTF-8 docids: the line reader)
    blank = _BLANK[raw]
    starts = np.flatnonzero(~blank & np.concatenate(([True], blank[:-1])))
    ends = np.flatnonzero(raw == ord("\n"))
    if raw.shape[0] and raw[-1] != ord("\n"):
        ends = np.append(ends, raw.shape[0])
    if starts.shape[0] != count * ends.shape[0]:
        return None  # blank lines, extra or missing fields
    # line i holds fields count·i ... count·i + count − 1 exactly: its first field starts after
    # the previous line's end and its last one before its own end
    firsts, lasts = starts[::count], starts[count - 1 :: count]
    if (lasts > ends).any() or (firsts[1:] < ends[:-1]).any():
        return None
    if (raw[firsts] == ord("#")).any():
        return None  # a comment line
    return piece.decode("ascii").split()


def _numbers(texts: list[str]) -> list[float] | None:
    """The values of plain decimal numbers, or None if one is anything else."""
    if "".join(texts).translate(_DECIMAL_CHARS):
        return None
    try:
        return list(map(float, texts))
    except ValueError:
        return None


def fast_run(data: bytes) -> list[tuple[str, list[str], np.ndarray, range]] | None:
    """Per query, in order of first appearance: (qid, docids, scores, line numbers); None if
    the line reader must read the file."""
    docs: list[str] = []
    scores: list[float] = []
    spans: list[tuple[str, int]] = []  # (qid, lines) for each run of consecutive lines
    for piece in _pieces(data):
        fields = _columns(piece, 6)
        if fields is None:
            return None
        values = _numbers(fields[4::6])
        if values is None:
            return None
        docs += fields[2::6]
        scores += values
        qids = fields[0::6]
        del fields
        starts = [0, *compress(range(1, len(qids)), map(ne, qids[1:], qids[:-1]))]
        for lo, hi in zip(starts, [*starts[1:], len(qids)], strict=True):
            qid = qids[lo]
            if spans and spans[-1][0] == qid:
                spans[-1] = (qid, spans[-1][1] + hi - lo)
            else:
                spans.append((qid, hi - lo))
    values_array = np.array(scores, dtype=np.float64)
    if np.isnan(values_array).any():
        return None
    if len({qid for qid, _ in spans}) != len(spans):
        return None  # a query's lines in several places: the line reader keeps their order
    out = []
    lo = 0
    for qid, size in spans:
        hi = lo + size
        query_docs = docs[lo:hi]
        if len(set(query_docs)) != size:
            return None  # the line reader reports every repeated docid
        out.append((qid, query_docs, values_array[lo:hi], range(lo + 1, hi + 1)))
        lo = hi
    return out


def fast_qrels(data: bytes) -> dict[str, dict[str, float]] | None:
    """Judgments per query in order of first appearance; None if the line reader must read the
    file (which also counts negative grades and reports repeated judgments)."""
    judgments: dict[str, dict[str, float]] = {}
    for piece in _pieces(data):
        fields = _columns(piece, 4)
        if fields is None:
            return None
        grades = _numbers(fields[3::4])
        if grades is None:
            return None
        values = np.array(grades, dtype=np.float64)
        if not np.isfinite(values).all() or (values < 0).any():
            return None
        for qid, doc, grade in zip(fields[0::4], fields[2::4], grades, strict=True):
            judged = judgments.setdefault(qid, {})
            if doc in judged:
                return None
            judged[doc] = grade
    return judgments
