"""Event models: what an impression and a feedback event look like on the wire.

Both are pydantic v2 models validated straight from the raw JSON bytes (``model_validate_json``)
so that decoding is one pass in pydantic-core. Size limits are configurable, so the concrete
models used by the decoder are subclasses built per :class:`Limits` by :func:`limited_models`;
they are still ``Impression`` / ``Feedback`` instances.

Timestamps are normalised on validation to ``int`` epoch milliseconds: the wire form is either
an integer (epoch ms) or an RFC 3339 string with an explicit offset.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    StringConstraints,
    create_model,
)

from evald.input_rule import ID_PATTERN
from evald.input_rule import MAX_GRADE as MAX_GRADE  # the one bound on grades, read here too
from evald.settings_section import Section

#: Latest accepted timestamp (9999-12-31T23:59:59.999Z): beyond it RFC 3339 cannot spell it.
MAX_TS_MS = 253_402_300_799_999


def parse_timestamp(value: int | str) -> int:
    """Epoch milliseconds of an int (already ms) or an RFC 3339 string with an offset.

    ``T``/``t`` and ``Z``/``z`` are accepted alike (RFC 3339 section 5.6 allows either case).
    """
    if isinstance(value, int):
        ms = value
    else:
        text = value.strip().upper()
        if len(text) < 20 or text[10] not in "Tt ":
            raise ValueError(f"not an RFC 3339 timestamp: {value!r}")
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"not an RFC 3339 timestamp: {value!r}") from None
        if parsed.tzinfo is None:
            raise ValueError(f"timestamp has no UTC offset: {value!r}")
        delta = parsed - _EPOCH
        ms = (delta.days * 86_400 + delta.seconds) * 1_000 + delta.microseconds // 1_000
    if not 0 <= ms <= MAX_TS_MS:
        raise ValueError(f"timestamp out of range (0 .. {MAX_TS_MS} ms): {value!r}")
    return ms


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def format_timestamp(ms: int) -> str:
    """RFC 3339 UTC with millisecond precision: ``2024-05-01T12:00:00.250Z``. Past 9999 (the
    end of a window whose events were in range) the year has five digits, as in ISO 8601's
    expanded years: 400 Gregorian years are 146,097 days, so the date is that of 400 years
    before with the year told apart (Python's dates end at 9999)."""
    seconds, millis = divmod(ms, 1_000)
    if ms <= MAX_TS_MS:
        stamp = datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{stamp}.{millis:03d}Z"
    early = datetime.fromtimestamp(seconds - _400_YEARS_S, tz=timezone.utc)
    return f"{early.year + 400}{early:-%m-%dT%H:%M:%S}.{millis:03d}Z"


_400_YEARS_S = 146_097 * 86_400


#: ints are checked inside pydantic-core; only RFC 3339 strings need the Python parser. A
#: validated event's ``ts`` is always epoch ms (an ``int``), which is what the type checker sees.
if TYPE_CHECKING:
    Timestamp = int
else:
    Timestamp = Annotated[
        Annotated[int, Field(ge=0, le=MAX_TS_MS, strict=True)]
        | Annotated[StrictStr, AfterValidator(parse_timestamp)],
        Field(union_mode="left_to_right"),
    ]
NonNegativeGrade = Annotated[float, Field(ge=0, le=MAX_GRADE, allow_inf_nan=False, strict=True)]


class Limits(Section):
    """Bounds on one event so no single record can exhaust memory or a label set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # the upper bounds: far past any real event, short of where a bound stops fitting the
    # validators' and readers' machine integers (10**400 ended a command with OverflowError)
    max_items: int = Field(1000, ge=1, le=1_000_000, description="items per served list")
    max_labels: int = Field(32, ge=0, le=10_000, description="label pairs per impression")
    max_string_length: int = Field(
        512, ge=1, le=2**24, description="characters in any id, label or query"
    )
    max_event_bytes: int = Field(65_536, ge=64, le=2**30, description="bytes of one raw event")


#: pydantic-core caches parsed strings up to 64 chars by default; in events nearly every value
#: string is a fresh id (request, item, event), so the lookup costs more than it saves. Keys
#: repeat in every record and stay cached. Measured: validation 10-14% faster.
_CACHE_STRINGS: Final = "keys"


class Impression(BaseModel):
    """A served list: ``items`` in served order; ``labels`` name its segment (model, arm, ...)."""

    model_config = ConfigDict(extra="ignore", frozen=True, cache_strings=_CACHE_STRINGS)

    kind: Literal["impression"] = "impression"
    request_id: StrictStr
    ts: Timestamp
    items: list[StrictStr]
    labels: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    query: StrictStr | None = None
    user_id: StrictStr | None = None
    scores: list[Annotated[float, Field(allow_inf_nan=False, strict=True)]] | None = None
    #: an interleaved list (docs/semantics.md, "Interleaved impressions"): the ranker ("team")
    #: that contributed each item, aligned with ``items``, and how the list was made
    teams: list[StrictStr] | None = None
    interleaving: StrictStr | None = None
    #: balanced interleaving: each team's own ranked list of item ids
    rankings: dict[StrictStr, list[StrictStr]] | None = None


class Feedback(BaseModel):
    """One user action on one item of a served list; ``grade`` overrides the action's grade."""

    model_config = ConfigDict(extra="ignore", frozen=True, cache_strings=_CACHE_STRINGS)

    kind: Literal["feedback"] = "feedback"
    request_id: StrictStr
    ts: Timestamp
    item: StrictStr
    action: StrictStr
    grade: NonNegativeGrade | None = None
    position: Annotated[int, Field(ge=0, strict=True)] | None = None
    event_id: StrictStr | None = None


@dataclass(frozen=True, slots=True)
class Shown:
    """One item of a request's served list shown at ``position`` (0 first): a per-item
    impression event, read by a mapping's ``shown_actions``. A list that no record gives its
    items is built from these, in position order (docs/mapping.md, "Lists of several records").
    A plain class, not a model: the mapping decoder checks every field before it builds one."""

    request_id: str
    ts: int
    item: str
    position: int


@functools.lru_cache(maxsize=16)
def limited_models(limits: Limits) -> tuple[type[Impression], type[Feedback]]:
    """Subclasses of the models enforcing ``limits`` inside pydantic-core (no Python pass).

    The ids a record is keyed and joined by (its request id, the served items, a feedback's
    item) are ``ident``: not blank (``input_rule.ID_PATTERN``; a blank one is ``empty_id``).
    """
    length = limits.max_string_length
    text = Annotated[str, StringConstraints(max_length=length, strict=True)]
    ident = Annotated[str, StringConstraints(max_length=length, strict=True, pattern=ID_PATTERN)]
    items = Annotated[list[text], Field(max_length=limits.max_items)]
    served = Annotated[list[ident], Field(max_length=limits.max_items)]
    labels = Annotated[dict[text, text], Field(max_length=limits.max_labels)]
    scores = Annotated[
        list[Annotated[float, Field(allow_inf_nan=False, strict=True)]],
        Field(max_length=limits.max_items),
    ]
    impression: Any = create_model(
        "Impression",
        __base__=Impression,
        request_id=(ident, ...),
        items=(served, ...),
        labels=(labels, Field(default_factory=dict)),
        query=(text | None, None),
        user_id=(text | None, None),
        scores=(scores | None, None),
        teams=(items | None, None),
        interleaving=(text | None, None),
        rankings=(Annotated[dict[text, served], Field(max_length=16)] | None, None),
    )
    feedback: Any = create_model(
        "Feedback",
        __base__=Feedback,
        request_id=(ident, ...),
        item=(ident, ...),
        action=(text, ...),
        event_id=(text | None, None),
    )
    return impression, feedback
