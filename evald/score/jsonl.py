"""JSON Lines input: one ``{"qid", "ranking", "qrels"}`` object per line.

Parsing never raises on data: every line becomes a :class:`Query` or a :class:`Rejection` whose
reason names the first problem found, so one bad line costs that line and nothing else.

Two paths share that contract. :func:`accept_line` is the fast one: pydantic-core's Rust JSON
parser on the raw bytes plus a few C-level type checks; it only ever *accepts* (or says "look
closer"). Every line it does not accept goes through :func:`parse_line`, the exact path that
names the first problem, so the fast path decides speed and never a reason or an outcome.
The command reads through :mod:`evald.score.jsonl_chunks`, which is faster still on ordinary
lines and hands every line it does not accept to :func:`read_line` here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from typing import Any, cast

from evald.input_rule import BOM_TEXT, EMPTY_ID, MAX_GRADE, any_blank, blank, repeated_key
from evald.score.records import Query, Rejection

#: pydantic-core's parser, imported at the first line that needs it: most files are read by the
#: chunked reader alone, and importing it cost about 30 ms of every run's start-up
_from_json: Any = None


def _load_parser() -> Any:
    global _from_json
    from pydantic_core import from_json

    _from_json = from_json
    return from_json


class _DuplicateKey(ValueError):
    """Raised inside the JSON decoder: a repeated key makes the object ambiguous."""


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey(repeated_key(pairs))
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_object)


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages users can act on."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def parse_line(text: str) -> Query | str:
    """One JSONL line -> a :class:`Query`, or the reason it is rejected.

    Conventions: ``qid`` is a string or an integer (booleans and floats are not ids);
    ``ranking`` is an array of distinct strings; ``qrels`` maps docids to numbers from 0 to
    ``MAX_GRADE`` (booleans are not numbers). Unknown keys are ignored.
    """
    try:
        obj = _DECODER.decode(text)
    except _DuplicateKey as exc:
        return f"duplicate key {json.dumps(str(exc))}"
    except ValueError as exc:  # json.JSONDecodeError
        return f"not JSON: {exc}"
    except RecursionError:
        return "not JSON: nested too deeply"
    if _SURROGATE_ESCAPE.search(text):
        where = _lone_surrogate(obj)
        if where is not None:
            return (
                f"lone surrogate in {where}: not Unicode text (an unpaired \\ud800-\\udfff escape)"
            )
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {json_type(obj)}"
    for key in ("qid", "ranking", "qrels"):
        if key not in obj:
            return f'missing "{key}"'
    qid = obj["qid"]
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        return f'"qid" must be a string or an integer, got {json_type(qid)}'
    if isinstance(qid, str) and blank(qid):
        return f'"qid": {EMPTY_ID}'
    ranking = obj["ranking"]
    if not isinstance(ranking, list):
        return f'"ranking" must be an array of strings, got {json_type(ranking)}'
    if not set(map(type, ranking)) <= _STR:  # one C-level pass; find the culprit only if needed
        pos, doc = next((i, d) for i, d in enumerate(ranking) if not isinstance(d, str))
        return f'"ranking"[{pos}] must be a string, got {json_type(doc)}'
    if any_blank(ranking):
        pos = next(i for i, doc in enumerate(ranking) if blank(doc))
        return f'"ranking"[{pos}]: {EMPTY_ID}'
    if len(set(ranking)) != len(ranking):
        return _duplicate_reason(ranking)
    qrels = obj["qrels"]
    if not isinstance(qrels, dict):
        return f'"qrels" must be an object, got {json_type(qrels)}'
    if any_blank(qrels):
        doc = next(doc for doc in qrels if blank(doc))
        return f'"qrels" key {json.dumps(doc)}: {EMPTY_ID}'
    grades = list(qrels.values())
    if not _plain_grades(grades):
        for doc, grade in qrels.items():
            reason = grade_problem(grade)
            if reason is not None:
                return f"grade of {json.dumps(doc)} {reason}"
    return Query(qid=qid, ranking=ranking, qrels=qrels)  # int grades stay int: numbers all the same


_STR = frozenset({str})


#: ``\\uD800``-``\\uDFFF``: half of a UTF-16 pair. ``json`` decodes one standing alone to a
#: lone surrogate, which is no Unicode character: it cannot be written out as UTF-8 (the rows
#: echo the qid) and msgspec and pydantic-core refuse it, so the exact reader refuses it too.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _lone_surrogate(value: object, where: str = "the line") -> str | None:
    """Where a lone surrogate sits in a decoded value (``"qid"``, ``"ranking"[2]`` ...), or None."""
    if isinstance(value, str):
        return where if _has_surrogate(value) else None
    if isinstance(value, dict):
        top = where == "the line"
        for key, item in value.items():
            name = json.dumps(key, ensure_ascii=True)
            if _has_surrogate(key):
                return f"the key {name}" if top else f"a key of {where}"
            found = _lone_surrogate(item, name if top else f"{where}[{name}]")
            if found is not None:
                return found
    if isinstance(value, list):
        for pos, item in enumerate(value):
            found = _lone_surrogate(item, f"{where}[{pos}]")
            if found is not None:
                return found
    return None


_NUMBERS = frozenset({int, float})


def _plain_grades(grades: list[object]) -> bool:
    """Fast path: True if every grade is surely valid (numbers, sum finite, from 0 to 100).

    False only means "look closer": :func:`grade_problem` then checks each grade, so a false
    alarm (finite grades whose sum overflows) costs time, never a wrong rejection.
    """
    if not grades:
        return True
    if not set(map(type, grades)) <= _NUMBERS:
        return False
    numbers = cast("list[float]", grades)  # int, float or bool, checked above
    try:
        return math.isfinite(sum(numbers)) and min(numbers) >= 0 and max(numbers) <= MAX_GRADE
    except OverflowError:
        return False


def grade_problem(grade: object) -> str | None:
    """Why ``grade`` is not a valid JSONL grade (a number from 0 to ``MAX_GRADE``, as in events:
    above it the measures' sums of squares overflow), or None if it is."""
    if isinstance(grade, bool) or not isinstance(grade, (int, float)):
        return f"must be a number, got {json_type(grade)}"
    try:
        finite = math.isfinite(grade)
    except OverflowError:
        return "must be finite, got an integer too large for a float"
    if not finite:
        return f"must be finite, got {grade}"
    if grade < 0:
        return f"must be ≥ 0, got {grade}"
    if grade > MAX_GRADE:
        return f"must be ≤ {MAX_GRADE:g}, got {grade}"
    return None


def _duplicate_reason(ranking: list[str]) -> str:
    """Where the docid repeats, as ranks: 1 is the first served, as every rank evald prints."""
    first: dict[str, int] = {}
    for rank, doc in enumerate(ranking, start=1):
        if doc in first:
            return f'duplicate docid {json.dumps(doc)} in "ranking" (ranks {first[doc]} and {rank})'
        first[doc] = rank
    raise AssertionError("called without a duplicate")  # pragma: no cover


_FIELDS = frozenset({"qid", "ranking", "qrels"})


def accept_line(raw: bytes) -> Query | None:
    """The :class:`Query` of a surely valid line, else None ("ask :func:`parse_line`").

    Never accepts a line :func:`parse_line` rejects: pydantic-core's parser is at least as strict
    as ``json`` (it refuses lone surrogates, which ``json`` reads), and every check below is the
    exact path's. pydantic-core keeps the last of two equal keys without a word, so duplicate
    keys are ruled out by counting: outside strings every ``:`` in JSON ends one key, so when the
    line holds no more colons than the decoded objects hold keys, no key was read twice. Colons
    inside strings (docids such as ``sku:1``) are then subtracted: see :func:`_colons_in`.
    """
    try:
        obj = (_from_json or _load_parser())(raw, cache_strings=False)
    except ValueError:
        return None
    if type(obj) is not dict:
        return None
    qid = obj.get("qid")
    ranking = obj.get("ranking")
    qrels = obj.get("qrels")
    if type(ranking) is not list or type(qrels) is not dict:
        return None
    if type(qid) is not str and type(qid) is not int:  # bool is an int subclass: not accepted
        return None
    if type(qid) is str and blank(qid):
        return None
    keys = len(obj) + len(qrels)
    if keys - len(qrels) != len(_FIELDS):  # unknown keys: count what their values hold too
        try:
            keys += sum([_keys_in(v) for k, v in obj.items() if k not in _FIELDS])
        except RecursionError:
            return None
    if not set(map(type, ranking)) <= _STR or len(set(ranking)) != len(ranking):
        return None
    if any_blank(ranking) or any_blank(qrels):  # (qrels keys are text: JSON's keys are)
        return None
    colons = raw.count(b":")
    if colons != keys and (
        colons < keys or b"\\u003" in raw or colons - _string_colons(obj, ranking, qrels) != keys
    ):
        return None
    if qrels and not _plain_grades(list(qrels.values())):
        return None
    return Query(qid, ranking, qrels)


def _string_colons(obj: dict[str, Any], ranking: list[str], qrels: dict[str, Any]) -> int:
    """Colons inside the strings of a decoded line: its keys, docids, qid, ignored values.

    Without ``\\u003a`` escapes (the caller checks), each was a literal colon of the line, and
    the literal colons of a key or value that a repeated key dropped are not counted. So
    ``colons on the line - this == keys decoded`` holds only when no key was repeated; otherwise
    the left side is larger. Grades are not looked at: a string grade is refused later anyway,
    and counting too few colons can only send a line to the exact path.
    """
    count = "".join(ranking).count(":") + "".join(qrels).count(":") + "".join(obj).count(":")
    for key, value in obj.items():
        if key != "ranking" and key != "qrels":
            count += _colons_in(value)
    return count


def _colons_in(value: object) -> int:
    """Colons inside the strings (keys and values) of any decoded JSON value."""
    if type(value) is str:
        return value.count(":")
    if type(value) is dict:
        return sum([k.count(":") + _colons_in(v) for k, v in value.items()])
    if type(value) is list:
        return sum([_colons_in(v) for v in value])
    return 0


def _keys_in(value: object) -> int:
    """Keys held by the objects inside a decoded JSON value (an ignored key's value)."""
    if type(value) is dict:
        return len(value) + sum([_keys_in(v) for v in value.values()])
    if type(value) is list:
        return sum([_keys_in(v) for v in value])
    return 0


def read_jsonl(lines: Iterable[bytes], source: str) -> Iterator[Query | Rejection]:
    """Parse raw lines lazily, in input order; blank lines are skipped, not rejected.

    Lines are numbered from 1 as editors do, so a reported ``file:line`` can be opened directly.
    """
    for number, raw in enumerate(lines, start=1):
        item = read_line(raw, number, source)
        if item is not None:
            yield item


def read_line(raw: bytes, number: int, source: str) -> Query | Rejection | None:
    """One raw line (numbered from 1) -> a query, a rejection, or None for a blank line."""
    query = accept_line(raw)
    if query is not None:
        return query
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Rejection(source, number, f"not valid UTF-8 (byte {exc.start})")
    text = text.removeprefix(BOM_TEXT)  # a byte-order mark, ignored on any line (docs/score.md)
    if not text.strip():
        return None
    parsed = parse_line(text)
    if isinstance(parsed, str):
        return Rejection(source, number, parsed)
    return parsed
