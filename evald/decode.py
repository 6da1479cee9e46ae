"""Raw bytes -> :class:`Impression` | :class:`Feedback` | :class:`Rejection`; never raises on data.

One pydantic-core pass per event (``model_validate_json`` on the raw bytes). Which model to try
first comes from the source (a Kafka topic says ``kind``) or, in a mixed stream, from a cheap
byte sniff for the ``"items"`` key; when the guess fails the other model is tried, so the sniff
only decides speed, never the outcome. Every failure maps to one stable snake_case ``reason``
(they are Prometheus label values and DLQ headers; docs/semantics.md lists them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from evald.events import Feedback, Impression, Limits, limited_models

#: Every rejection reason, in the order docs/semantics.md explains them.
REASONS: tuple[str, ...] = (
    "too_large",
    "invalid_json",
    "not_an_object",
    "unknown_kind",
    "wrong_kind",
    "missing_field",
    "wrong_type",
    "bad_timestamp",
    "bad_grade",
    "missing_grade",
    "unknown_action",
    "too_many_items",
    "too_many_labels",
    "string_too_long",
)

JUDGMENT = "judgment"


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


_LIMIT_REASONS = {
    "items": "too_many_items",
    "scores": "too_many_items",
    "labels": "too_many_labels",
}


def _reason_of(error: Mapping[str, Any]) -> str:
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
    if etype == "string_too_long":
        return "string_too_long"
    return "wrong_type"


def _describe(error: Mapping[str, Any]) -> str:
    loc = ".".join(str(part) for part in error["loc"])
    return f"{loc}: {error['msg']}" if loc else str(error["msg"])


class Decoder:
    """Validates raw events against :class:`Limits` and the configured action grades.

    ``action_grades`` maps each accepted action to its default grade; ``judgment`` is always
    accepted and must carry its own ``grade``.
    """

    def __init__(self, limits: Limits, action_grades: Mapping[str, float]) -> None:
        self.limits = limits
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

    def decode(self, raw: bytes, kind: str | None = None) -> Impression | Feedback | Rejection:
        """Decode one record; ``kind`` ("impression"/"feedback") when the source knows it."""
        if len(raw) > self._max_bytes:
            return Rejection(
                "too_large", f"{len(raw)} bytes > limit {self._max_bytes}", raw, kind or "unknown"
            )
        if kind is None:
            if b'"items"' in raw:
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
            head = _reason_of(errors[0])
            if second is None or head in ("invalid_json", "not_an_object"):
                return Rejection(head, _describe(errors[0]), raw, kind or "unknown")
            try:
                event = second(raw)
            except ValidationError as exc2:
                other = exc2.errors(include_url=False, include_context=False, include_input=False)
                guessed = first is self._validate_impression
                return self._inferred_failure(raw, guessed, errors, other)
        if event.kind == "impression" or event.action in self.action_grades:
            return event
        return self._check(event, raw)

    def decode_many(
        self,
        raws: Sequence[bytes],
        kinds: Sequence[str | None] | str | None,
        rejections: list[tuple[int, Rejection]],
    ) -> Iterator[tuple[int, Impression | Feedback]]:
        """``decode`` over a batch, lazily: yields (position in ``raws``, event) and appends
        (position, rejection) to ``rejections``. ``kinds`` is one kind for all records, one
        per record, or None (sniffed).

        Same outcome as ``decode`` record by record, with the common case inlined: a record
        that does not validate at once goes through ``decode`` itself for its exact reason.
        A generator, so each event is joined while its objects are still in cache.
        """
        validate_impression, validate_feedback = self._validate_impression, self._validate_feedback
        max_bytes, known = self._max_bytes, self.action_grades
        single = kinds is None or isinstance(kinds, str)
        kind = kinds if single else None
        for position, raw in enumerate(raws):
            if not single:
                kind = kinds[position]  # type: ignore[index]
            try:
                if len(raw) > max_bytes:
                    raise _Slow
                if kind == "impression" or (kind is None and b'"items"' in raw):
                    event = validate_impression(raw)
                elif kind == "feedback" or kind is None:
                    event = validate_feedback(raw)
                    if event.action not in known:
                        event = self._check(event, raw)
                else:
                    raise _Slow
            except (ValidationError, _Slow):
                event = self.decode(raw, kind)  # type: ignore[arg-type]
            if event.__class__ is Rejection:
                rejections.append((position, event))  # type: ignore[arg-type]
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
        return Rejection(_reason_of(errors[0]), _describe(errors[0]), raw, kind)

    def _check(self, event: Impression | Feedback, raw: bytes) -> Impression | Feedback | Rejection:
        """Rules pydantic cannot express per configuration: known actions, judgment grades."""
        if event.kind == "impression":
            return event
        action = event.action  # type: ignore[union-attr]
        if action in self.action_grades:
            return event
        if action == JUDGMENT:
            if event.grade is None:  # type: ignore[union-attr]
                return Rejection("missing_grade", "judgment without a grade", raw, "feedback")
            return event
        known = ", ".join(sorted([*self.action_grades, JUDGMENT]))
        return Rejection(
            "unknown_action", f"unknown action {action!r} (known: {known})", raw, "feedback"
        )
