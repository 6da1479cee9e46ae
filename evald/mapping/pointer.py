"""JSON Pointer (RFC 6901): where a mapping finds a value inside a record.

``""`` is the whole record; ``/a/b`` is key ``b`` of key ``a``; ``/hits/0`` is the first element
of array ``hits``. In a token ``~1`` stands for ``/`` and ``~0`` for ``~`` (so the key ``a/b`` is
``/a~1b``). A pointer is parsed once, when the mapping is loaded, into a tuple of tokens.
"""

from __future__ import annotations

from typing import Any

#: what :func:`resolve` returns when the pointer leads nowhere (JSON ``null`` is ``None``)
MISSING: Any = object()


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
    tokens = text[1:].split("/")
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
