"""The mapping decoder's fast path: a well-formed record straight to its event.

:func:`compile_fast` turns a mapping into one Python function, written for it and compiled once
when the mapping is loaded: raw bytes -> the event, a :class:`Skipped`, or None, meaning "not
this way": the exact path (``MappingDecoder.decode_exact``) then decides and words the reason.
Each pointer is spelt in the function as plain subscripts (``d['a']['b']``), so a record costs
one Python frame plus the parser, not a call per field. A required field that is absent
raises, caught once per record; the fast path never words an error and never raises on data.

The event is built directly, as pydantic's ``model_construct`` builds it, where the function
knows every field is what the limited model takes unchanged (text of at most the length limit,
a list of text within the item limit, a float grade, a non-negative int position, ...);
anything else goes through that model's pydantic-core validator, which refuses or converts as
on the exact path. It returns only what the exact path returns too, down to the types and the
fields given (tests/mapping/test_fast.py checks it on random, malformed and mistyped records).

The generated source holds only pointer tokens as ``repr`` literals and names bound in its own
namespace; :func:`fast_source` shows it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec
from pydantic import BaseModel
from pydantic_core import from_json

from evald.decode import Skipped
from evald.events import MAX_GRADE, MAX_TS_MS, Feedback, Impression, Limits, Shown, limited_models
from evald.input_rule import blank
from evald.mapping.keys import encode, maybe_repeated
from evald.mapping.labels import flatten, label_text
from evald.mapping.pointer import MISSING, parse_pointer, resolve
from evald.mapping.spec import FeedbackSpec, ImpressionSpec, LabelSpec, MappingSpec, TimeSpec
from evald.mapping.times import MILLIS, SCALE, SECONDS, millis_reader

#: (raw, kind, reference, record_time) -> the event, a Skipped, or None (the exact path decides)
FastPath = Callable[[bytes, str | None, int | None, int | None], Any]

#: containers nested in a record that pydantic-core's parser (the exact path's) surely reads:
#: it refuses more than about 200, msgspec's about 1000
_DEPTH = 200

#: what a failed subscript raises: absent key, wrong container type, index out of range
_MISS = "(KeyError, TypeError, IndexError)"


def compile_fast(
    spec: MappingSpec, limits: Limits, *, min_ts: int = 0, max_lead: int | None = None
) -> FastPath:
    """The fast path for ``spec`` under ``limits`` and the event-time bounds (those of the
    ``MappingDecoder`` it serves)."""
    source, names = _generate(spec, limits, min_ts, max_lead)
    namespace: dict[str, Any] = dict(names)
    exec(compile(source, "<mapping fast path>", "exec"), namespace)
    fast: FastPath = namespace["fast"]
    return fast


def fast_source(spec: MappingSpec, limits: Limits | None = None) -> str:
    """The source :func:`compile_fast` writes for ``spec`` (for reading and debugging)."""
    return _generate(spec, limits or Limits.model_validate({}), 0, None)[0]


class _Writer:
    """Lines of Python at an indentation, and the objects they name."""

    def __init__(self, limits: Limits, min_ts: int, max_lead: int | None) -> None:
        self.limits = limits
        impression, feedback = limited_models(limits)
        self.models: dict[str, type[Impression] | type[Feedback]] = {
            "impression": impression,
            "feedback": feedback,
        }
        self.min_ts, self.max_lead = int(min_ts), None if max_lead is None else int(max_lead)
        self.lines: list[str] = []
        self.names: dict[str, Any] = {}
        self.depth = 0

    def __call__(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def bind(self, stem: str, value: Any) -> str:
        """A name for ``value`` in the function's namespace."""
        name = f"_{stem}{len(self.names)}"
        self.names[name] = value
        return name


def _subscripts(tokens: tuple[str, ...]) -> str:
    return "".join(f"[{token!r}]" for token in tokens)


def _digits(tokens: tuple[str, ...]) -> bool:
    """A token that could index an array: read through :func:`resolve` (RFC 6901's rules)."""
    return any(token.isdigit() for token in tokens)


def _required(w: _Writer, target: str, pointer: str, source: str = "d") -> None:
    """``target`` = the value at ``pointer``; absent or null: the exact path decides."""
    tokens = parse_pointer(pointer)
    if _digits(tokens):
        w(f"{target} = _resolve({source}, {tokens!r})")
        w(f"if {target} is _MISSING or {target} is None:")
    else:
        w(f"{target} = {source}{_subscripts(tokens)}")  # a miss raises
        w(f"if {target} is None:")
    w("    return None")


def _optional(w: _Writer, target: str, pointer: str) -> None:
    """``target`` = the value at ``pointer`` or ``_MISSING``."""
    tokens = parse_pointer(pointer)
    if _digits(tokens) or not tokens:
        w(f"{target} = _resolve(d, {tokens!r})")
    elif len(tokens) == 1:
        w(f"{target} = d.get({tokens[0]!r}, _MISSING)")
    else:
        w("try:")
        w(f"    {target} = d{_subscripts(tokens)}")
        w(f"except {_MISS}:")
        w(f"    {target} = _MISSING")


def _time(w: _Writer, spec: TimeSpec) -> None:
    """``ts`` = the plausible event time in ms; otherwise the exact path decides."""
    if spec.source == "record":
        w("ts = record_time")
        w("if ts is None or ts < 0:")
        w("    return None")
    else:
        assert spec.path is not None  # TimeSpec checked it
        _optional(w, "t", spec.path)
        formats = spec.formats
        if len(formats) == 1:
            _time_as(w, formats[0])
        else:  # RFC 3339 and one epoch unit: the value's JSON type chooses (times.chosen)
            w("if type(t) is str:")
            w.depth += 1
            _time_as(w, "rfc3339")
            w.depth -= 1
            w("else:")
            w.depth += 1
            _time_as(w, next(f for f in formats if f != "rfc3339"))
            w.depth -= 1
    # the plausibility bounds are constants of the function
    if w.max_lead is None:
        w(f"if ts < {w.min_ts!r}:")
    else:
        w(f"if ts < {w.min_ts!r} or (reference is not None and ts > reference + {w.max_lead!r}):")
    w("    return None")


def _time_as(w: _Writer, fmt: str) -> None:
    """``ts`` = the value ``t`` read as ``fmt``, or return None (the exact path words why)."""
    if fmt == "rfc3339":  # canonical_ms's common case inline, then the reader
        w("ts = None")
        w("if type(t) is str and len(t) == 24 and t[19] == '.' and t[23] in 'Zz':")
        w("    second, millis = _SECONDS.get(t[:19]), _MILLIS.get(t[20:23])")
        w("    if second is not None and millis is not None:")
        w("        ts = second + millis")
        w("if ts is None:")
        w(f"    ts = {w.bind('millis', millis_reader(fmt))}(t)")
        w("if ts is None:")
        w("    return None")
    else:  # to_millis inline, the same arithmetic (a range the model refuses: see _build)
        multiplier, divisor = SCALE[fmt]
        times = f" * {multiplier}" if multiplier > 1 else ""  # (x * 1 and x / 1 are x)
        w("if type(t) is float:")
        over = f" / {divisor}" if divisor > 1 else ""
        w(f"    ts = _floor(t{times}{over})  # past the float range: OverflowError")
        w("elif type(t) is int:")
        w(f"    ts = t{times}{f' // {divisor}' if divisor > 1 else ''}")
        w("else:")
        w("    return None")


def _impression(w: _Writer, spec: ImpressionSpec) -> None:
    _required(w, "rid", spec.request_id)
    _time(w, spec.time)
    items = spec.items
    if spec.repeats == "merge":  # a record without items: its list gets them elsewhere
        _optional(w, "items", items if isinstance(items, str) else items.path)
        w("if items is _MISSING or items is None:")
        w("    items = []")
    else:
        _required(w, "items", items if isinstance(items, str) else items.path)
    if not isinstance(items, str) and items.id is not None:
        tokens = parse_pointer(items.id)
        w("if type(items) is not list:")
        w("    return None")
        if tokens and not _digits(tokens):  # an entry without the id raises
            w(f"items = [entry{_subscripts(tokens)} for entry in items]")
        else:
            w("ids = []")
            w("for entry in items:")
            w(f"    value = _resolve(entry, {tokens!r})")
            w("    if value is _MISSING:")
            w("        return None")
            w("    ids.append(value)")
            w("items = ids")
    fields = {"request_id": "rid", "ts": "ts", "items": "items"}
    if spec.labels:
        _labels(w, spec.labels)
        fields["labels"] = "labels"
    optional = {}
    if spec.user_id:
        _user(w, spec.user_id)
        optional["user_id"] = "uid"
    if spec.query is not None:
        _optional(w, "query", spec.query)
        optional["query"] = "query"
    for target in optional.values():
        w(f"if {target} is _MISSING:")
        w(f"    {target} = None")
    limit = w.limits.max_string_length
    sure = [
        *_ids(("rid",), limit),
        f"type(items) is list and len(items) <= {w.limits.max_items!r}",
        f"len(''.join(items)) <= {limit!r}",  # all text (else TypeError), none too long
        "'' not in items and not any(map(_isspace, items))",  # none blank
    ]
    if spec.labels:
        sure.append(
            f"len(labels) <= {w.limits.max_labels!r} and "
            f"len(''.join(labels)) + len(''.join(labels.values())) <= {limit!r}"
        )
    sure += [
        f"({v} is None or {check})" for v in optional.values() for check in _texts((v,), limit)
    ]
    _build(w, "impression", spec.time.source == "record", sure, fields, optional)


def _user(w: _Writer, paths: list[str]) -> None:
    """``uid`` = the first user id present, not null or blank (a blank one is none)."""
    blank = "uid is _MISSING or uid is None or (type(uid) is str and _blank(uid))"
    for index, path in enumerate(paths):
        if index:
            w(f"if {blank}:")
            w.depth += 1
        _optional(w, "uid", path)
        if index:
            w.depth -= 1
    w("if type(uid) is str and _blank(uid):")
    w("    uid = None")


def _texts(names: tuple[str, ...], limit: int) -> list[str]:
    """Conditions: each of ``names`` is text the limited model takes as it is."""
    return [f"type({name}) is str and len({name}) <= {limit!r}" for name in names]


def _ids(names: tuple[str, ...], limit: int) -> list[str]:
    """Conditions: each of ``names`` is an id the limited model takes as it is: text, and not
    blank (``str.isspace`` is ``input_rule.blank``, the model's ``ID_PATTERN``)."""
    texts = _texts(names, limit)
    return [f"{t} and {n} != '' and not {n}.isspace()" for n, t in zip(names, texts, strict=True)]


def _build(
    w: _Writer,
    kind: str,
    record_time: bool,
    sure: list[str],
    fields: dict[str, str],
    optional: dict[str, str],
) -> None:
    """Returns the event: built directly, as pydantic's ``model_construct`` builds it, where
    ``sure`` (conditions under which the limited model takes every field as it is) holds;
    otherwise validated by the model, which refuses or converts exactly as on the exact path.
    ``fields``: always given; ``optional``: given unless None (model field -> local name)."""
    model = w.models[kind]
    values = {"ts": "ts", **fields, **optional}
    if record_time:  # the caller's, of any type
        sure.append("type(ts) is int")
    sure.append(f"0 <= ts <= {MAX_TS_MS!r}")
    w("if (")
    for index, condition in enumerate(sure):
        w(f"    {'and ' if index else ''}{condition}")
    w("):")
    w.depth += 1
    w(f"e = _new({w.bind('model', model)})")
    spelt = []
    for name, info in model.__pydantic_fields__.items():
        if name in values:
            spelt.append(f"{name!r}: {values[name]}")
        elif info.default_factory is dict:
            spelt.append(f"{name!r}: {{}}")
        else:  # the model's default: 'impression'/'feedback' for kind, else None
            spelt.append(f"{name!r}: {info.default!r}")
    w("_set(e, '__dict__', {" + ", ".join(spelt) + "})")
    given = "{" + ", ".join(repr(name) for name in fields) + "}"
    if optional:
        w(f"given = {given}")
        for name, local in optional.items():
            w(f"if {local} is not None:")
            w(f"    given.add({name!r})")
        given = "given"
    w(f"_set_given(e, {given})")
    w("_set_extra(e, None)")
    w("_set_private(e, None)")
    w("return e")
    w.depth -= 1
    w("f = {" + ", ".join(f"{name!r}: {local}" for name, local in fields.items()) + "}")
    for name, local in optional.items():
        w(f"if {local} is not None:")
        w(f"    f[{name!r}] = {local}")
    w(f"return _validate_{kind}(f)")


def _labels(w: _Writer, labels: list[LabelSpec]) -> None:
    """``f['labels']`` from each label source, as the exact path's ``_add_labels``."""
    w("labels = {}")
    for label in labels:
        _optional(w, "v", label.path)
        w("if v is not _MISSING and v is not None:")
        w.depth += 1
        prefix = f"{label.name}_" if label.name else ""
        w("if type(v) is dict:")  # flat text values inline, anything else by _flatten
        w("    for key, value in v.items():")
        w("        if type(value) is not str:")
        w(f"            if _flatten(labels, v, {prefix!r}) is not None:")
        w("                return None")
        w("            break")
        key = f"{prefix!r} + key" if prefix else "key"
        w(f"        labels[{key}] = value")
        if label.name is None:
            w("else:")
            w("    return None")  # a single value needs a name: the exact path says so
        else:
            w("elif type(v) is str:")
            w(f"    labels[{label.name!r}] = v")
            w("else:")
            w("    text = _label_text(v)")
            w("    if text is None:")
            w("        return None")
            w(f"    labels[{label.name!r}] = text")
        w.depth -= 1


def _feedback(w: _Writer, spec: FeedbackSpec) -> None:
    _required(w, "action", spec.action)
    if spec.shown_actions:
        w(f"if type(action) is str and action in {w.bind('shown', frozenset(spec.shown_actions))}:")
        w.depth += 1
        _shown(w, spec)
        w.depth -= 1
    # the grades as the model holds them (floats), so an event built directly is the same
    grades = w.bind("grades", {action: float(grade) for action, grade in spec.actions.items()})
    if spec.grade is not None:
        _optional(w, "grade", spec.grade)
        w("if grade is _MISSING:")
        w("    grade = None")
        w("if grade is None:")
        w.depth += 1
    w("if type(action) is not str:")
    w("    return None")
    w(f"grade = {grades}.get(action)")
    w("if grade is None:")
    w("    return _Skipped(action)")
    if spec.grade is not None:
        w.depth -= 1
    _required(w, "rid", spec.request_id)
    _required(w, "item", spec.item)
    _time(w, spec.time)
    optional = {}
    for name, pointer in (("position", spec.position), ("event_id", spec.event_id)):
        if pointer is not None:
            _optional(w, name, pointer)
            w(f"if {name} is _MISSING:")
            w(f"    {name} = None")
            optional[name] = name
    limit = w.limits.max_string_length
    sure = [*_ids(("rid", "item"), limit), *_texts(("action",), limit)]
    if spec.grade is not None:  # a grade the record gives: a float from 0 to MAX_GRADE as it is
        sure.append("type(grade) is float and 0.0 <= grade <= _MAX_GRADE")
    if spec.position is not None:
        sure.append("(position is None or (type(position) is int and position >= 0))")
    if spec.event_id is not None:
        sure.append(f"(event_id is None or {_texts(('event_id',), w.limits.max_string_length)[0]})")
    fields = {name: name for name in ("request_id", "ts", "item", "action", "grade")}
    fields["request_id"] = "rid"
    _build(w, "feedback", spec.time.source == "record", sure, fields, optional)


def _shown(w: _Writer, spec: FeedbackSpec) -> None:
    """Returns the :class:`Shown` a ``shown_actions`` record is, as ``_read_shown`` builds it,
    where every field is surely what the feedback model takes; otherwise None."""
    assert spec.position is not None  # the spec requires it with shown_actions
    _required(w, "rid", spec.request_id)
    _required(w, "item", spec.item)
    _required(w, "position", spec.position)
    _time(w, spec.time)
    sure = [
        *_ids(("rid", "item"), w.limits.max_string_length),
        *_texts(("action",), w.limits.max_string_length),
        "type(position) is int and position >= 0",
        f"0 <= ts <= {MAX_TS_MS!r}",
    ]
    w("if " + " and ".join(f"({condition})" for condition in sure) + ":")
    w("    return _Shown(rid, ts, item, position)")
    w("return None")


def _sniff(w: _Writer, spec: MappingSpec) -> None:
    """Sets ``kind`` for a record of unknown kind, as the exact path's sniff does."""
    rule = spec.kind
    if rule is not None and rule.field is not None:
        _optional(w, "v", rule.field)
        values = {rule.impression: "impression", rule.feedback: "feedback"}
        w(f"kind = {w.bind('kinds', values)}.get(v) if type(v) is str else None")
    elif rule is not None and rule.present is not None:
        _optional(w, "v", rule.present)
        other = "impression" if rule.means == "feedback" else "feedback"
        w(f"kind = {other!r} if v is _MISSING or v is None else {rule.means!r}")
    elif spec.impression is None:
        w("kind = 'feedback'")
    elif spec.feedback is None:
        w("kind = 'impression'")
    else:
        w("return None")  # kinds told by topic only: the exact path says so


def _bind_names(w: _Writer, limits: Limits) -> None:
    """What the generated function reads as globals."""
    w.names.update(
        _from_json=from_json,
        _decode=msgspec.json.Decoder().decode,
        _encode=encode,
        _EncodeError=msgspec.EncodeError,
        _maybe_repeated=maybe_repeated,
        _MISSING=MISSING,
        _resolve=resolve,
        _SECONDS=SECONDS,
        _MILLIS=MILLIS,
        _flatten=flatten,
        _label_text=label_text,
        _isspace=str.isspace,
        _blank=blank,
        _Skipped=Skipped,
        _Shown=Shown,
        _validate_impression=w.models["impression"].__pydantic_validator__.validate_python,
        _validate_feedback=w.models["feedback"].__pydantic_validator__.validate_python,
        _new=object.__new__,
        _set=object.__setattr__,
        # BaseModel's slots, set as model_construct sets them (each slot's own setter: no
        # attribute lookup)
        _set_given=BaseModel.__dict__["__pydantic_fields_set__"].__set__,
        _set_extra=BaseModel.__dict__["__pydantic_extra__"].__set__,
        _set_private=BaseModel.__dict__["__pydantic_private__"].__set__,
        _MAX_GRADE=MAX_GRADE,
        _floor=math.floor,
        _max_bytes=limits.max_event_bytes,
    )


def _parse(w: _Writer) -> None:
    """The generated lines that parse ``raw`` into ``d``, or return None for the exact path."""
    w("# msgspec's parser, where the bytes are the document written back: then the exact")
    w("# path's parser reads the same document, provided it is not nested past that parser's")
    w("# limit (bounded by the brackets), and no object repeats a key (evald.mapping.keys)")
    w("d = None")
    w("if raw.find(b'\": ', 0, 64) < 0:  # Python's default layout (seen at its first key)")
    w("    try:")
    w("        d = _decode(raw)")
    w("    except (ValueError, RecursionError):  # msgspec: nested past ~1000, not a ValueError")
    w("        pass")
    w(
        f"if d is None or _encode(d) != raw or (len(raw) >= {2 * _DEPTH} and "
        f"raw.count(b'{{') + raw.count(b'[') >= {_DEPTH}):"
    )
    w("    # the exact path's parser and options; a leading BOM fails here and goes there")
    w("    d = _from_json(raw, allow_inf_nan=False, cache_strings='keys')")
    w("    if type(d) is dict and _maybe_repeated(raw, d):")
    w("        return None")
    w("if type(d) is not dict:")
    w("    return None")


def _generate(
    spec: MappingSpec, limits: Limits, min_ts: int, max_lead: int | None
) -> tuple[str, dict[str, Any]]:
    w = _Writer(limits, min_ts, max_lead)
    _bind_names(w, limits)
    w("def fast(raw, kind, reference, record_time):")
    w.depth = 1
    w("if len(raw) > _max_bytes:")
    w("    return None")
    w("try:")
    w.depth = 2
    _parse(w)
    w("if kind is None:")
    w.depth = 3
    _sniff(w, spec)
    w.depth = 2
    for name, section, write in (
        ("impression", spec.impression, _impression),
        ("feedback", spec.feedback, _feedback),
    ):
        if section is not None:
            w(f"if kind == {name!r}:")
            w.depth = 3
            write(w, section)  # type: ignore[arg-type]
            w.depth = 2
    w("return None  # an unknown kind, or no section for it: the exact path says so")
    w.depth = 1
    # a miss, a wrong type, a parser or the model refusing, a time past the float range
    w(f"except {_MISS[:-1]}, ValueError, OverflowError, _EncodeError):")
    w("    return None")
    return "\n".join(w.lines) + "\n", w.names
