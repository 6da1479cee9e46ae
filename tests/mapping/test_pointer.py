"""JSON Pointer as RFC 6901 defines it (its section 5 examples), and malformed pointers."""

from __future__ import annotations

import pytest

from evald.mapping.pointer import MISSING, PointerError, format_pointer, parse_pointer, resolve

RFC_DOCUMENT = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("", RFC_DOCUMENT),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
    ],
)
def test_rfc6901_section5_examples(pointer: str, expected: object) -> None:
    assert resolve(RFC_DOCUMENT, parse_pointer(pointer)) == expected


@pytest.mark.parametrize("pointer", ["/nope", "/foo/2", "/foo/01", "/foo/-", "/foo/0/x", "/a~1b/c"])
def test_pointers_leading_nowhere_are_missing(pointer: str) -> None:
    assert resolve(RFC_DOCUMENT, parse_pointer(pointer)) is MISSING


def test_escapes_are_undone_in_order_and_redone_for_messages() -> None:
    # "~01" is "~1" (a tilde then a one), not "/": ~1 is replaced before ~0
    assert parse_pointer("/~01") == ("~1",)
    assert format_pointer(("a/b", "m~n")) == "/a~1b/m~0n"


@pytest.mark.parametrize(
    ("pointer", "words"), [("foo", "starts with '/'"), ("/a~2", "'~0'"), ("/~", "'~0'")]
)
def test_malformed_pointers_say_why(pointer: str, words: str) -> None:
    with pytest.raises(PointerError, match=words):
        parse_pointer(pointer)
