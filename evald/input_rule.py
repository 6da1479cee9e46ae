"""The input rule every reader of events applies, in one place (docs/semantics.md, "One input
rule"): the rejection reasons, the byte-order mark ignored at the start of a record or line,
the repeated key that makes an object ambiguous and the plausibility bound on event times.

The native decoder (decode.py), a mapping's decoder (mapping/), the export reader (files/) and
``evald score``'s readers (score/) read it here. It imports nothing at module level beyond the
standard library's typing, so ``evald score`` takes it without pydantic or ``json`` (the TREC
path never imports ``json``; ``duplicate_key``, the slow path, imports it when first called).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import IO, Any

__all__ = [
    "BOM",
    "BOM_TEXT",
    "EMPTY_ID",
    "GZIP_MAGIC",
    "ID_PATTERN",
    "JOIN_REASONS",
    "MAX_GRADE",
    "REASONS",
    "any_blank",
    "blank",
    "duplicate_key",
    "gzipped",
    "implausibility",
    "repeated_key",
    "time_in_words",
]

#: Reasons the join, not a decoder, refuses a record for: a second, different served list for
#: a request id (a mapping's lists of several records, docs/mapping.md).
JOIN_REASONS: tuple[str, ...] = ("conflicting_list",)

#: Every rejection reason, in the order docs/semantics.md explains them.
REASONS: tuple[str, ...] = (
    "too_large",
    "invalid_json",
    "not_an_object",
    "duplicate_key",
    "unknown_kind",
    "wrong_kind",
    "missing_field",
    "wrong_type",
    "empty_id",
    "bad_timestamp",
    "implausible_timestamp",
    "bad_grade",
    "missing_grade",
    "unknown_action",
    "too_many_items",
    "too_many_labels",
    "string_too_long",
    "unknown_interleaving",
    "bad_teams",
    *JOIN_REASONS,
)

#: Why a blank id is refused, in the words every reader gives (after the field it is about).
EMPTY_ID = "an id is empty or only white space"

#: A string that is not blank (docs/semantics.md, "Identifiers"): pydantic-core's regex
#: (``\s`` is Unicode White_Space) with the four separators U+001C..U+001F that Python's
#: ``str.isspace`` also counts, so this pattern and :func:`blank` agree on every character.
ID_PATTERN = r"[^\s\x1c-\x1f]"


def blank(text: str) -> bool:
    """Whether ``text`` says nothing: empty, or white space only (``str.isspace``). A required
    id that is blank is rejected (``empty_id``); an optional one counts as absent."""
    return not text or text.isspace()


def any_blank(ids: Collection[str]) -> bool:
    """Whether any of ``ids`` (text) is blank, in two C-level passes: ``str.isspace`` is False
    for the empty string, which ``in`` finds."""
    return "" in ids or any(map(str.isspace, ids))


#: The largest grade, in events, configurations and ``evald score``'s qrels alike: the measures'
#: sums (2^grade - 1 gains, sums of squares over a window of lists or over a file's queries)
#: stay far from float overflow, where a grade of 1e308 made them infinite (and nDCG NaN);
#: relevance scales are 0-4 or 1-5, percentages at most 100.
MAX_GRADE = 100.0

#: a UTF-8 byte-order mark: ignored at the start of a record (bytes) or a line (text), only there
BOM = b"\xef\xbb\xbf"
BOM_TEXT = "\ufeff"

#: the first two bytes of a gzip stream; no UTF-8 text starts so (0x8b continues a character)
GZIP_MAGIC = b"\x1f\x8b"


def gzipped(stream: IO[bytes]) -> bool:
    """Whether ``stream`` starts as gzip does, without consuming what it peeks at (one that
    cannot be peeked at: no). `evald replay` decompresses such a file; `evald score` and
    `evald judge` say what it is."""
    peek = getattr(stream, "peek", None)
    return peek is not None and peek(2)[:2] == GZIP_MAGIC


def repeated_key(pairs: Sequence[tuple[str, Any]]) -> str | None:
    """The first key repeated among one object's (key, value) pairs, or None. Last-wins is
    ambiguous (other JSON parsers keep the first value, or fail), so a record or line with one
    is rejected, by every command alike."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    return None


def duplicate_key(raw: bytes) -> str | None:
    """The first key repeated within one object of ``raw`` (valid JSON), or None.

    Parses the document again, object by object (keys compared after unescaping, so
    ``"\\u0069tems"`` repeats ``"items"``): the exact and slow path behind the decoders'
    cheap counts (``decode.keys_surely_unique``).
    """
    import json  # the slow path only: `evald score`'s TREC readers never import json

    repeated: list[str] = []

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if not repeated:
            key = repeated_key(pairs)
            if key is not None:
                repeated.append(key)
        return {}

    try:
        json.loads(raw, object_pairs_hook=pairs_hook)
    except (ValueError, RecursionError):
        return None  # pydantic accepted it; not ours to judge twice
    return repeated[0] if repeated else None


def time_in_words(ms: int) -> str:
    """RFC 3339 form of an epoch-ms time for a message; the number itself if out of range."""
    from evald.events import format_timestamp  # with pydantic: not on `evald score`'s path

    try:
        return format_timestamp(ms)
    except (ValueError, OverflowError, OSError):
        return f"{ms} ms"


def implausibility(ts: int, min_ts: int, max_lead: int | None, reference: int | None) -> str | None:
    """What is implausible about event time ``ts``, in words, or None: before ``min_ts``, or more
    than ``max_lead`` ms ahead of ``reference``. The one rule every decoder applies."""
    if ts < min_ts:
        return f"{time_in_words(ts)} is before the earliest plausible time {time_in_words(min_ts)}"
    if reference is not None and max_lead is not None and ts > reference + max_lead:
        return (
            f"{time_in_words(ts)} is more than {max_lead} ms ahead of the reference time "
            f"{time_in_words(reference)}"
        )
    return None
