"""Records as OpenSearch and Elasticsearch tools export them, unwrapped line by line.

Three shapes, told apart per line, so one file may mix them and plain records need nothing:

* ``_bulk`` NDJSON (what ``_bulk`` takes, what UBI's data generator writes): an action line
  ``{"index": {"_index": "ubi_events", "_id": "..."}}`` (or ``create``) before each document;
  the document is the record, from that index. ``delete`` has no document line; ``update``'s
  line is a partial document, not a record: both are skipped, and counted.
* search-hit dumps (a scroll or dump tool's output, one hit per line):
  ``{"_index": "ubi_events", "_id": "...", "_source": {...}}``; the ``_source`` object is the
  record, written back compactly, from that index.
* anything else is a record as it is, from no index.

The index name goes with the record, so a mapping can tell queries from events by it
(``indices``, docs/mapping.md). A wrapper line with a repeated key anywhere is passed on whole:
the decoder rejects it ``duplicate_key`` as it would the record (the one input rule of
docs/semantics.md); one that is not what it looks like (not JSON, an action without an object)
is passed on whole too, for the decoder to say what is wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from pydantic_core import from_json

from evald.input_rule import BOM, duplicate_key
from evald.mapping.keys import maybe_repeated

#: an action line's first key, after optional whitespace
_ACTION = re.compile(rb'\s*\{\s*"(index|create|update|delete)"\s*:')
_SOURCE = re.compile(rb'"_source"\s*:')
_ENCODE = msgspec.json.Encoder().encode


@dataclass(slots=True)
class Line:
    """One line as ``evald.files.lines.read_lines`` gives it."""

    name: str
    number: int
    raw: bytes
    size: int  # bytes consumed
    length: int  # full length (``raw`` is cut past the limit)


@dataclass(slots=True)
class Record:
    """A record to feed: where it is (``name``, ``number``), its bytes, its full length and
    the index an export named for it (None: a plain record)."""

    name: str
    number: int
    raw: bytes
    length: int
    index: str | None = None


@dataclass
class Unwrapped:
    """What the unwrapping skipped: action lines and the update bodies after them."""

    actions: int = 0
    bodies: int = 0
    by_action: dict[str, int] = field(default_factory=dict)


def _parsed(raw: bytes) -> Any:
    """The JSON of a wrapper line, or None when it is not JSON or repeats a key (then the
    decoder sees the line whole and says so)."""
    try:
        doc = from_json(raw, allow_inf_nan=False)
    except ValueError:
        return None
    if type(doc) is dict and maybe_repeated(raw, doc) and duplicate_key(raw) is not None:
        return None
    return doc


def _action(raw: bytes) -> tuple[str, str | None] | None:
    """(action, index or None) of a ``_bulk`` action line, or None: not one."""
    if _ACTION.match(raw) is None:
        return None
    doc = _parsed(raw)
    if type(doc) is not dict or len(doc) != 1:
        return None
    ((name, meta),) = doc.items()
    if type(meta) is not dict:
        return None
    index = meta.get("_index")
    return name, index if type(index) is str else None


def _hit(raw: bytes) -> tuple[bytes, str] | None:
    """(the ``_source`` record written back, its index) of a search hit, or None: not one."""
    if _SOURCE.search(raw) is None:
        return None
    doc = _parsed(raw)
    if type(doc) is not dict or type(doc.get("_source")) is not dict:
        return None
    index = doc.get("_index")
    if type(index) is not str:
        return None
    source = doc["_source"]
    try:
        return _ENCODE(source), index
    except (msgspec.EncodeError, OverflowError):  # an integer past 64 bits
        return json.dumps(source, ensure_ascii=False, separators=(",", ":")).encode(), index


def unwrap(lines: Iterable[Line], skipped: Unwrapped, limit: int) -> Iterator[Line | Record]:
    """Each line as a :class:`Record` (a document, a hit's source, or a plain record); lines
    the unwrapping cannot read come as they are (:class:`Line`: blank, or cut past ``limit``)
    for the caller. Action lines and update bodies are counted in ``skipped``. The next line
    after an ``index`` / ``create`` action is its document, whatever it looks like; state does
    not carry from one file to the next."""
    pending: tuple[str, str | None] | None = None  # the action whose document comes next
    source = None
    for line in lines:
        if line.name != source:
            source, pending = line.name, None
        if not line.raw or line.length > limit:
            yield line
            pending = None
            continue
        if pending is not None:
            action, index = pending
            pending = None
            if action == "update":
                skipped.bodies += 1
                continue
            yield Record(line.name, line.number, line.raw, line.length, index)
            continue
        bare = line.raw.removeprefix(BOM)  # a file's first line may carry one, as records may
        found = _action(bare)
        if found is not None:
            skipped.actions += 1
            skipped.by_action[found[0]] = skipped.by_action.get(found[0], 0) + 1
            pending = None if found[0] == "delete" else found
            continue
        hit = _hit(bare)
        if hit is not None:
            yield Record(line.name, line.number, hit[0], line.length, hit[1])
            continue
        yield Record(line.name, line.number, line.raw, line.length)
