"""Raw bytes -> :class:`Impression` | :class:`Feedback` | :class:`Rejection`; never raises on data.

One pydantic-core pass per event (``model_validate_json`` on the raw bytes). Which model to try
first comes from the source (a Kafka topic says ``kind``) or, in a mixed stream, from a cheap
byte sniff for the ``"items"`` key; when the guess fails the other model is tried, so the sniff
only decides speed, never the outcome. Every failure maps to one stable snake_case ``reason``
(they are Prometheus label values and DLQ headers; docs/semantics.md lists them).

The input rule shared with ``evald score`` (input_rule.py; docs/semantics.md): the size limit
is checked on the raw bytes first, a leading UTF-8 BOM is ignored, an object with a repeated key
is rejected (``duplicate_key``), and RFC 3339 ``t``/``z`` count as ``T``/``Z``. Event times
outside the plausible range (before ``min_ts`` or more than ``max_lead`` ahead of the reference
time the caller passes) are rejected as ``implausible_timestamp``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from evald.events import Feedback, Impression, Limits, Shown, limited_models
from evald.input_rule import BOM, EMPTY_ID, duplicate_key, implausibility

# re-exported: the engine's counters and the exposition read the reasons here
from evald.input_rule import JOIN_REASONS as JOIN_REASONS
from evald.input_rule import REASONS as REASONS
from evald.input_rule import time_in_words as time_in_words
from evald.interleaving.teams import problem as team_problem

JUDGMENT = "judgment"


def keys_surely_unique(raw: bytes, event: Impression | Feedback) -> bool:
    """True when ``raw``, which validated as ``event``, cannot repeat a key; False: maybe.

    Exact in the True direction, and cheap (substring counts in C). Every key of a record
    is followed by one colon, and the event kept at least one key per distinct key written
    (its fields given plus its label keys). So when the record holds no more colons than
    that, no key is repeated: the common case, one count of a single byte. Otherwise (colons
    in values) the keys written ``"key":`` are counted by ``raw.count(b'":')``: if that count
    equals the keys kept and no colon follows whitespace (no key written ``"key" :`` escaped
    the count), no key is repeated either. Otherwise (unknown fields, escaped quotes, such
    layouts) the caller asks :func:`duplicate_key`.
    """
    kept = len(event.__pydantic_fields_set__)
    if event.kind == "impression":
        kept += len(event.labels)
        if event.rankings:
            kept += len(event.rankings)
    return keys_counted_unique(raw, kept)


def keys_counted_unique(raw: bytes, kept: int) -> bool:
    """True when ``raw``, whose parsed objects hold ``kept`` keys in all, cannot repeat a key
    (see :func:`keys_surely_unique`); False: maybe."""
    if raw.count(b":") == kept:
        return True
    return raw.count(b'":') == kept and not _colon_after_space(raw)


def _colon_after_space(raw: bytes) -> bool:
    """A colon follows JSON whitespace somewhere (a key may be written ``"key" :``)."""
    # find() rather than `in`: bytes.__contains__ first tries its argument as an int and
    # pays for the TypeError, several times the cost of the search itself
    find = raw.find
    return find(b" :") >= 0 or find(b"\t:") >= 0 or find(b"\n:") >= 0 or find(b"\r:") >= 0


#: "no lead bound": larger than any event time
MAX_LIMIT = 1 << 62


class _Slow(Exception):
    """Internal: this record needs ``Decoder.decode``'s full path."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why one raw record was refused; ``raw`` is kept verbatim for the rejected file / DLQ."""

    reason: str
    detail: str
    raw: bytes
    kind: str = "unknown"  # "impression" / "feedback" when known, for evald_events_total

    def to_json(self) -> dict[str, str]:
        """The ``--rejected`` line: reason, detail and the raw record (decoded leniently)."""
        return {
            "reason": self.reason,
            "detail": self.detail,
            "kind": self.kind,
            "raw": self.raw.decode("utf-8", errors="replace"),
        }


@dataclass(frozen=True, slots=True)
class Skipped:
    """A record the input format reads but does not evaluate: feedback whose action a mapping
    does not grade. The engine counts it by ``action`` (``Stats.skipped``), once per record."""

    action: str


class EventDecoder(Protocol):
    """What the engine needs from an input format: raw bytes in, a typed event or a
    :class:`Rejection` out (never an exception on data), one record or a batch.

    Another input format is another decoder handed to ``Engine(decoder=...)``, not an edit of
    the engine. :class:`Decoder` (the native JSON schema, docs/semantics.md) is the default.
    """

    #: default grade per action, for accepted feedback that carries no ``grade`` of its own
    action_grades: dict[str, float]

    def decode(
        self,
        raw: bytes,
        kind: str | None = None,
        reference: int | None = None,
        record_time: int | None = None,
    ) -> Impression | Feedback | Shown | Rejection | Skipped:
        """One record; ``kind`` when the source knows it, ``reference`` (epoch ms) the time
        the event may lead by at most the engine's ``max_event_lead``, ``record_time`` (epoch
        ms) the source record's own timestamp (a Kafka record's; None: it has none, as a
        line of a file). :class:`Skipped`: the format says the record is not evaluated."""
        ...

    def decode_many(
        self,
        raws: Sequence[bytes],
        kinds: Sequence[str | None] | str | None,
        rejections: list[tuple[int, Rejection]],
        references: Sequence[int | None] | int | None = None,
        record_times: Sequence[int | None] | None = None,
        skips: list[tuple[int, Skipped]] | None = None,
    ) -> Iterator[tuple[int, Impression | Feedback | Shown]]:
        """``decode`` over a batch: yields (position, event), appends (position, rejection)
        to ``rejections`` and (position, skip) to ``skips`` (None: skips are dropped);
        ``record_times`` one per record, as ``decode``'s ``record_time``, or None."""
        ...


_LIMIT_REASONS = {
    "items": "too_many_items",
    "scores": "too_many_items",
    "teams": "too_many_items",
    "labels": "too_many_labels",
}


def reason_of(error: Mapping[str, Any]) -> str:
    """Stable reason code for one pydantic error entry."""
    etype = error["type"]
    loc = error["loc"]
    field = loc[0] if loc else None
    if etype == "json_invalid":
        return "invalid_json"
    if not loc and etype in ("model_type", "model_attributes_type", "dict_type"):
        return "not_an_object"
    if etype == "missing":
        return "missing_field"
    if field == "ts":
        return "bad_timestamp"
    if field == "grade":
        return "bad_grade"
    if field == "kind":
        return "wrong_kind"
    if etype == "too_long" and field in _LIMIT_REASONS and len(loc) == 1:
        return _LIMIT_REASONS[field]
    if etype == "too_long" and field == "rankings":
        return "too_many_items"
    if etype == "string_too_long":
        return "string_too_long"
    if etype == "string_pattern_mismatch":  # the one pattern of the models: ids (ID_PATTERN)
        return "empty_id"
    return "wrong_type"


def message_of(error: Mapping[str, Any]) -> str:
    """One pydantic error entry's message, the blank id's in the input rule's words."""
    if error["type"] == "string_pattern_mismatch":
        return EMPTY_ID
    return str(error["msg"])


def interleaving_checked(event: Impression, raw: bytes) -> Impression | Rejection:
    """``event``, or its rejection when its team data are bad (``teams.problem``: the rule
    every decoder applies to an interleaved impression)."""
    if event.teams is None and event.interleaving is None:
        return event
    found = team_problem(event.items, event.teams, event.interleaving, event.rankings)
    if found is None:
        return event
    return Rejection(found[0], found[1], raw, "impression")


#: epoch seconds of any year from 1973 to 5138 read as milliseconds fall before this (March
#: 1973), where no real event is: the unit is the likely mistake, and the message says so
_SECONDS_AS_MS = 10**11
_SECONDS_HINT = " (a number in ts is epoch milliseconds: is it in seconds?)"


def _describe(error: Mapping[str, Any], errors: Sequence[Mapping[str, Any]] = ()) -> str:
    """``error`` in words; for ``ts``, the branch of its union the value took (``errors``
    holds both), so a text time says what is wrong with the text, not that it is no integer."""
    if error["loc"][:1] == ("ts",):
        return _time_words([e for e in errors or (error,) if e["loc"][:1] == ("ts",)])
    loc = ".".join(str(part) for part in error["loc"])
    return f"{loc}: {message_of(error)}" if loc else message_of(error)


def _time_words(errors: Sequence[Mapping[str, Any]]) -> str:
    """The union ``int | str`` failed both ways: a branch that did not fail on the type is
    the one the value took."""
    for error in errors:
        if error["type"] not in ("int_type", "string_type"):
            return "ts: " + str(error["msg"]).removeprefix("Value error, ")
    return "ts: expected RFC 3339 text with an offset or integer epoch milliseconds"


class Decoder:
    """Validates raw events against :class:`Limits` and the configured action grades.

    ``action_grades`` maps each accepted action to its default grade; ``judgment`` is always
    accepted and must carry its own ``grade``.
    """

    def __init__(
        self,
        limits: Limits,
        action_grades: Mapping[str, float],
        *,
        min_ts: int = 0,
        max_lead: int | None = None,
    ) -> None:
        self.limits = limits
        #: plausible event times: ``min_ts <= ts <= reference + max_lead`` (None: no lead bound)
        self.min_ts, self.max_lead = min_ts, max_lead
        self.action_grades: dict[str, float] = dict(action_grades)
        self._max_bytes = limits.max_event_bytes
        self._impression, self._feedback = limited_models(limits)
        self._validate_impression = self._impression.__pydantic_validator__.validate_json
        self._validate_feedback = self._feedback.__pydantic_validator__.validate_json

    def grade_of(self, feedback: Feedback) -> float:
        """The grade a decoded feedback event contributes (explicit ``grade`` wins)."""
        if feedback.grade is not None:
            return feedback.grade
        return self.action_grades[feedback.action]

    def decode(
        self,
        raw: bytes,
        kind: str | None = None,
        reference: int | None = None,
        record_time: int | None = None,
    ) -> Impression | Feedback | Rejection:
        """Decode one record; ``kind`` ("impression"/"feedback") when the source knows it;
        ``reference`` (epoch ms) is the time the event may lead by at most ``max_lead``. The
        native schema carries its own time (``record_time`` is not used) and skips nothing:
        an unknown action is rejected (``unknown_action``)."""
        original = raw
        if len(raw) > self._max_bytes:
            known = kind if kind in ("impression", "feedback") else "unknown"
            return Rejection("too_large", f"{len(raw)} bytes > limit {self._max_bytes}", raw, known)
        if raw.startswith(BOM):
            raw = raw[3:]
        event = self._validate(raw, kind)
        if event.__class__ is Rejection:
            if event.raw is not original:
                event = Rejection(event.reason, event.detail, original, event.kind)
            return event
        repeated = None if keys_surely_unique(raw, event) else duplicate_key(raw)  # type: ignore[arg-type]
        if repeated is not None:
            return Rejection(
                "duplicate_key",
                f"key {repeated!r} appears twice in one object",
                original,
                event.kind,
            )
        problem = implausibility(event.ts, self.min_ts, self.max_lead, reference)  # type: ignore[union-attr]
        if problem is not None:
            hint = _SECONDS_HINT if event.ts < _SECONDS_AS_MS else ""  # type: ignore[union-attr]
            return Rejection("implausible_timestamp", f"ts: {problem}{hint}", original, event.kind)
        if event.kind == "impression":
            return interleaving_checked(event, original)  # type: ignore[arg-type]
        if event.action in self.action_grades:  # type: ignore[union-attr]
            return event
        return self._check(event, original)  # type: ignore[arg-type]

    def _validate(self, raw: bytes, kind: str | None) -> Impression | Feedback | Rejection:
        """Schema validation only (pydantic), with the reason of the first error."""
        if kind is None:
            if raw.find(b'"items"') >= 0:  # not `in`: see _colon_after_space
                first, second = self._validate_impression, self._validate_feedback
            else:
                first, second = self._validate_feedback, self._validate_impression
        elif kind == "impression":
            first, second = self._validate_impression, None
        elif kind == "feedback":
            first, second = self._validate_feedback, None
        else:
            return Rejection("unknown_kind", f"unknown source kind {kind!r}", raw)
        try:
            event = first(raw)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_context=False, include_input=False)
            head = reason_of(errors[0])
            if second is None or head in ("invalid_json", "not_an_object"):
                return Rejection(head, _describe(errors[0], errors), raw, kind or "unknown")
            try:
                event = second(raw)
            except ValidationError as exc2:
                other = exc2.errors(include_url=False, include_context=False, include_input=False)
                guessed = first is self._validate_impression
                return self._inferred_failure(raw, guessed, errors, other)
        return event

    def decode_many(
        self,
        raws: Sequence[bytes],
        kinds: Sequence[str | None] | str | None,
        rejections: list[tuple[int, Rejection]],
        references: Sequence[int | None] | int | None = None,
        record_times: Sequence[int | None] | None = None,
        skips: list[tuple[int, Skipped]] | None = None,
    ) -> Iterator[tuple[int, Impression | Feedback]]:
        """``decode`` over a batch, lazily: yields (position in ``raws``, event) and appends
        (position, rejection) to ``rejections``. ``kinds`` is one kind for all records, one
        per record, or None (sniffed); ``references`` likewise (reference times in ms).
        ``record_times`` and ``skips`` are not used: the native schema carries its own time
        and skips nothing (see ``decode``).

        Same outcome as ``decode`` record by record, with the common case inlined: a record
        that does not pass every check at once goes through ``decode`` itself for its exact
        reason. A generator, so each event is joined while its objects are still in cache.
        """
        validate_impression, validate_feedback = self._validate_impression, self._validate_feedback
        max_bytes, known = self._max_bytes, self.action_grades
        single = kinds is None or isinstance(kinds, str)
        kind = kinds if single else None
        min_ts, lead = self.min_ts, self.max_lead
        one_reference = references is None or isinstance(references, int)
        reference = references if one_reference else None
        limit = MAX_LIMIT if reference is None or lead is None else reference + lead  # type: ignore[operator]
        for position, raw in enumerate(raws):
            if not single:
                kind = kinds[position]  # type: ignore[index]
            if not one_reference:
                reference = references[position]  # type: ignore[index]
                limit = MAX_LIMIT if reference is None or lead is None else reference + lead
            try:
                if len(raw) > max_bytes:  # (a leading BOM fails validation: decode skips it)
                    raise _Slow
                # the sniff: find(), not `in` (see _colon_after_space)
                if kind == "impression" or (kind is None and raw.find(b'"items"') >= 0):
                    event = validate_impression(raw)
                    if event.teams is not None or event.interleaving is not None:
                        raise _Slow  # checked by decode (interleaving_checked)
                    kept = len(event.__pydantic_fields_set__) + len(event.labels)
                elif kind == "feedback" or kind is None:
                    event = validate_feedback(raw)
                    if event.action not in known:
                        raise _Slow
                    kept = len(event.__pydantic_fields_set__)
                else:
                    raise _Slow
                ts = event.ts
                # plausible time, and keys_surely_unique's common case inlined
                if ts < min_ts or ts > limit:
                    raise _Slow
                if raw.count(b":") != kept and not keys_counted_unique(raw, kept):
                    raise _Slow
            except (ValueError, _Slow):
                event = self.decode(raw, kind, reference)  # type: ignore[arg-type]
            if event.__class__ is Rejection:
                rejections.append((position, event))
            else:
                yield position, event

    def _inferred_failure(
        self, raw: bytes, guessed_impression: bool, first: list[Any], second: list[Any]
    ) -> Rejection:
        """Neither model fits a record of unknown kind: explain it as the kind it claims to be.

        A record whose ``"kind"`` names one model is judged by that model; otherwise by the
        sniffed guess, unless it lacks both ``items`` and ``item`` (``unknown_kind``).
        """
        first_kind_ok = not any(e["loc"] == ("kind",) for e in first)
        second_kind_ok = not any(e["loc"] == ("kind",) for e in second)
        if not first_kind_ok and not second_kind_ok:
            return Rejection("unknown_kind", '"kind" must be "impression" or "feedback"', raw)
        if not first_kind_ok:
            errors, impression = second, not guessed_impression
        else:
            errors, impression = first, guessed_impression
        key = "items" if impression else "item"
        if (
            first_kind_ok
            and second_kind_ok
            and any(e["type"] == "missing" and e["loc"] == (key,) for e in errors)
        ):
            return Rejection(
                "unknown_kind", 'neither an impression ("items") nor feedback ("item")', raw
            )
        kind = "impression" if impression else "feedback"
        return Rejection(reason_of(errors[0]), _describe(errors[0], errors), raw, kind)

    def _check(self, event: Impression | Feedback, raw: bytes) -> Impression | Feedback | Rejection:
        """Rules pydantic cannot express per configuration: known actions, judgment grades."""
        if event.kind == "impression":
            return event
        action = event.action
        if action in self.action_grades:
            return event
        if action == JUDGMENT:
            if event.grade is None:
                return Rejection("missing_grade", "judgment without a grade", raw, "feedback")
            return event
        known = ", ".join(sorted([*self.action_grades, JUDGMENT]))
        return Rejection(
            "unknown_action", f"unknown action {action!r} (known: {known})", raw, "feedback"
        )
