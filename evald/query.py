"""The query of a served list, normalised: one rule so that "Running  Shoes" and "running
shoes" are one query in results, summaries and series (docs/drilldown.md, "The query").

The rule, in order:

1. control characters (Unicode category Cc: NUL, escape, tab, newline ...) become a space;
   format characters (Cf: zero-width spaces, joiners, direction marks and overrides, the
   byte-order mark) and lone surrogates (Cs) are removed: first, so that a letter and its
   combining mark with a format character between them compose like the pair typed alone;
2. Unicode NFKC (compatibility forms fold: full-width letters, ligatures, non-breaking spaces);
3. case folding (``str.casefold``: "Straße" and "STRASSE" meet), then NFKC again, so the
   result is stable under the rule (neither step makes a character of step 1's categories:
   checked over every code point); every other whitespace becomes a space;
4. runs of spaces collapse to one, and spaces at both ends go;
5. the first ``max_length`` characters (code points) are kept, spaces at the cut end go.

A query that is empty after the rule is no query. What comes out holds no control or format
character, so it cannot break a JSON line, a Prometheus label value, a terminal or a table.
"""

from __future__ import annotations

import sys
import unicodedata

__all__ = ["QueryNormalizer", "normalize_query"]

#: distinct raw queries the normaliser remembers before it forgets them all (bounded memory:
#: one normaliser per partition, and a raw query may be limits.max_string_length characters)
CACHE_SIZE = 1 << 12

#: ASCII controls that ``str.split`` does not take for whitespace: they become a space
_ASCII_CONTROLS = {c: " " for c in (*range(0x00, 0x09), *range(0x0E, 0x1C), 0x7F)}
_TABLE: dict[int, str | None] | None = None


def _table() -> dict[int, str | None]:
    """Code point -> replacement for categories Cc (a space), Cf and Cs (removed); built once,
    at the first query that is not ASCII (about 0.2 s: a walk over every code point)."""
    global _TABLE
    if _TABLE is None:
        table: dict[int, str | None] = {}
        category = unicodedata.category
        for code in range(sys.maxunicode + 1):
            kind = category(chr(code))
            if kind == "Cc":
                table[code] = " "
            elif kind in ("Cf", "Cs"):
                table[code] = None
        _TABLE = table
    return _TABLE


def normalize_query(text: str, max_length: int) -> str:
    """``text`` by the module's rule; ``""`` when nothing is left (no query)."""
    if text.isascii():
        folded = text.lower().translate(_ASCII_CONTROLS)
    else:
        # the controls and format characters first: removed after NFKC, a format character
        # between a letter and its combining mark would leave the pair uncomposed ("e", ZWJ,
        # U+0301 -> "e" U+0301, not "é"), another query than "é" and not stable under the rule
        nfkc = unicodedata.normalize
        folded = nfkc("NFKC", nfkc("NFKC", text.translate(_table())).casefold())
    out = " ".join(folded.split())
    if len(out) > max_length:
        out = out[:max_length].rstrip(" ")
    return out


class QueryNormalizer:
    """``normalize_query`` with a bounded cache (raw -> normalised), since queries repeat: the
    cache is emptied whenever it holds ``CACHE_SIZE`` entries, so a flood of distinct queries
    costs the rule each time and never more memory."""

    def __init__(self, max_length: int, cache_size: int = CACHE_SIZE) -> None:
        self.max_length = max_length
        self._cache_size = cache_size
        self._cache: dict[str, str] = {}

    def __call__(self, text: str | None) -> str:
        """The normalised query of ``text`` (None: no query, ``""``)."""
        if not text:
            return ""
        cache = self._cache
        found = cache.get(text)
        if found is None:
            if len(cache) >= self._cache_size:
                cache.clear()
            found = cache[text] = normalize_query(text, self.max_length)
        return found
