"""TREC run and qrels read as columns: no Python object per line or per field.

The exact reader (:mod:`evald.score.trec`) builds a Python string per field: on a 1M-line run
that alone costs more than the whole of trec_eval. Here pyarrow's CSV reader (C++, on all cores)
reads the fields into columns, docids and qids become integer codes (a hash table each), the run
is joined to the qrels by one hash look-up of integer keys, and one multi-key sort puts every
query in trec_eval's order. What comes out is :class:`Lists`, the numbers the scorer pads into
batches, so the whole file never turns into Python objects.

This path only ever *accepts*: :func:`read_columnar` returns None for any input it cannot take
exactly as the exact reader would (a line that reader rejects, a comment, a repeated docid,
whitespace other than one delimiter between fields, non-ASCII bytes), and the caller reads the
same bytes with the exact reader, which names every problem with its line. A property test
checks that whatever this path accepts, it gives the exact reader's lists and notes.

pyarrow is imported here only, and the caller comes here only for files big enough to pay for
that import (``COLUMNAR_MIN_BYTES`` in :mod:`evald.score.inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from evald.input_rule import MAX_GRADE
from evald.score.batching import Lists
from evald.score.trec import JoinStats

if TYPE_CHECKING:
    import pyarrow as pa

#: Each file's fields and how they are read: every field is read, so that an empty one (a
#: doubled delimiter) is seen, though only qid, doc and the number are kept.
RUN_COLUMNS = dict(
    qid="string", q0="string", doc="string", rank="string", score="float64", tag="string"
)
QRELS_COLUMNS = dict(qid="string", iter="string", doc="string", grade="float64")
#: ASCII characters Python's ``str.split()`` also splits on; with one of them on a line, the
#: exact reader's fields could differ from the CSV reader's (``\r`` is allowed only in ``\r\n``)
_OTHER_WHITESPACE = (b"\v", b"\f", b"\x1c", b"\x1d", b"\x1e", b"\x1f")


@dataclass(frozen=True)
class Columnar:
    """The scored queries as numbers, and what the join left out (as :class:`JoinStats`)."""

    lists: Lists
    stats: JoinStats
    negative: int  # judgments with a grade < 0, read as unjudged


def delimiter_of(data: bytes) -> bytes | None:
    """The byte (space, or tab if the first lines hold one) the fields are split at, or None.

    Split at single delimiters, a line's fields are then exactly the fields ``str.split()``
    finds, provided no field comes out empty (a doubled delimiter, or one at a line's start or
    end), which :func:`_table` checks: the file is ASCII, the other delimiter and the rarer
    whitespace never occur, and ``\\r`` only ends a line (``\\r\\n``).
    """
    if not data.isascii():
        return None
    delimiter, other = (b"\t", b" ") if b"\t" in data[:4096] else (b" ", b"\t")
    if other in data or any(ws in data for ws in _OTHER_WHITESPACE):
        return None
    if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):
        return None
    return delimiter


def _table(data: bytes, columns: dict[str, str], kept: list[str]) -> pa.Table | None:
    """The ``kept`` columns of the file (``columns`` name each field: ``"string"`` or
    ``"float64"``), or None if a line does not have exactly as many fields as ``columns`` (an
    empty one counts as missing) or a number does not parse."""
    import pyarrow as pa
    from pyarrow import csv

    delimiter = delimiter_of(data)
    if delimiter is None:
        return None
    try:
        table = csv.read_csv(
            pa.py_buffer(data),
            read_options=csv.ReadOptions(column_names=list(columns)),
            parse_options=csv.ParseOptions(
                delimiter=delimiter.decode(),
                quote_char=False,
                escape_char=False,
                double_quote=False,
                newlines_in_values=False,
                ignore_empty_lines=True,
            ),
            convert_options=csv.ConvertOptions(
                column_types={name: pa.type_for_alias(kind) for name, kind in columns.items()},
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                check_utf8=False,  # delimiter_of found ASCII only
            ),
            memory_pool=pa.system_memory_pool(),
        )
    except pa.ArrowInvalid:  # a line with more or fewer fields, a number that does not parse
        return None
    for name, kind in columns.items():
        if (
            kind == "string"
            and table.num_rows
            and _call("min", _call("binary_length", table[name])).as_py() == 0
        ):
            return None  # an empty field: two delimiters in a row, or one at a line's end
    return table.select(kept)


def read_columnar(run: bytes, qrels: bytes, *, complete: bool) -> Columnar | None:
    """The lists the exact reader and join give for these files, or None to use that reader.

    1. Read both files as columns; decline a line the exact reader would reject or skip.
    2. Code qids (run first, then qrels: codes in the join's output order) and docids.
    3. Decline a repeated (qid, docid) in either file; join run lines to grades by key.
    4. Sort the run by qid code, score descending, docid descending (trec_eval's order).
    5. Keep the queries the join scores; cut each column at query boundaries.
    """
    import pyarrow as pa
    from pyarrow._compute import MatchSubstringOptions, SetLookupOptions, SortOptions

    run_t = _table(run, RUN_COLUMNS, ["qid", "doc", "score"])
    qrels_t = _table(qrels, QRELS_COLUMNS, ["qid", "doc", "grade"])
    if run_t is None or qrels_t is None:
        return None
    # + 0.0 turns -0.0 into 0.0: the two tie in Python and C, not in Arrow's sort
    scores = _numpy(run_t["score"].chunks, np.float64) + 0.0
    grades = _numpy(qrels_t["grade"].chunks, np.float64)
    if np.isnan(scores).any() or not (np.isfinite(grades) & (grades <= MAX_GRADE)).all():
        return None  # the exact reader rejects a NaN score and a grade not finite or above 100
    n_run = run_t.num_rows
    qids = _call("dictionary_encode", pa.chunked_array(run_t["qid"].chunks + qrels_t["qid"].chunks))
    docs = _call("dictionary_encode", pa.chunked_array(run_t["doc"].chunks + qrels_t["doc"].chunks))
    names = qids.chunk(0).dictionary if qids.num_chunks else None  # every chunk shares it
    comment = names is not None and bool(
        _call("any", _call("starts_with", names, options=MatchSubstringOptions("#"))).as_py()
    )
    if comment:
        return None  # a comment line with the right number of fields
    q_codes = _codes(qids)
    n_docs = max(1, len(docs.chunk(0).dictionary) if docs.num_chunks else 1)
    doc_codes = _codes(docs)
    keys = q_codes * n_docs
    keys += doc_codes  # one int64 per (qid, docid): both codes are below 2^31
    run_keys, qrels_keys = keys[:n_run], keys[n_run:]
    space = (len(names) if names is not None else 0) * n_docs  # every key is below it
    if _repeats(run_keys, space) or _repeats(qrels_keys, space):
        return None  # the exact reader rejects the query's lines, naming each repeat
    at = _call(  # null: not judged
        "index_in", _arrow(run_keys), options=SetLookupOptions(_arrow(qrels_keys))
    )
    found = _valid(at)
    at_np = np.where(found, _numpy([at], np.int32), 0)
    judged_grades = np.where(grades >= 0, grades, np.nan)  # negative: unjudged (trec_eval)
    served = np.where(found, judged_grades[at_np] if grades.shape[0] else np.nan, np.nan)
    run_q = q_codes[:n_run]
    # each docid by its place among the sorted distinct docids (bytewise, as strcmp): an int32
    # a line to sort by, in the strings' own order, where a copy of every docid string was
    doc_rank = _dictionary_ranks(docs)[doc_codes[:n_run]]
    del keys, doc_codes
    columns = [_arrow(run_q), _arrow(scores), _arrow(doc_rank)]
    order = _call(
        "sort_indices",
        pa.Table.from_arrays(columns, names=["q", "s", "d"]),
        options=SortOptions([("q", "ascending"), ("s", "descending"), ("d", "descending")]),
    )
    return _lists(
        [] if names is None else names.to_pylist(),
        run_q,
        served[_numpy([order], np.uint64)],
        q_codes[n_run:],
        grades,
        complete=complete,
    )


def _call(name: str, *args: object, options: object = None) -> Any:
    """Arrow compute function ``name`` on ``args``.

    ``pyarrow.compute`` builds a Python wrapper with a docstring for each of its few hundred
    functions when imported: 0.03-0.04 s of CPU, a tenth of a 200k-line run. Its
    ``call_function`` is the compiled ``pyarrow._compute``'s, which imports at no measurable
    cost, so that is called instead; a test checks ``pyarrow.compute`` stays unimported.
    """
    from pyarrow._compute import call_function

    return call_function(name, list(args), options)


# pyarrow's own conversions to and from numpy import pandas when it is installed (0.3 s), so
# primitive columns without nulls cross over through their data buffers, without a copy.


def _numpy(chunks: list[pa.Array], dtype: type) -> np.ndarray:
    """The chunks of a primitive column without nulls as one numpy array of ``dtype`` (the
    chunks' Arrow type)."""
    parts: list[np.ndarray] = [
        np.frombuffer(c.buffers()[1], dtype=dtype)[c.offset : c.offset + len(c)]
        for c in chunks
        if len(c)
    ]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _valid(array: pa.Array) -> np.ndarray:
    """Which entries of an array are not null, from its validity bitmap."""
    bitmap = array.buffers()[0]
    if bitmap is None:
        return np.ones(len(array), dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[array.offset : array.offset + len(array)].astype(bool)


def _arrow(values: np.ndarray) -> pa.Array:
    """A numpy int64, int32 or float64 array as an Arrow array sharing its memory."""
    import pyarrow as pa

    kind = {np.dtype(np.int64): pa.int64(), np.dtype(np.int32): pa.int32()}.get(
        values.dtype, pa.float64()
    )
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(kind, values.shape[0], [None, pa.py_buffer(values)])


def _dictionary_ranks(encoded: pa.ChunkedArray) -> np.ndarray:
    """Each code's place among the dictionary's strings in Arrow's (bytewise) order, int32."""
    if not encoded.num_chunks:
        return np.zeros(0, dtype=np.int32)
    dictionary = encoded.chunk(0).dictionary
    order = _numpy([_call("sort_indices", dictionary)], np.uint64)
    ranks = np.empty(order.shape[0], dtype=np.int32)
    ranks[order] = np.arange(order.shape[0], dtype=np.int32)
    return ranks


def _codes(encoded: pa.ChunkedArray) -> np.ndarray:
    """A dictionary-encoded column's codes (one dictionary for every chunk) as int64."""
    return _numpy([c.indices for c in encoded.chunks], np.int32).astype(np.int64)


#: Bytes per key the table of seen keys may take (in :func:`_repeats`) before a sort is used
#: instead: a 1M-line run with 50 000 distinct docids over 1 000 queries takes 50.
SEEN_TABLE_BYTES_PER_KEY = 64
#: ... and bytes in all: past that a sort (8 bytes a key) takes less memory, where the table
#: would be the largest single allocation (250 MB for 5M lines over 5 000 queries)
SEEN_TABLE_MAX_BYTES = 64 << 20


def _repeats(keys: np.ndarray, space: int) -> bool:
    """Whether a key (each in ``range(space)``) occurs twice.

    A table of one byte per possible key, when that is at most
    :data:`SEEN_TABLE_BYTES_PER_KEY` bytes a key and :data:`SEEN_TABLE_MAX_BYTES` in all: one
    scattered write per key (at 1M lines 0.015-0.10 s of CPU, most of it faulting the table's
    pages in, against 0.06-0.08 s for a sort); otherwise a sort (measured twice as fast as
    Arrow's hash count).
    """
    if space <= min(SEEN_TABLE_BYTES_PER_KEY * keys.shape[0], SEEN_TABLE_MAX_BYTES):
        seen = np.zeros(space, dtype=bool)
        seen[keys] = True
        return int(np.count_nonzero(seen)) != keys.shape[0]
    ordered = np.sort(keys)
    return bool((ordered[1:] == ordered[:-1]).any())


def _lists(
    names: list[str],
    run_q: np.ndarray,
    served_sorted: np.ndarray,
    qrels_q: np.ndarray,
    grades: np.ndarray,
    *,
    complete: bool,
) -> Columnar:
    """Lists for the queries the join scores, in its order: run queries with qrels, then (with
    ``complete``) qrels-only queries; ``served_sorted`` is grouped by query code already."""
    n = len(names)
    run_count = int(run_q.max()) + 1 if run_q.shape[0] else 0
    judged = np.zeros(n, dtype=bool)
    judged[qrels_q] = True  # every qid on a qrels line, even with negative grades only
    scored = judged.copy()
    if not complete:
        scored[run_count:] = False
    lengths = np.bincount(run_q, minlength=n)
    served = served_sorted[np.repeat(scored, lengths)]
    positive = grades >= 0
    kept = positive & scored[qrels_q]
    judgments = grades[kept][np.argsort(qrels_q[kept], kind="stable")]
    counts = np.bincount(qrels_q[kept], minlength=n)
    missing = n - run_count
    stats = JoinStats(
        unjudged=int(run_count - np.count_nonzero(judged[:run_count])),
        missing=missing,
        completed=missing if complete else 0,
    )
    chosen = np.flatnonzero(scored)
    lists = Lists(
        [names[i] for i in chosen.tolist()],
        lengths[chosen],
        served,
        counts[chosen],
        judgments,
    )
    return Columnar(lists, stats, int(grades.shape[0] - np.count_nonzero(positive)))
