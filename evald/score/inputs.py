"""The command's two input kinds behind one interface: items in input order, then notes.

``items()`` yields queries and rejections as they are read; ``chunks(size)`` yields the same
as :class:`Chunk` columns, which is what the command reads (one Python step per chunk rather
than per line); ``notes()`` (called after) says what was left out or added on purpose, so no
count changes without a word on stderr.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Protocol

from evald.score.jsonl import read_jsonl
from evald.score.jsonl_chunks import Chunk, read_chunks
from evald.score.records import Query, Rejection
from evald.score.trec import JoinStats, join, read_qrels, read_run


class Input(Protocol):
    def items(self) -> Iterator[Query | Rejection]: ...

    def chunks(self, size: int) -> Iterator[Chunk]: ...

    def notes(self) -> list[str]: ...


class JsonlInput:
    """JSON Lines, streamed: memory does not grow with the input."""

    def __init__(self, lines: Iterable[bytes], source: str) -> None:
        self._lines = lines
        self._source = source

    def items(self) -> Iterator[Query | Rejection]:
        return read_jsonl(self._lines, self._source)

    def chunks(self, size: int) -> Iterator[Chunk]:
        return read_chunks(self._lines, self._source, size)

    def notes(self) -> list[str]:
        return []


class TrecInput:
    """A TREC run and qrels. Both are read whole first (as trec_eval does): a query's lines
    may be anywhere in the run, and only the full set of lines fixes its order."""

    def __init__(
        self,
        run: tuple[Iterable[bytes], str],
        qrels: tuple[Iterable[bytes], str],
        *,
        complete: bool,
    ) -> None:
        self._run = run
        self._qrels = qrels
        self._complete = complete
        self._stats = JoinStats()
        self._negative = 0

    def items(self) -> Iterator[Query | Rejection]:
        run, rejected = read_run(*self._run)
        yield from rejected
        qrels, rejected = read_qrels(*self._qrels)
        yield from rejected
        self._negative = qrels.negative
        yield from join(run, qrels, complete=self._complete, stats=self._stats)

    def chunks(self, size: int) -> Iterator[Chunk]:
        return chunked(self.items(), size)

    def notes(self) -> list[str]:
        s = self._stats
        notes: list[str] = []
        if s.unjudged:
            notes.append(
                f"{s.unjudged} run queries have no qrels and were skipped (as trec_eval does)"
            )
        if s.missing and not self._complete:
            notes.append(
                f"{s.missing} qrels queries are not in the run and were skipped (as trec_eval "
                "does); --complete scores them as empty rankings (trec_eval -c)"
            )
        if s.completed:
            notes.append(
                f"{s.completed} qrels queries missing from the run were scored as empty "
                "rankings (--complete)"
            )
        if s.not_scored:
            notes.append(f"{s.not_scored} queries were not scored because of rejected lines")
        if self._negative:
            notes.append(
                f"{self._negative} judgments with a negative grade were read as unjudged "
                "(trec_eval's convention)"
            )
        return notes


def chunked(items: Iterable[Query | Rejection], size: int) -> Iterator[Chunk]:
    """Group items into chunks of up to ``size`` items, order kept within each column."""
    if size < 1:
        raise ValueError("size must be ≥ 1")
    it = iter(items)
    while group := list(islice(it, size)):
        chunk = Chunk()
        for item in group:
            chunk.add(item)
        yield chunk
