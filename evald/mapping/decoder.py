"""The decoder behind ``--mapping``: reads records of any JSON schema a :class:`MappingSpec`
describes into the native :class:`Impression` / :class:`Feedback` (the engine's decoder seam).

Same input rule as the native decoder (size limit on the raw bytes, BOM ignored, repeated keys
rejected, limits enforced by the same limited models) and the same rejection reasons; every
detail names the JSON Pointer it is about. Feedback whose action the mapping does not grade
(and that carries no explicit grade) is skipped and counted in ``skipped`` by action: it is
not an error, most trackers send many actions that do not judge an item.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import methodcaller
from typing import Any

from pydantic import ValidationError
from pydantic_core import from_json

from evald.decode import Rejection, Skipped, interleaving_checked, message_of, reason_of
from evald.events import Feedback, Impression, Limits, Shown, limited_models
from evald.input_rule import BOM, blank, duplicate_key, implausibility
from evald.mapping.fast import compile_fast
from evald.mapping.keys import maybe_repeated
from evald.mapping.labels import flatten, label_text, not_a_label
from evald.mapping.pointer import MISSING, format_pointer, getter, parse_pointer
from evald.mapping.spec import FeedbackSpec, ImpressionSpec, MappingSpec, TimeSpec
from evald.mapping.times import (
    UNIT_WORDS,
    Formats,
    TimeValueError,
    canonical_ms,
    chosen,
    read_time,
)


class _Unreadable(Exception):
    """Internal: the record cannot be read; carries the reason code and the detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True, slots=True)
class _Path:
    """A parsed pointer, its text (for messages), ``get``: any JSON value -> the value at the
    pointer or MISSING, and ``top``: the same for a value known to be an object (a record)."""

    tokens: tuple[str, ...]
    text: str
    get: Callable[[Any], Any]
    top: Callable[[dict[str, Any]], Any]

    @classmethod
    def of(cls, text: str) -> _Path:
        tokens = parse_pointer(text)
        get = getter(tokens)
        if len(tokens) == 1 and not tokens[0].isdigit():
            # one key of an object: dict.get itself, called from C (no Python frame per read)
            return cls(tokens, text, get, methodcaller("get", tokens[0], MISSING))
        return cls(tokens, text, get, get)


def _opt(text: str | None) -> _Path | None:
    return None if text is None else _Path.of(text)


#: how a message names the time when the mapping reads it from the Kafka record
RECORD_TIME = "the record timestamp"


def _time_of(spec: TimeSpec) -> tuple[_Path | None, Formats, str]:
    """(pointer or None for the record timestamp, formats, what a message calls the time)."""
    if spec.source == "record":
        return None, ("epoch_ms",), RECORD_TIME
    assert spec.path is not None  # TimeSpec checked it
    return _Path.of(spec.path), spec.formats, spec.path


class _ImpressionReader:
    def __init__(self, spec: ImpressionSpec) -> None:
        self.request_id = _Path.of(spec.request_id)
        self.time, self.time_format, time_text = _time_of(spec.time)
        items = spec.items
        self.items = _Path.of(items if isinstance(items, str) else items.path)
        self.item_id = None if isinstance(items, str) or items.id is None else _Path.of(items.id)
        self.labels = [(_Path.of(label.path), label.name) for label in spec.labels]
        self.user_id = [_Path.of(path) for path in spec.user_id]
        self.query = _opt(spec.query)
        #: records of one request id make one list: a record may come without items
        self.merge = spec.repeats == "merge"
        #: an interleaved list's teams (path, team within an object) and method (path or name)
        teams = spec.teams
        self.teams = (
            None if teams is None else _Path.of(teams if isinstance(teams, str) else teams.path)
        )
        self.team_id = (
            None
            if isinstance(teams, str) or teams is None or teams.id is None
            else _Path.of(teams.id)
        )
        method = spec.interleaving
        self.method: _Path | str | None = (
            _Path.of(method) if method and method.startswith("/") else method
        )
        self.where = {
            "request_id": self.request_id.text,
            "ts": time_text,
            "items": self.items.text,
            "labels": "labels",
            "user_id": " or ".join(p.text for p in self.user_id),
            "query": self.query.text if self.query else "query",
        }


class _FeedbackReader:
    def __init__(self, spec: FeedbackSpec) -> None:
        self.request_id = _Path.of(spec.request_id)
        self.time, self.time_format, time_text = _time_of(spec.time)
        self.item = _Path.of(spec.item)
        self.action = _Path.of(spec.action)
        self.grade = _opt(spec.grade)
        self.position = _opt(spec.position)
        self.event_id = _opt(spec.event_id)
        self.shown = frozenset(spec.shown_actions)
        self.where = {
            "request_id": self.request_id.text,
            "ts": time_text,
            "item": self.item.text,
            "action": self.action.text,
            "grade": self.grade.text if self.grade else self.action.text,
            "position": self.position.text if self.position else "position",
            "event_id": self.event_id.text if self.event_id else "event_id",
        }


class MappingDecoder:
    """An :class:`evald.decode.EventDecoder` for the schema ``spec`` describes."""

    def __init__(
        self,
        spec: MappingSpec,
        limits: Limits,
        *,
        min_ts: int = 0,
        max_lead: int | None = None,
    ) -> None:
        self.limits = limits
        self.min_ts, self.max_lead = min_ts, max_lead
        self.action_grades: dict[str, float] = dict(spec.feedback.actions) if spec.feedback else {}
        #: the mapping takes an event time from the Kafka record: files cannot be read with it
        self.reads_record_time = spec.reads_record_time()
        #: the records of one request id make one list (the join merges them, docs/mapping.md)
        self.merges_repeats = spec.merges_repeats()
        #: index name -> kind, for records an export names the index of (evald replay)
        self.indices: dict[str, str] = dict(spec.indices)
        self._max_bytes = limits.max_event_bytes
        impression, feedback = limited_models(limits)
        self._validate_impression = impression.__pydantic_validator__.validate_python
        self._validate_feedback = feedback.__pydantic_validator__.validate_python
        self._impression = _ImpressionReader(spec.impression) if spec.impression else None
        self._feedback = _FeedbackReader(spec.feedback) if spec.feedback else None
        kind = spec.kind
        self._kind_field = _opt(kind.field) if kind else None
        self._kind_values: dict[str | None, str] = {}
        if kind is not None:
            self._kind_values = {kind.impression: "impression", kind.feedback: "feedback"}
        self._kind_present = _opt(kind.present) if kind else None
        self._kind_means = kind.means if kind else None
        self._fast = compile_fast(spec, limits, min_ts=min_ts, max_lead=max_lead)
        if spec.impression is not None and spec.impression.teams is not None:
            self._fast = _feedback_only(self._fast)  # interleaved lists: the exact path

    # ------------------------------------------------------------------ the seam

    def decode(
        self,
        raw: bytes,
        kind: str | None = None,
        reference: int | None = None,
        record_time: int | None = None,
    ) -> Impression | Feedback | Shown | Rejection | Skipped:
        """One record (see :class:`evald.decode.EventDecoder`): the fast path, and where it
        is not sure, the exact one."""
        event = self._fast(raw, kind, reference, record_time)
        if event is None:
            return self.decode_exact(raw, kind, reference, record_time)
        return event

    def decode_fast(
        self,
        raw: bytes,
        kind: str | None = None,
        reference: int | None = None,
        record_time: int | None = None,
    ) -> Impression | Feedback | Shown | Skipped | None:
        """The fast path alone (evald.mapping.fast): what ``decode_exact`` returns, or None."""
        return self._fast(raw, kind, reference, record_time)

    def decode_exact(
        self,
        raw: bytes,
        kind: str | None = None,
        reference: int | None = None,
        record_time: int | None = None,
    ) -> Impression | Feedback | Shown | Rejection | Skipped:
        """The exact path: every check in order, each failure with its reason and the pointer
        it is about."""
        if len(raw) > self._max_bytes:
            known = kind if kind in ("impression", "feedback") else "unknown"
            return Rejection("too_large", f"{len(raw)} bytes > limit {self._max_bytes}", raw, known)
        text = raw
        try:
            # pydantic-core's parser (the native decoder's): NaN and Infinity are not JSON
            document = from_json(text, allow_inf_nan=False, cache_strings="keys")
        except ValueError as exc:
            # a leading UTF-8 BOM is ignored; the parser refuses it, so it is looked for only here
            parsed = _parse_after_bom(raw) if raw.startswith(BOM) else exc
            if isinstance(parsed, ValueError):
                known = kind if kind in ("impression", "feedback") else "unknown"
                return Rejection("invalid_json", f"not JSON: {parsed}", raw, known)
            text, document = raw[3:], parsed
        if type(document) is not dict:
            known = kind if kind in ("impression", "feedback") else "unknown"
            return Rejection("not_an_object", "a record is a JSON object", raw, known)
        if maybe_repeated(text, document):
            repeated = duplicate_key(text)
            if repeated is not None:
                detail = f"key {repeated!r} appears twice in one object"
                known = kind if kind in ("impression", "feedback") else "unknown"
                return Rejection("duplicate_key", detail, raw, known)
        try:
            if kind is None:
                chosen = self._sniff(document)
            elif kind == "impression" or kind == "feedback":
                chosen = kind
            else:
                raise _Unreadable("unknown_kind", f"unknown source kind {kind!r}")
            if (self._impression if chosen == "impression" else self._feedback) is None:
                raise _Unreadable("unknown_kind", f"the mapping has no {chosen} section")
        except _Unreadable as exc:
            return Rejection(exc.reason, exc.detail, raw, kind or "unknown")
        try:
            if chosen == "impression":
                return self._read_impression(document, raw, reference, record_time)
            return self._read_feedback(document, raw, reference, record_time)
        except _Unreadable as exc:
            return Rejection(exc.reason, exc.detail, raw, chosen)

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
        and (position, skip)."""
        fast, exact = self._fast, self.decode_exact
        single_kind = kinds is None or isinstance(kinds, str)
        single_reference = references is None or isinstance(references, int)
        record_time = None
        for position, raw in enumerate(raws):
            kind = kinds if single_kind else kinds[position]  # type: ignore[index]
            ref = references if single_reference else references[position]  # type: ignore[index]
            if record_times is not None:
                record_time = record_times[position]
            event = fast(raw, kind, ref, record_time)  # type: ignore[arg-type]
            if event is None:
                event = exact(raw, kind, ref, record_time)  # type: ignore[arg-type]
            cls = event.__class__
            if cls is Rejection:
                rejections.append((position, event))
            elif cls is Skipped:
                if skips is not None:
                    skips.append((position, event))
            else:
                yield position, event

    # ------------------------------------------------------------------ kinds

    def _sniff(self, document: dict[str, Any]) -> str:
        if self._kind_field is not None:
            value = self._kind_field.top(document)
            kind = self._kind_values.get(value) if isinstance(value, str) else None
            if kind is None:
                wanted = " or ".join(repr(v) for v in self._kind_values)
                got = "missing" if value is MISSING else repr(value)
                raise _Unreadable(
                    "unknown_kind", f"{self._kind_field.text}: {got}, expected {wanted}"
                )
            return kind
        if self._kind_present is not None:
            value = self._kind_present.top(document)
            present = value is not MISSING and value is not None
            means = self._kind_means or "feedback"
            return means if present else ("impression" if means == "feedback" else "feedback")
        if self._impression is None:
            return "feedback"
        if self._feedback is None:
            return "impression"
        raise _Unreadable(
            "unknown_kind", "this mapping tells kinds by topic only (add a kind rule for files)"
        )

    # ------------------------------------------------------------------ fields

    def _read_impression(
        self, document: dict[str, Any], raw: bytes, reference: int | None, record_time: int | None
    ) -> Impression | Rejection:
        spec = self._impression
        assert spec is not None
        request_id = spec.request_id.top(document)
        if request_id is MISSING or request_id is None:
            raise _Unreadable("missing_field", f"{spec.request_id.text}: missing")
        fields: dict[str, Any] = {
            "request_id": request_id,
            "ts": self._time(document, spec.time, spec.time_format, reference, record_time),
            "items": self._items(document, spec),
        }
        if spec.labels:
            labels: dict[str, str] = {}
            for path, name in spec.labels:
                value = path.top(document)
                _add_labels(labels, value, path.text, name)
            fields["labels"] = labels
        for path in spec.user_id:  # a blank id (ubi.js writes user_id "") is none
            value = path.top(document)
            if value is not MISSING and value is not None and not _blank_text(value):
                fields["user_id"] = value
                break
        if spec.query is not None:
            _optional(fields, "query", document, spec.query)
        if spec.teams is not None and fields["items"] != []:
            _read_teams(fields, document, spec)
        try:
            event = self._validate_impression(fields)
        except ValidationError as exc:
            return _rejection(exc, spec.where, raw, "impression")
        return event if spec.teams is None else interleaving_checked(event, raw)

    def _read_feedback(
        self, document: dict[str, Any], raw: bytes, reference: int | None, record_time: int | None
    ) -> Feedback | Shown | Rejection | Skipped:
        spec = self._feedback
        assert spec is not None
        action = spec.action.top(document)
        if action is MISSING or action is None:
            raise _Unreadable("missing_field", f"{spec.action.text}: missing")
        if spec.shown and type(action) is str and action in spec.shown:
            return self._read_shown(document, raw, reference, record_time, action)
        grade: Any = None
        if spec.grade is not None:
            grade = spec.grade.top(document)
            grade = None if grade is MISSING else grade
        if grade is None:
            if type(action) is not str:
                raise _Unreadable("wrong_type", f"{spec.action.text}: an action is text")
            grade = self.action_grades.get(action)
            if grade is None:
                return Skipped(action)
        request_id = spec.request_id.top(document)
        item = spec.item.top(document)
        if request_id is MISSING or request_id is None:
            raise _Unreadable("missing_field", f"{spec.request_id.text}: missing")
        if item is MISSING or item is None:
            raise _Unreadable("missing_field", f"{spec.item.text}: missing")
        fields: dict[str, Any] = {
            "request_id": request_id,
            "ts": self._time(document, spec.time, spec.time_format, reference, record_time),
            "item": item,
            "action": action,
            "grade": grade,
        }
        if spec.position is not None:
            position = spec.position.top(document)
            if position is not MISSING and position is not None:
                fields["position"] = position
        if spec.event_id is not None:
            _optional(fields, "event_id", document, spec.event_id)
        try:
            return self._validate_feedback(fields)
        except ValidationError as exc:
            return _rejection(exc, spec.where, raw, "feedback")

    def _read_shown(
        self,
        document: dict[str, Any],
        raw: bytes,
        reference: int | None,
        record_time: int | None,
        action: str,
    ) -> Shown | Rejection:
        """An item shown at its position (a ``shown_actions`` record): the feedback fields
        and limits, the position required."""
        spec = self._feedback
        assert spec is not None and spec.position is not None  # the spec requires it
        fields: dict[str, Any] = {
            "request_id": _required(document, spec.request_id),
            "item": _required(document, spec.item),
            "action": action,
            "position": _required(document, spec.position),
        }
        fields["ts"] = self._time(document, spec.time, spec.time_format, reference, record_time)
        try:
            event = self._validate_feedback(fields)
        except ValidationError as exc:
            return _rejection(exc, spec.where, raw, "feedback")
        return Shown(event.request_id, event.ts, event.item, event.position)

    def _items(self, document: dict[str, Any], spec: _ImpressionReader) -> Any:
        items = spec.items.top(document)
        if (items is MISSING or items is None) and spec.merge:
            return []  # a record without items: its list gets them from another record
        if items is MISSING or items is None:
            raise _Unreadable("missing_field", f"{spec.items.text}: missing")
        id_path = spec.item_id
        if id_path is None:
            return items
        if type(items) is not list:
            raise _Unreadable("wrong_type", f"{spec.items.text}: expected a list of objects")
        ids = []
        for index, entry in enumerate(items):
            value = id_path.get(entry)
            if value is MISSING:
                where = f"{spec.items.text}/{index}{id_path.text}"
                raise _Unreadable("missing_field", f"{where}: missing")
            ids.append(value)
        return ids

    def _time(
        self,
        document: dict[str, Any],
        path: _Path | None,
        formats: Formats,
        reference: int | None,
        record_time: int | None,
    ) -> int:
        if path is None:  # the Kafka record's timestamp (epoch ms), as the mapping declares
            if record_time is None or record_time < 0:
                raise _Unreadable(
                    "missing_field",
                    f"{RECORD_TIME}: missing (the mapping reads the time from the Kafka record)",
                )
            problem = implausibility(record_time, self.min_ts, self.max_lead, reference)
            if problem is not None:
                raise _Unreadable("implausible_timestamp", f"{RECORD_TIME}: {problem}")
            return record_time
        value = path.top(document)
        fmt = chosen(value, formats)
        ms = canonical_ms(value) if fmt == "rfc3339" and type(value) is str else None
        if ms is None:
            if value is MISSING or value is None:
                raise _Unreadable("missing_field", f"{path.text}: missing")
            try:
                ms = read_time(value, formats)
            except TimeValueError as exc:
                reason = "implausible_timestamp" if exc.implausible else "bad_timestamp"
                raise _Unreadable(reason, f"{path.text}: {exc}") from None
        lead = self.max_lead
        if ms < self.min_ts or (
            lead is not None and reference is not None and ms > reference + lead
        ):
            problem = implausibility(ms, self.min_ts, lead, reference)  # the rule, in words
            raise _Unreadable("implausible_timestamp", f"{path.text}: {problem}{_unit_hint(fmt)}")
        return ms


def _parse_after_bom(raw: bytes) -> Any:
    """The JSON after a leading BOM, or the ValueError saying why it is not JSON."""
    try:
        return from_json(raw[3:], allow_inf_nan=False, cache_strings="keys")
    except ValueError as exc:
        return exc


def _unit_hint(fmt: str) -> str:
    """The declared unit, for a message about an implausible time (a wrong unit, mostly)."""
    return "" if fmt == "rfc3339" else f" (read as {UNIT_WORDS[fmt]}: is that its unit?)"


def _blank_text(value: Any) -> bool:
    """``value`` is text that says nothing (an optional id that counts as absent)."""
    return type(value) is str and blank(value)


def _required(document: Any, path: _Path) -> Any:
    value = path.top(document)
    if value is MISSING or value is None:
        raise _Unreadable("missing_field", f"{path.text}: missing")
    return value


def _optional(fields: dict[str, Any], name: str, document: Any, path: _Path) -> None:
    value = path.top(document)
    if value is not MISSING and value is not None:
        fields[name] = value


def _add_labels(labels: dict[str, str], value: Any, where: str, name: str | None) -> None:
    """Labels from ``value``: an object flattened (nested keys joined by '_', so they can be
    segment label names; under ``name_`` when named), a scalar as label ``name``; numbers
    and booleans as JSON spells them."""
    if value is MISSING or value is None:
        return
    if type(value) is dict:
        bad = flatten(labels, value, f"{name}_" if name else "")
        if bad is not None:
            keys, item = bad  # the path is spelt only for the message
            raise _Unreadable("wrong_type", f"{where}{format_pointer(keys)}: {not_a_label(item)}")
    elif name is None:
        raise _Unreadable("wrong_type", f"{where}: a single value needs a label name")
    else:
        text = label_text(value)
        if text is None:
            raise _Unreadable("wrong_type", f"{where}: {not_a_label(value)}")
        labels[name] = text


def _rejection(exc: ValidationError, where: dict[str, str], raw: bytes, kind: str) -> Rejection:
    """The first validation error, its location spelt as the record's JSON Pointer."""
    error = exc.errors(include_url=False, include_context=False, include_input=False)[0]
    loc = error["loc"]
    head = where.get(str(loc[0]), str(loc[0])) if loc else ""
    rest = "".join(f"/{part}" for part in loc[1:])
    reason = reason_of(error)
    return Rejection(reason, f"{head}{rest}: {message_of(error)}", raw, kind)


def _feedback_only(fast: Any) -> Any:
    """``fast`` for feedback; every impression left to the exact path (which checks teams)."""

    def only(raw: bytes, kind: Any, reference: Any, record_time: Any) -> Any:
        event = fast(raw, kind, reference, record_time)
        return None if isinstance(event, Impression) else event

    return only


def _read_teams(fields: dict[str, Any], document: dict[str, Any], spec: _ImpressionReader) -> None:
    """An interleaved list's ``teams`` (one per item; objects' team at ``team_id``) and
    ``interleaving`` (read, or the mapping's name) into ``fields``; missing: a rejection."""
    assert spec.teams is not None
    teams = spec.teams.top(document)
    if teams is MISSING or teams is None:
        raise _Unreadable("missing_field", f"{spec.teams.text}: missing")
    if spec.team_id is not None:
        if type(teams) is not list:
            raise _Unreadable("wrong_type", f"{spec.teams.text}: expected a list of objects")
        names = []
        for index, entry in enumerate(teams):
            value = spec.team_id.get(entry)
            if value is MISSING or value is None:  # null is absent (docs/mapping.md, "Paths")
                where = f"{spec.teams.text}/{index}{spec.team_id.text}"
                raise _Unreadable("missing_field", f"{where}: missing")
            names.append(value)
        teams = names
    fields["teams"] = teams
    method = spec.method
    if isinstance(method, _Path):
        value = method.top(document)
        if value is MISSING or value is None:
            raise _Unreadable("missing_field", f"{method.text}: missing")
        method = value
    fields["interleaving"] = method
