"""JSON Lines read a chunk at a time: one typed decode per line, the checks once per chunk.

The per-line reader (:mod:`evald.score.jsonl`) parses to Python dicts and then checks each
decoded line in Python, which costs more than the parse itself. Here msgspec decodes each line
straight into a typed record: the types (``qid`` a string or a non-boolean integer, ``ranking``
an array of strings, grades non-boolean numbers from 0 to 100) are checked in C while parsing,
and the checks that remain (distinct docids, no repeated key, grades that fit a float) run once over
the whole chunk with C-level maps.

This path only ever *accepts*. A line it does not accept, or any line of a chunk-level check
that failed, is read by the per-line reader, which names the first problem exactly; so what is
accepted and every reason and line number are the per-line reader's, and a property test checks
that both give the same queries and rejections.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain, islice, repeat
from operator import attrgetter
from typing import Annotated

import msgspec
import numpy as np

from evald.input_rule import MAX_GRADE
from evald.score.jsonl import read_line
from evald.score.records import Chunk, Query, Rejection

_Grade = (
    Annotated[int, msgspec.Meta(ge=0, le=int(MAX_GRADE))]
    | Annotated[float, msgspec.Meta(ge=0, le=MAX_GRADE)]
)


#: a qid that is not blank: Python's ``re`` (msgspec's), whose ``\S`` is ``not str.isspace``
_Qid = Annotated[str, msgspec.Meta(pattern=r"\S")]


class _Line(msgspec.Struct):
    """The three fields a line must have; unknown keys are skipped (and sent to the per-line
    reader by the colon count, since their keys are not counted)."""

    qid: _Qid | int
    ranking: list[str]
    qrels: dict[str, _Grade]


_DECODE = msgspec.json.Decoder(_Line).decode
_FIELDS = 3  # keys of a line with no unknown key: qid, ranking, qrels
_qid = attrgetter("qid")
_ranking = attrgetter("ranking")
_qrels = attrgetter("qrels")
_values = dict.values
_colons = repeat(b":")


#: After a chunk in which most lines needed the per-line reader (lines with unknown keys, such
#: as ``"query"``, always do: their keys cannot be counted from the typed record), this many
#: chunks go to the per-line reader directly, so such files pay nothing for a typed decode that
#: cannot accept them; then the typed path is tried again.
SKIP_AFTER_MISS = 64


def read_chunks(lines: Iterable[bytes], source: str, size: int) -> Iterator[Chunk]:
    """Read ``size`` raw lines at a time; lines are numbered from 1 across chunks."""
    if size < 1:
        raise ValueError("size must be ≥ 1")
    it = iter(lines)
    start = 0
    skip = 0
    while raws := list(islice(it, size)):
        if skip:
            skip -= 1
            yield _merge(raws, start, source, [], [])
        else:
            chunk = read_chunk(raws, start, source)
            if chunk.fallbacks * 2 > len(raws):
                skip = SKIP_AFTER_MISS
            yield chunk
        start += len(raws)


def read_chunk(raws: list[bytes], start: int, source: str) -> Chunk:
    """The chunk of lines ``start + 1 ...``: accepted here, or by the per-line reader."""
    try:  # the common case, every line decodes: no Python step per line
        good: list[_Line] = list(map(_DECODE, raws))
        fast = list(range(len(raws)))
        lines = raws
    except (ValueError, RecursionError):  # msgspec.DecodeError is a ValueError
        records = list(map(_decoded, raws))
        fast = [i for i, record in enumerate(records) if record is not None]
        good = [records[i] for i in fast]  # type: ignore[misc]
        lines = [raws[i] for i in fast]
    rankings = list(map(_ranking, good))
    qrels = list(map(_qrels, good))
    if not _all_pass(lines, good, rankings, qrels):
        passed = _passing(lines, good, rankings, qrels)
        fast = [i for i, ok in zip(fast, passed, strict=True) if ok]
        good = [r for r, ok in zip(good, passed, strict=True) if ok]
        rankings = list(map(_ranking, good))
        qrels = list(map(_qrels, good))
    if len(fast) == len(raws):
        return Chunk(list(map(_qid, good)), rankings, qrels)
    return _merge(raws, start, source, fast, good)


def _decoded(raw: bytes) -> _Line | None:
    """The line's record, or None if msgspec does not accept it."""
    try:
        return _DECODE(raw)
    except (ValueError, RecursionError):
        return None


def _merge(raws: list[bytes], start: int, source: str, fast: list[int], good: list[_Line]) -> Chunk:
    """Input order again: the accepted records, and the per-line reader's verdict on the rest."""
    chunk = Chunk(fallbacks=len(raws) - len(fast))
    accepted = dict(zip(fast, good, strict=True))
    for i, raw in enumerate(raws):
        record = accepted.get(i)
        item: Query | Rejection | None
        if record is not None:
            item = Query(record.qid, record.ranking, record.qrels)
        else:
            item = read_line(raw, start + i + 1, source)
        if item is not None:  # None: a blank line
            chunk.add(item)
    return chunk


def _all_pass(
    lines: list[bytes],
    good: list[_Line],
    rankings: list[list[str]],
    qrels: list[dict[str, float]],
) -> bool:
    """The chunk-level checks: True when every decoded line passes all of them.

    * Distinct docids: the sets of the rankings are as long as the rankings.
    * No repeated key: outside strings every ``:`` of a line ends one key, and a line holds at
      least as many as its decoded keys (more if a key was repeated, as msgspec keeps the last,
      or unknown, as they are skipped). So when the chunk holds exactly as many colons as its
      records have keys, no line has a repeated or unknown key. Colons inside strings (docids
      such as ``sku:1``) are subtracted when no ``\\u003a`` escape could have made one that is
      not on the line; every subtraction can only make the total larger than the keys, never
      hide a repeated key.
    * No blank docid (the per-line reader words it; a blank qid msgspec refuses).
    * Grades that fit a float (msgspec keeps huge integers, which the metric engine could not
      read): the float64 conversion of every grade does not overflow.
    """
    total = sum(map(len, rankings))
    if sum(map(len, map(set, rankings))) != total:
        return False
    if _blank_docid(rankings) or _blank_docid(qrels):
        return False
    keys = _FIELDS * len(good) + sum(map(len, qrels))
    colons = sum(map(bytes.count, lines, _colons))
    if colons != keys:
        if any(b"\\u003" in line for line in lines):
            return False
        if colons - _string_colons(good, rankings, qrels) != keys:
            return False
    return _grades_fit(qrels)


def _blank_docid(lists: list[list[str]] | list[dict[str, float]]) -> bool:
    """Whether a docid of ``lists`` (rankings, or qrels by docid) is blank (empty, or white
    space only: ``input_rule.blank``), in C-level passes."""
    docids = chain.from_iterable(lists)
    if min(map(len, docids), default=1) == 0:
        return True
    return any(map(str.isspace, chain.from_iterable(lists)))


def _string_colons(
    good: list[_Line], rankings: list[list[str]], qrels: list[dict[str, float]]
) -> int:
    """Colons inside the decoded strings of the records: docids, judged docids, string qids."""
    qids = [q for q in map(_qid, good) if type(q) is str]
    return (
        "".join(chain.from_iterable(rankings)).count(":")
        + "".join(chain.from_iterable(qrels)).count(":")
        + "".join(qids).count(":")
    )


def _grades_fit(qrels: list[dict[str, float]]) -> bool:
    grades = chain.from_iterable(map(_values, qrels))
    try:
        np.fromiter(grades, dtype=np.float64, count=sum(map(len, qrels)))
    except OverflowError:
        return False
    return True


def _passing(
    lines: list[bytes],
    good: list[_Line],
    rankings: list[list[str]],
    qrels: list[dict[str, float]],
) -> list[bool]:
    """Which lines pass the chunk-level checks, line by line (a check failed for the chunk)."""
    return [
        _all_pass([line], [record], [ranking], [judged])
        for line, record, ranking, judged in zip(lines, good, rankings, qrels, strict=True)
    ]
