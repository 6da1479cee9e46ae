"""JSON Pointer as RFC 6901 defines it (its section 5 examples), and malformed pointers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evald.mapping.pointer import (
    MAX_TOKENS,
    MISSING,
    PointerError,
    format_pointer,
    parse_pointer,
    resolve,
)

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


def test_a_pointer_deeper_than_any_readable_record_is_refused_by_its_length() -> None:
    deepest = "/a" * MAX_TOKENS
    document: object = "leaf"
    for _ in range(MAX_TOKENS):
        document = {"a": document}
    assert resolve(document, parse_pointer(deepest)) == "leaf"
    with pytest.raises(PointerError, match=f"at most {MAX_TOKENS} tokens.*this one has 3000"):
        parse_pointer("/a" * 3000)


def test_a_mapping_with_a_3000_token_pointer_exits_2_naming_the_key(tmp_path: Path) -> None:
    """It used to pass `check-config` and end `evald replay` with a RecursionError (Python
    cannot compile the fast path's 3,000 chained subscripts)."""
    mapping = tmp_path / "deep.yaml"
    mapping.write_text(
        "impression:\n  request_id: /rid\n  time: {path: /t, format: epoch_ms}\n"
        f"  items: {'/a' * 3000}\n"
    )
    events = tmp_path / "events.jsonl"
    events.write_text('{"rid": "r", "t": 1714564800000, "a": ["x"]}\n')
    for argv in (
        ["check-config", "--mapping", str(mapping)],
        ["replay", str(events), "--mapping", str(mapping)],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "evald", *argv], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"mapping {mapping}: impression.items: a JSON Pointer has at most" in proc.stderr
