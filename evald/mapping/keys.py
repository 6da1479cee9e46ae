"""The cheap test for a repeated key in a record the mapping decoder parsed.

The parser keeps one value per key, so a repeated key is invisible in the parsed document; the
raw bytes show it. Every key written compactly is followed by ``":``, and inside a string a
quote is written ``\\"``, so each ``":`` of the raw bytes is a key or a ``\\":`` inside a
string. The keys the parsed document kept are counted, plus, for its arrays of containers
(written back compactly by msgspec, which also writes a quote ``\\"``), the same ``\\":`` of
the strings they kept. A repeated key drops at least one key, so the kept count is
smaller than the raw count: equal counts mean no key repeats, provided no key was written
``"key" :`` (not in the raw count) and no quote or colon was written as a ``\\u`` escape (in
the kept count, not the raw one). Otherwise the exact, slow check
(:func:`evald.decode.duplicate_key`) decides.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

#: a colon after JSON whitespace: a key may be written ``"key" :`` (then not counted by '":')
_SPACED_COLON = re.compile(rb'"[ \t\n\r]+:')
#: a quote or a colon written as a \u escape (counted when written back, not in the raw bytes)
_ESCAPED_QUOTE_OR_COLON = re.compile(rb"\\u00(?:22|3[aA])")

#: parsed JSON written back compactly (UTF-8 as is): bytes equal to a record prove that no
#: object of it repeats a key, the cheapest test for the commonest writers
encode = msgspec.json.Encoder().encode
_encode = encode
_NESTED = (dict, list)


def maybe_repeated(raw: bytes, document: Any) -> bool:
    """False when ``raw``, parsed as ``document``, surely repeats no key; True: it may, ask
    the exact check."""
    arrays: list[list[Any]] = []
    return repeated_after_count(raw, count_keys(document, arrays), arrays)


def repeated_after_count(raw: bytes, kept: int, arrays: list[list[Any]]) -> bool:
    """:func:`maybe_repeated` once :func:`count_keys` has counted ``kept`` keys and gathered
    ``arrays`` (a caller may first try the common case inline: no arrays, ``kept`` equal to
    the raw count, no whitespace; then no key repeats)."""
    if arrays:
        try:
            kept += _encode(arrays).count(b'":')
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError):
            return True
        if raw.find(b"\\u") >= 0 and _ESCAPED_QUOTE_OR_COLON.search(raw) is not None:
            return True
    if raw.count(b'":') != kept:
        return True
    # compact JSON has no whitespace at all (split() is one pass in C, cheaper than a search
    # per whitespace byte)
    return len(raw.split()) != 1 and _SPACED_COLON.search(raw) is not None


def count_keys(value: Any, arrays: list[list[Any]]) -> int:
    """The keys in the objects of parsed JSON ``value`` outside arrays; each array of
    containers met is appended to ``arrays`` instead (written back and its ``":`` counted in
    C: walked in Python, a list of objects costs a call per element). An array of anything
    else holds no key. Three levels of objects are walked inline: most records are no deeper.
    """
    if type(value) is list:
        if value and type(value[0]) in _NESTED:
            arrays.append(value)
        return 0
    count = len(value)
    for item in value.values():
        kind = type(item)
        if kind is str:  # most values: ids, times, label values
            continue
        if kind is dict:
            count += len(item)
            for inner in item.values():
                inner_kind = type(inner)
                if inner_kind is str:
                    continue
                if inner_kind is dict:
                    count += len(inner)
                    for deep in inner.values():
                        if type(deep) in _NESTED:
                            count += count_keys(deep, arrays)
                elif inner_kind is list and inner and type(inner[0]) in _NESTED:
                    arrays.append(inner)
        elif kind is list and item and type(item[0]) in _NESTED:
            arrays.append(item)
    return count
