"""TREC run and qrels files, read and joined the way trec_eval does it.

Run lines are ``qid Q0 docid rank score tag`` (fields after the tag are ignored, as is the rank:
each query is re-ordered by score descending, then docid descending, trec_eval's rule). Qrels
lines are ``qid iter docid grade``. Blank lines and lines starting with ``#`` are skipped.

Where trec_eval aborts the whole evaluation (a malformed line, a docid twice in one query) evald
reports the line and leaves out only the query it belongs to: a query is scored from complete
data or not at all, never from what is left after dropping a line.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Iterator
from operator import attrgetter

from evald.input_rule import BOM_TEXT, MAX_GRADE
from evald.score.records import Query, Rejection

# ASCII decimal numbers only: float() alone would also take "1_000", "nan" and non-ASCII digits,
# which trec_eval's atof()/atol() read as something else entirely.
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_INFINITY = re.compile(r"[+-]?inf(?:inity)?", re.ASCII | re.IGNORECASE)


def parse_score(text: str) -> float | None:
    """A run score: a decimal number or ±inf (both order well); None if not a number or NaN."""
    if _DECIMAL.fullmatch(text) or _INFINITY.fullmatch(text):
        return float(text)
    return None


def parse_grade(text: str) -> float | None:
    """A qrels grade: a finite decimal number; None otherwise."""
    if _DECIMAL.fullmatch(text):
        value = float(text)
        if math.isfinite(value):
            return value
    return None


def _fields(raw: bytes) -> list[str] | str | None:
    """Whitespace-split fields of a line, None to skip it, or why it cannot be read."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 (byte {exc.start})"
    fields = text.removeprefix(BOM_TEXT).split()  # a byte-order mark is ignored on any line
    if not fields or fields[0].startswith("#"):
        return None
    return fields


def _qid_of(raw: bytes) -> str | None:
    """The first field of an undecodable line, if it decodes: the query the line belonged to."""
    first = raw.split(None, 1)[:1]
    try:
        return first[0].decode("utf-8") if first else None
    except UnicodeDecodeError:
        return None


# The classes below are plain classes with __slots__ rather than dataclasses: building a
# dataclass costs about 0.3 ms at import, and this module is on the start-up path of TREC input.


class Qrels:
    """Judgments per query, in first-appearance order.

    Negative grades are kept out of ``judgments``: trec_eval reads them as "in the pool but not
    judged", which no measure counts as relevant and no ideal ranking includes, so every value
    stays equal to trec_eval's. ``negative`` counts them so the command can say so.
    """

    __slots__ = ("bad", "judgments", "negative")

    def __init__(self) -> None:
        self.judgments: dict[str, dict[str, float]] = {}  # every qid seen
        self.negative = 0
        self.bad: set[str] = set()


def _reject(
    rejections: list[Rejection],
    bad: set[str],
    source: str,
    number: int,
    reason: str,
    qid: str | None,
) -> None:
    """Reject line ``number``; its query (when known) is left out whole, never scored in part."""
    if qid is not None:
        bad.add(qid)
        reason += f"; query {qid!r} is not scored"
    rejections.append(Rejection(source, number, reason))


def read_qrels(lines: Iterable[bytes], source: str) -> tuple[Qrels, list[Rejection]]:
    """Read a qrels file; a query with a rejected line is marked bad (not scored)."""
    qrels = Qrels()
    negatives: set[tuple[str, str]] = set()  # (qid, docid) judged with a grade < 0
    rejections: list[Rejection] = []
    for number, raw in enumerate(lines, start=1):
        fields = _fields(raw)
        if fields is None:
            continue
        if isinstance(fields, str):
            qid = _qid_of(raw)
            if qid is not None:
                qrels.judgments.setdefault(qid, {})
            _reject(rejections, qrels.bad, source, number, fields, qid)
            continue
        judged = qrels.judgments.setdefault(fields[0], {})
        if len(fields) != 4:
            reason = f"expected 4 fields (qid iter docid grade), got {len(fields)}"
            _reject(rejections, qrels.bad, source, number, reason, fields[0])
            continue
        qid, _, doc, grade_text = fields
        grade = parse_grade(grade_text)
        if grade is None:
            reason = f"grade {grade_text!r} is not a finite number"
            _reject(rejections, qrels.bad, source, number, reason, qid)
            continue
        if grade > MAX_GRADE:
            reason = f"grade {grade_text!r} is above {MAX_GRADE:g}, the largest grade"
            _reject(rejections, qrels.bad, source, number, reason, qid)
            continue
        if doc in judged or (qid, doc) in negatives:
            qrels.bad.add(qid)
            reason = f"docid {doc!r} is judged twice for query {qid!r}; the query is not scored"
            rejections.append(Rejection(source, number, reason))
            continue
        if grade < 0:
            negatives.add((qid, doc))
            qrels.negative += 1
        else:
            judged[doc] = grade
    return qrels, rejections


class _RunQuery:
    """One query's run lines; scores and line numbers in typed arrays (8 bytes per line each,
    a third of what boxed Python numbers in a list cost)."""

    __slots__ = ("docs", "lines", "scores", "texts")

    def __init__(self) -> None:
        self.docs: list[str] = []
        self.scores: array[float] = array("d")
        self.lines: array[int] = array("q")
        self.texts: list[str] = []  # the scores as read, until parsed


class Run:
    """Retrieved documents per query, in first-appearance order, not yet sorted.

    Every qid seen on a line is a key of ``queries``, even when all its lines were rejected, so
    the join can tell "not in the run" from "in the run but not scorable".
    """

    __slots__ = ("bad", "queries", "source")

    def __init__(self, source: str = "run") -> None:
        self.source = source
        self.queries: dict[str, _RunQuery] = {}
        self.bad: set[str] = set()

    def duplicates(self, qid: str) -> list[Rejection]:
        """One rejection per repeated docid of the query; empty when its docids are distinct.

        trec_eval refuses a run with a docid twice in one query ("duplicate docs"); evald
        refuses only that query.
        """
        entry = self.queries[qid]
        if len(set(entry.docs)) == len(entry.docs):
            return []
        first: dict[str, int] = {}
        found: list[Rejection] = []
        for doc, line in zip(entry.docs, entry.lines, strict=True):
            if doc in first:
                found.append(
                    Rejection(
                        self.source,
                        line,
                        f"docid {doc!r} appears twice in query {qid!r} (also line "
                        f"{first[doc]}); the query is not scored",
                    )
                )
            else:
                first[doc] = line
        return found

    def ranking(self, qid: str) -> list[str]:
        """The query's docids in trec_eval order: score descending, then docid descending."""
        entry = self.queries[qid]
        ordered = sorted(zip(entry.scores, entry.docs, strict=True), reverse=True)
        return [doc for _, doc in ordered]


def read_run(lines: Iterable[bytes], source: str) -> tuple[Run, list[Rejection]]:
    """Read a run file; a query with a malformed line is marked bad (not scored)."""
    run = Run(source=source)
    rejections: list[Rejection] = []
    queries = run.queries
    for number, raw in enumerate(lines, start=1):
        try:  # _fields, inlined: this loop runs once per run line
            fields = raw.decode("utf-8").removeprefix(BOM_TEXT).split()
        except UnicodeDecodeError as exc:
            qid = _qid_of(raw)
            if qid is not None:
                queries.setdefault(qid, _RunQuery())
            _reject(rejections, run.bad, source, number, f"not valid UTF-8 (byte {exc.start})", qid)
            continue
        if not fields or fields[0][0] == "#":
            continue
        entry = queries.get(fields[0])
        if entry is None:
            entry = run.queries[fields[0]] = _RunQuery()
        if len(fields) < 6:
            reason = f"expected 6 fields (qid Q0 docid rank score tag), got {len(fields)}"
            _reject(rejections, run.bad, source, number, reason, fields[0])
            continue
        entry.docs.append(fields[2])
        entry.texts.append(fields[4])
        entry.lines.append(number)
    for qid, entry in run.queries.items():
        _parse_scores(qid, entry, run, rejections)
    rejections.sort(key=_line_number)  # score rejections were found per query, after the loop
    return run, rejections


_line_number = attrgetter("line")
#: every character a plain decimal number may hold; within these, ``float`` and
#: :func:`parse_score` accept the same strings (``1e`` or ``--1`` make both refuse)
_DECIMAL_CHARS = str.maketrans("", "", "0123456789.+-eE")


def _parse_scores(qid: str, entry: _RunQuery, run: Run, rejections: list[Rejection]) -> None:
    """Turn a query's score texts into numbers: in one pass when all are plain decimals (the
    usual case), else one by one, each bad one rejected with its line (the query not scored)."""
    texts, entry.texts = entry.texts, []
    if not "".join(texts).translate(_DECIMAL_CHARS):
        try:
            entry.scores = array("d", map(float, texts))
            return
        except ValueError:
            pass
    kept = _RunQuery()
    for doc, text, number in zip(entry.docs, texts, entry.lines, strict=True):
        score = parse_score(text)
        if score is None:
            _reject(rejections, run.bad, run.source, number, f"score {text!r} is not a number", qid)
        else:
            kept.docs.append(doc)
            kept.scores.append(score)
            kept.lines.append(number)
    entry.docs, entry.scores, entry.lines = kept.docs, kept.scores, kept.lines


class JoinStats:
    """What the join left out or added, reported on stderr after scoring."""

    __slots__ = ("completed", "missing", "not_scored", "unjudged")

    def __init__(self, unjudged: int = 0, missing: int = 0, completed: int = 0) -> None:
        self.unjudged = unjudged  # queries in the run without qrels: skipped, as trec_eval does
        self.missing = missing  # qrels-only queries (not in the run), scored only with --complete
        self.completed = completed  # qrels-only queries scored with an empty ranking (--complete)
        self.not_scored = 0  # queries left out because one of their lines was rejected


def join(
    run: Run, qrels: Qrels, *, complete: bool, stats: JoinStats
) -> Iterator[Query | Rejection]:
    """Pair run and qrels per query: run order first, then (``complete``) qrels-only queries.

    Queries in the run but not in the qrels are skipped (trec_eval does the same); queries in the
    qrels but not in the run are skipped too unless ``complete`` (trec_eval ``-c``), which
    scores them with an empty ranking.
    """
    bad = run.bad | qrels.bad
    for qid in run.queries:
        if qid not in qrels.judgments:
            stats.unjudged += 1
            continue
        rejected = run.duplicates(qid) if qid not in bad else []
        if qid in bad or rejected:
            stats.not_scored += 1
            yield from rejected
            continue
        yield Query(qid=qid, ranking=run.ranking(qid), qrels=qrels.judgments[qid])
    for qid, judged in qrels.judgments.items():
        if qid in run.queries:
            continue
        stats.missing += 1
        if not complete:
            continue
        if qid in bad:
            stats.not_scored += 1
            continue
        stats.completed += 1
        yield Query(qid=qid, ranking=[], qrels=judged)
