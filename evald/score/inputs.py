"""The command's two input kinds behind one interface: items in input order, then notes.

``items()`` yields queries and rejections as they are read; ``chunks(size)`` yields the same
as :class:`Chunk` columns, which is what the command reads (one Python step per chunk rather
than per line); ``notes()`` (called after) says what was left out or added on purpose, so no
count changes without a word on stderr.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Protocol

from evald.score.records import Chunk, Query, Rejection

if TYPE_CHECKING:
    from evald.score.trec import JoinStats
    from evald.score.trec_columns import Columnar


class Input(Protocol):
    def items(self) -> Iterator[Query | Rejection]: ...

    def chunks(self, size: int) -> Iterator[Chunk]: ...

    def notes(self) -> list[str]: ...


class JsonlInput:
    """JSON Lines, streamed: memory does not grow with the input. The readers (and msgspec)
    are imported here only, so TREC input does not pay for them at start-up."""

    def __init__(self, lines: Iterable[bytes], source: str) -> None:
        self._lines = lines
        self._source = source

    def items(self) -> Iterator[Query | Rejection]:
        from evald.score.jsonl import read_jsonl

        return read_jsonl(self._lines, self._source)

    def chunks(self, size: int) -> Iterator[Chunk]:
        from evald.score.jsonl_chunks import read_chunks

        return read_chunks(self._lines, self._source, size)

    def notes(self) -> list[str]:
        return []


#: Run files from this size on are first tried with the columnar reader: below it, importing
#: pyarrow costs more than the exact reader. On the TREC benchmark's lines (30 bytes) the two
#: took the same CPU time between 60 000 and 75 000 lines (1.8-2.3 MB); at 50 000 the exact one
#: was 0.02 s faster, at 100 000 the columnar one 0.07 s.
COLUMNAR_MIN_BYTES = 2 << 20


def _join_stats() -> JoinStats:
    """Empty join counts; the TREC reader is imported only by TREC input (JSONL never needs it,
    and its start-up should not pay for it)."""
    from evald.score.trec import JoinStats

    return JoinStats()


class TrecInput:
    """A TREC run and qrels. Both are read whole first (as trec_eval does): a query's lines
    may be anywhere in the run, and only the full set of lines fixes its order.

    ``chunks`` reads files (binary streams) of ``columnar_min_bytes`` (by default
    :data:`COLUMNAR_MIN_BYTES`) or more with the
    columnar reader (:mod:`evald.score.trec_columns`) when it accepts every line; otherwise,
    and in ``items``, the exact reader reads the same bytes.
    """

    def __init__(
        self,
        run: tuple[Iterable[bytes], str],
        qrels: tuple[Iterable[bytes], str],
        *,
        complete: bool,
        columnar_min_bytes: int | None = None,
    ) -> None:
        self._run = run
        self._qrels = qrels
        self._complete = complete
        self._columnar_min_bytes = (
            COLUMNAR_MIN_BYTES if columnar_min_bytes is None else columnar_min_bytes
        )
        self._stats: JoinStats = _join_stats()
        self._negative = 0

    def items(self) -> Iterator[Query | Rejection]:
        from evald.score.trec import join, read_qrels, read_run

        run, rejected = read_run(*self._run)
        yield from rejected
        qrels, rejected = read_qrels(*self._qrels)
        yield from rejected
        self._negative = qrels.negative
        yield from join(run, qrels, complete=self._complete, stats=self._stats)

    def chunks(self, size: int) -> Iterator[Chunk]:
        columnar = self._columnar()
        if columnar is None:
            yield from chunked(self.items(), size)
            return
        self._stats, self._negative = columnar.stats, columnar.negative
        if len(columnar.lists):
            yield Chunk(lists=columnar.lists)

    def _columnar(self) -> Columnar | None:
        """Both files read by the columnar reader, or None (then ``items`` reads them)."""
        (run_lines, run_name), (qrels_lines, qrels_name) = self._run, self._qrels
        if not (isinstance(run_lines, io.IOBase) and isinstance(qrels_lines, io.IOBase)):
            return None
        run = run_lines.read()
        qrels = qrels_lines.read()
        self._run = (io.BytesIO(run), run_name)  # the same lines, for the exact reader
        self._qrels = (io.BytesIO(qrels), qrels_name)
        if len(run) < self._columnar_min_bytes:
            return None
        from evald.score.trec_columns import read_columnar

        return read_columnar(run, qrels, complete=self._complete)

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
