"""The query normalisation rule (evald/query.py, docs/drilldown.md "The query")."""

from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.query import QueryNormalizer, normalize_query


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("  Running   SHOES ", "running shoes"),
        ("running shoes", "running shoes"),
        ("Straße", "strasse"),  # case folding, not lower()
        ("STRASSE", "strasse"),
        ("Ｓｈｏｅｓ\u00a0ＵＳＢ", "shoes usb"),  # full-width letters, a no-break space (NFKC)
        ("\ufb01re", "fire"),  # the fi ligature
        ("tab\there\nand\r\nthere", "tab here and there"),  # controls are spaces
        ("a\x00b\x1b[31mc\x7fd", "a b [31mc d"),  # NUL, ESC, DEL: spaces
        ("zero\u200bwidth", "zerowidth"),  # format characters go
        ("right\u202eto left", "rightto left"),  # a bidi override (terminal spoofing) goes
        ("\ufeffbom", "bom"),
        ("\u0085next\u2028line\u2029para", "next line para"),  # Unicode line breaks
        ("   ", ""),
        ("\x00\u200b", ""),
        ("", ""),
    ],
)
def test_the_rule(raw: str, normalised: str) -> None:
    assert normalize_query(raw, 100) == normalised


def test_the_length_bound_counts_characters_and_drops_a_cut_trailing_space() -> None:
    assert normalize_query("abc def", 4) == "abc"
    assert normalize_query("é" * 300, 100) == "é" * 100
    assert normalize_query("x" * 10_000, 7) == "x" * 7


_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=()), min_size=0, max_size=60
)


@settings(max_examples=400, deadline=None)
@given(_TEXT, st.integers(min_value=1, max_value=40))
def test_the_rule_is_stable_and_leaves_nothing_that_breaks_an_output(text: str, cut: int) -> None:
    """Applying the rule twice changes nothing; no control, format or surrogate character, no
    double or edge space is left; the result fits the bound and survives JSON both ways."""
    out = normalize_query(text, cut)
    assert normalize_query(out, cut) == out
    assert len(out) <= cut
    assert out == out.strip() and "  " not in out
    assert not any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in out)
    assert unicodedata.normalize("NFKC", out) == out
    assert json.loads(json.dumps(out, ensure_ascii=False)) == out
    out.encode("utf-8")  # no lone surrogate


def test_the_normaliser_caches_and_stays_bounded() -> None:
    normalize = QueryNormalizer(20, cache_size=8)
    assert normalize(None) == "" and normalize("") == ""
    first = normalize("Red  Shoes")
    assert first == "red shoes" and normalize("Red  Shoes") is first
    for i in range(1_000):
        assert normalize(f"Query {i}") == f"query {i}"
        assert len(normalize._cache) <= 8


def test_a_length_bound_over_the_string_limit_is_refused_naming_the_field() -> None:
    from evald.config import ConfigError, load_config

    assert load_config({"drilldown": {"max_query_length": 512}}).drilldown.max_query_length == 512
    with pytest.raises(ConfigError, match=r"drilldown\.max_query_length: 513 is more than"):
        load_config({"drilldown": {"max_query_length": 513}})


@pytest.mark.parametrize(
    "raw",
    ["e\u200d\u0301", "e\u0301", "\u00e9", "E\u200b\u0301", "\ufeffe\u2060\u0301", "\u00c9"],
)
def test_a_format_character_inside_a_combining_sequence_does_not_make_another_query(
    raw: str,
) -> None:
    """The format characters go before NFKC composes: "e", ZWJ, U+0301 is "é" like the
    letter typed alone, not an uncomposed pair the rule would change on a second pass."""
    assert normalize_query(raw, 100) == "\u00e9"


#: hostile pieces: letters with combining marks, Hangul jamo that compose, format and control
#: characters, compatibility forms, case pairs that fold to several letters, spaces
_PIECES = [
    "e", "E", "\u0301", "\u0308", "\u0327", "\u1100", "\u1161", "\u11a8", "\u200b", "\u200d",
    "\u2060", "\ufeff", "\u202e", "\u00ad", "\x00", "\t", "\x1b", " ", "\u00a0", "\u3000",
    "\ufb01", "\uff33", "\u00df", "\u0130", "\u03a3", "\u1e9e", "a", "\u212b",
]  # fmt: skip
_FORMAT = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u202e", "\u00ad", "\u2066"]


def test_the_rule_on_seeded_hostile_text_against_its_definition() -> None:
    """Oracle: format characters are removed, so inserting any anywhere changes nothing; the
    rule is stable, NFKC-composed and within the bound, at every bound from 1 to past the
    text (the cut lands inside combining sequences, on spaces, in Hangul syllables)."""
    rng = np.random.default_rng(18)
    for _ in range(3_000):
        text = "".join(rng.choice(_PIECES, size=int(rng.integers(1, 16))).tolist())
        spiked = list(text)
        for _ in range(int(rng.integers(1, 4))):
            spiked.insert(int(rng.integers(0, len(spiked) + 1)), str(rng.choice(_FORMAT)))
        for cut in (1, 2, 3, 5, 8, 100):
            out = normalize_query(text, cut)
            assert normalize_query("".join(spiked), cut) == out, (text, spiked, cut)
            assert normalize_query(out, cut) == out, (text, cut)
            assert unicodedata.normalize("NFKC", out) == out
            assert len(out) <= cut and out == out.strip() and "  " not in out
