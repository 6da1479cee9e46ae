"""JSON Pointer (RFC 6901): where a mapping finds a value inside a record.

``""`` is the whole record; ``/a/b`` is key ``b`` of key ``a``; ``/hits/0`` is the first element
of array ``hits``. In a token ``~1`` stands for ``/`` and ``~0`` for ``~`` (so the key ``a/b`` is
``/a~1b``). A pointer is parsed once, when the mapping is loaded, into a tuple of tokens, at most
:data:`MAX_TOKENS` of them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from operator import getitem, itemgetter
from typing import Any

#: what :func:`resolve` returns when the pointer leads nowhere (JSON ``null`` is ``None``)
MISSING: Any = object()

#: tokens a pointer may have. Records nested deeper than about 200 containers are refused by
#: the parser (docs/mapping.md), so a longer pointer could never lead to a value; and the fast
#: path spells a pointer as chained subscripts, which Python cannot compile past ~1,000.
MAX_TOKENS = 200


class PointerError(ValueError):
    """Not a JSON Pointer (the message says why, in words)."""


def parse_pointer(text: str) -> tuple[str, ...]:
    """The unescaped tokens of ``text``; raises :class:`PointerError` on a malformed pointer."""
    if not isinstance(text, str):
        raise PointerError(f"a JSON Pointer is a string, got {type(text).__name__}")
    if text == "":
        return ()
    if not text.startswith("/"):
        raise PointerError(f"a JSON Pointer starts with '/': {text!r} (did you mean '/{text}'?)")
    tokens = text[1:].split("/", MAX_TOKENS)
    if len(tokens) > MAX_TOKENS:
        raise PointerError(
            f"a JSON Pointer has at most {MAX_TOKENS} tokens (records nested deeper are refused, "
            f"so it could never lead to a value); this one has {text.count('/')}"
        )
    for token in tokens:
        rest = token.replace("~0", "").replace("~1", "")
        if "~" in rest:
            raise PointerError(f"in {text!r}, '~' must be written '~0' ('~1' stands for '/')")
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in tokens)


def resolve(document: Any, tokens: tuple[str, ...]) -> Any:
    """The value at ``tokens`` in ``document`` (parsed JSON), or :data:`MISSING`."""
    value = document
    for token in tokens:
        if type(value) is dict:
            value = value.get(token, MISSING)
            if value is MISSING:
                return MISSING
        elif type(value) is list:
            # RFC 6901: an array index is "0" or digits without a leading zero
            if not token.isdigit() or (token[0] == "0" and len(token) > 1):
                return MISSING
            index = int(token)
            if index >= len(value):
                return MISSING
            value = value[index]
        else:
            return MISSING
    return value


def format_pointer(tokens: tuple[str, ...]) -> str:
    """The pointer text of ``tokens`` (escaped again), for messages."""
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens)


def getter(tokens: tuple[str, ...]) -> Callable[[Any], Any]:
    """:func:`resolve` for ``tokens``, specialised once: a pointer of object keys only (no
    token that could index an array) is plain subscripting, where a wrong type or an absent
    key is :data:`MISSING`."""
    if not tokens or any(token.isdigit() for token in tokens):
        return lambda document: resolve(document, tokens)
    if len(tokens) == 1:
        (only,) = tokens

        def get_one(document: Any) -> Any:
            return document.get(only, MISSING) if type(document) is dict else MISSING

        return get_one
    if len(tokens) == 2:  # the general loop below, unrolled for the common depths
        first, second = tokens

        def get_two(document: Any) -> Any:
            try:
                return document[first][second]
            except (KeyError, TypeError, IndexError):
                return MISSING

        return get_two
    if len(tokens) == 3:
        first, second, third = tokens

        def get_three(document: Any) -> Any:
            try:
                return document[first][second][third]
            except (KeyError, TypeError, IndexError):
                return MISSING

        return get_three

    def get(document: Any) -> Any:
        value = document
        try:
            for token in tokens:
                value = value[token]
        except (KeyError, TypeError, IndexError):
            return MISSING
        # subscripting a string by a string raised TypeError above; only JSON types reach here
        return value

    return get


def strict_getter(tokens: tuple[str, ...]) -> Callable[[Any], Any]:
    """The value at ``tokens`` (parsed JSON), raising LookupError or TypeError where
    :func:`resolve` says :data:`MISSING`: for a fast path that leaves every miss, and its
    message, to a slower one. Object keys only are chained ``operator.itemgetter`` (no Python
    frame per read for one key)."""
    if not tokens:
        return lambda document: document
    if any(token.isdigit() for token in tokens):

        def via_resolve(document: Any) -> Any:
            value = resolve(document, tokens)
            if value is MISSING:
                raise LookupError(format_pointer(tokens))
            return value

        return via_resolve
    if len(tokens) == 1:
        return itemgetter(tokens[0])
    if len(tokens) == 2:
        first, second = tokens
        return lambda document: document[first][second]
    if len(tokens) == 3:
        first, second, third = tokens
        return lambda document: document[first][second][third]
    return lambda document: reduce(getitem, tokens, document)
