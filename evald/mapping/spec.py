"""What a mapping file may say, validated with the key named in every error.

A mapping is YAML or JSON (docs/mapping.md): an ``impression`` and/or a ``feedback`` section
saying where each field of the native event is (JSON Pointers, RFC 6901), an optional ``kind``
rule for mixed files, and ``extends: NAME`` to start from a built-in mapping and change a few
keys (a key set to null is removed, so ``actions: {add_to_cart: null}`` drops one action).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from evald.events import MAX_GRADE
from evald.mapping.pointer import parse_pointer
from evald.mapping.presets import BUILTIN, NATIVE
from evald.mapping.times import Formats, TimeFormat, check_formats
from evald.settings_file import SettingsFileError, read_settings_file


class MappingError(ValueError):
    """A mapping that cannot be used; the message names the file and the key."""


def _pointer(text: str) -> str:
    parse_pointer(text)
    return text


Pointer = Annotated[str, AfterValidator(_pointer)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimeSpec(_Strict):
    """Where the event time is and how it is written (the unit is declared, never guessed):
    a field of the record (``path`` and ``format``), or, with ``source: record``, the Kafka
    record's own timestamp (epoch ms; nothing else to declare). ``format`` is one format or a
    list of RFC 3339 and one epoch unit, each value read as its JSON type chooses."""

    source: Literal["field", "record"] = "field"
    path: Pointer | None = None
    format: TimeFormat | list[TimeFormat] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TimeSpec:
        if self.source == "record" and (self.path is not None or self.format is not None):
            raise ValueError("source: record takes the Kafka record timestamp: no path or format")
        if self.source == "field" and (self.path is None or self.format is None):
            raise ValueError("give path and format (or source: record for the Kafka timestamp)")
        if isinstance(self.format, list):
            check_formats(tuple(self.format))
        return self

    @property
    def formats(self) -> Formats:
        """The declared formats as a tuple (one, or RFC 3339 and one epoch unit)."""
        fmt = self.format
        assert fmt is not None  # a field time (the record's has no format)
        return (fmt,) if isinstance(fmt, str) else tuple(fmt)


class ItemsSpec(_Strict):
    """The served list: an array of ids, or of objects whose id is at ``id`` (a pointer)."""

    path: Pointer
    id: Pointer | None = None


class LabelSpec(_Strict):
    """One label source: an object flattened into labels (nested keys joined by '_', under
    ``name_`` when named), or a single value labelled ``name``."""

    path: Pointer
    name: str | None = Field(None, min_length=1)


def _grade(value: float) -> float:
    if not 0 <= value <= MAX_GRADE:
        raise ValueError(f"a grade is a number from 0 to {MAX_GRADE:g}")
    return value


class ImpressionSpec(_Strict):
    request_id: Pointer
    time: TimeSpec
    items: Pointer | ItemsSpec
    labels: list[LabelSpec] = Field(default_factory=list)
    #: first of these present (not null, not "") is the user id
    user_id: list[Pointer] = Field(default_factory=list)
    query: Pointer | None = None
    #: several records of one request id: ``duplicate`` (the native rule: the first is the
    #: list, a repeat is a duplicate) or ``merge`` (one list: records without items add
    #: nothing, the first with items gives them, other items are a conflict; docs/mapping.md)
    repeats: Literal["duplicate", "merge"] = "duplicate"
    #: an interleaved list (docs/semantics.md §9): each item's team, an array aligned with
    #: the items (or objects whose team name is at ``id``), and the method, read at a pointer
    #: or stated for every list
    teams: Pointer | ItemsSpec | None = None
    interleaving: Pointer | Literal["team_draft", "team_draft_multileave"] | None = None

    @model_validator(mode="after")
    def _teams_with_method(self) -> ImpressionSpec:
        if (self.teams is None) != (self.interleaving is None):
            raise ValueError("teams and interleaving go together (docs/mapping.md)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _one_user_path(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("user_id"), str):
            data = {**data, "user_id": [data["user_id"]]}
        return data


class FeedbackSpec(_Strict):
    request_id: Pointer
    time: TimeSpec
    item: Pointer
    action: Pointer
    #: grade of each counted action; feedback with another action is skipped (and counted)
    actions: dict[str, Annotated[float, AfterValidator(_grade)]] = Field(min_length=1)
    #: an explicit grade in the record wins over the action's
    grade: Pointer | None = None
    position: Pointer | None = None
    event_id: Pointer | None = None
    #: actions that record an item shown at ``position`` of its request's list (per-item
    #: impression events): a list no record gives items to is built from them
    shown_actions: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _shown_apart(self) -> FeedbackSpec:
        graded = sorted(set(self.shown_actions) & set(self.actions))
        if graded:
            raise ValueError(f"shown_actions: {graded[0]!r} is a graded action too")
        if self.shown_actions and self.position is None:
            raise ValueError("shown_actions: needs position (where the item was shown)")
        return self


class KindSpec(_Strict):
    """How a record in a mixed file tells its kind (on Kafka the topic tells): the value of
    ``field`` (``impression`` / ``feedback`` name the values), or whether ``present`` leads to
    a value (then the record is of kind ``means``, otherwise of the other kind)."""

    field: Pointer | None = None
    impression: str | None = None
    feedback: str | None = None
    present: Pointer | None = None
    means: Literal["impression", "feedback"] | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> KindSpec:
        by_field = self.field is not None
        by_presence = self.present is not None
        if by_field == by_presence:
            raise ValueError("give either field (with impression and feedback) or present")
        if by_field and (self.impression is None or self.feedback is None):
            raise ValueError("field needs both impression and feedback values")
        if by_field and self.impression == self.feedback:
            raise ValueError("impression and feedback must be different values")
        if by_presence and self.means is None:
            raise ValueError("present needs means: impression or feedback")
        return self


class MappingSpec(_Strict):
    description: str | None = None
    kind: KindSpec | None = None
    #: index name -> kind, for records that come with one (`evald replay` of an OpenSearch or
    #: Elasticsearch ``_bulk`` file or search-hit dump); it decides before ``kind``
    indices: dict[str, Literal["impression", "feedback"]] = Field(default_factory=dict)
    impression: ImpressionSpec | None = None
    feedback: FeedbackSpec | None = None

    @model_validator(mode="after")
    def _something(self) -> MappingSpec:
        if self.impression is None and self.feedback is None:
            raise ValueError("a mapping needs an impression or a feedback section")
        if (
            self.feedback is not None
            and self.feedback.shown_actions
            and self.impression is not None
            and self.impression.repeats != "merge"
        ):
            raise ValueError(
                "feedback.shown_actions: needs impression.repeats: merge (a list is then "
                "made of its query records and shown items)"
            )
        for name, kind in self.indices.items():
            if getattr(self, kind) is None:
                raise ValueError(f"indices.{name}: the mapping has no {kind} section")
        return self

    def merges_repeats(self) -> bool:
        """Whether the records of one request id make one list (docs/mapping.md)."""
        return (self.impression is not None and self.impression.repeats == "merge") or bool(
            self.feedback is not None and self.feedback.shown_actions
        )

    def reads_record_time(self) -> bool:
        """Whether a section takes its time from the Kafka record (so files cannot be read)."""
        sections = (self.impression, self.feedback)
        return any(s is not None and s.time.source == "record" for s in sections)


def load_spec(source: str) -> MappingSpec | None:
    """The mapping named by ``source`` (a built-in name or a YAML/JSON file); None for the
    native schema. Raises :class:`MappingError` naming the file and the key."""
    if source == NATIVE:
        return None
    if source in BUILTIN:
        tree: Any = dict(BUILTIN[source])
    elif os.path.exists(source):  # a directory or an unreadable file: _read says which
        tree = _read(source)
    else:
        names = ", ".join([NATIVE, *BUILTIN])
        raise MappingError(f"mapping {source!r}: neither a built-in ({names}) nor a file")
    if not isinstance(tree, dict):
        got = type(tree).__name__
        raise MappingError(f"mapping {source}: must be a mapping of keys, not {got}")
    base = tree.pop("extends", None)
    if base is not None:
        if base not in BUILTIN:
            names = ", ".join(BUILTIN)
            raise MappingError(f"mapping {source}: extends: {base!r} is not a built-in ({names})")
        tree = _overlay(BUILTIN[base], tree)
    try:
        return MappingSpec.model_validate(tree)
    except ValidationError as exc:
        raise MappingError(f"mapping {source}: " + _describe(exc)) from None


def _read(path: str) -> Any:
    try:
        return read_settings_file(path, json_text=path.endswith(".json"))
    except SettingsFileError as exc:
        raise MappingError(f"mapping {exc}") from None


def _overlay(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged key by key; a null in ``override`` removes the key."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _overlay(out[key], value)
        else:
            out[key] = value
    return out


def _describe(exc: ValidationError) -> str:
    """``key.path: message`` per error. For ``items`` (a pointer or an object) only the
    branch the value took is reported, without the branch names pydantic puts in the location:
    "not a dictionary" about a pointer says nothing to the user."""
    lines = []
    for error in exc.errors(include_url=False):
        parts = [str(part) for part in error["loc"]]
        branch = parts[-1] if parts else ""
        given = error["input"]
        if (branch == "ItemsSpec" and isinstance(given, str)) or (
            branch.startswith("function-") and isinstance(given, dict)
        ):
            continue  # the other branch of the union says what is wrong
        where = ".".join(part for part in parts if part != "ItemsSpec" and "[" not in part)
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"{where}: {message}" if where else message)
    return "; ".join(lines)
