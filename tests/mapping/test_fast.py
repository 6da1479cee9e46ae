"""The fast path (evald.mapping.fast) returns what the exact path returns, or steps aside.

Random records for several mappings, well formed and broken (fields missing, null, of any JSON
type, keys repeated, spaced, escaped, a BOM, times out of bounds), each fed both ways: where the
fast path gives an answer it is the exact path's, and ``decode`` always is. Well-formed compact
records must take the fast path (else the speed it exists for is lost silently).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import from_json

from evald.events import Limits
from evald.mapping import MappingDecoder, MappingSpec, load_spec
from evald.mapping.fast import fast_source
from evald.mapping.keys import encode

NOW = 1_714_564_800_000  # 2024-05-01T12:00:00Z
HOUR = 3_600_000

#: every feature of a mapping: a kind field, nested and escaped pointers, items as objects,
#: named and unnamed labels, several user ids, an explicit grade, position and event id
FULL: dict[str, Any] = {
    "kind": {"field": "/type", "impression": "serve", "feedback": "act"},
    "impression": {
        "request_id": "/ctx/req",
        "time": {"path": "/at", "format": "epoch_s"},
        "items": {"path": "/hits", "id": "/doc/id"},
        "labels": [{"path": "/exp"}, {"path": "/ctx/model", "name": "model"}],
        "user_id": ["/ctx/user", "/client"],
        "query": "/q",
    },
    "feedback": {
        "request_id": "/ctx/req",
        "time": {"path": "/at", "format": "epoch_s"},
        "item": "/doc~1id",
        "action": "/what",
        "actions": {"click": 1, "buy": 3},
        "grade": "/stars",
        "position": "/rank",
        "event_id": "/e/id",
    },
}

#: array indexes in pointers, times from the Kafka record, ids as plain arrays, the kind told
#: by presence
INDEXED: dict[str, Any] = {
    "kind": {"present": "/list", "means": "impression"},
    "impression": {
        "request_id": "/ids/0",
        "time": {"source": "record"},
        "items": "/list",
        "labels": [{"path": "/arm", "name": "arm"}],
    },
    "feedback": {
        "request_id": "/ids/0",
        "time": {"path": "/t", "format": "epoch_ms"},
        "item": "/hit/1",
        "action": "/a",
        "actions": {"click": 1},
    },
}

SPECS = {"full": MappingSpec.model_validate(FULL), "indexed": MappingSpec.model_validate(INDEXED)}
SPECS["ubi"] = load_spec("ubi")  # type: ignore[assignment]
DECODERS = {
    name: MappingDecoder(spec, Limits(max_items=5, max_labels=4, max_string_length=12),
                         min_ts=NOW - 24 * HOUR, max_lead=HOUR)
    for name, spec in SPECS.items()
}  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=14)
)
anything = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
ids = st.sampled_from(["a", "b", "r1", "x" * 13, "é"])
seconds = st.sampled_from(
    [NOW / 1000, NOW // 1000, NOW / 1000 + 0.25, (NOW - 30 * HOUR) // 1000, 1e306, -1.0, NOW]
)
rfc3339 = st.sampled_from(
    ["2024-05-01T12:00:00.250Z", "2024-05-01T12:00:00Z", "2024-05-01t11:00:00z",
     "2024-05-01T14:00:00+02:00", "2024-05-01T12:00:00", "2024-05-03T12:00:00Z", "soon", 5,
     "2024-05-01T14:00:00.250+0200", NOW, NOW // 1000, NOW + 0.5, True, [NOW]]
)  # UBI's time field takes RFC 3339 text or epoch ms, the value's type chooses  # fmt: skip


def maybe(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a good value; sometimes any JSON value; sometimes absent (``...``)."""
    return st.one_of(good, good, good, anything, st.just(...))


def sometimes(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a good value; sometimes any JSON value."""
    return st.one_of(good, good, good, anything)


def record(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """A record of dotted paths -> drawn values (``...``: left out)."""
    out: dict[str, Any] = {}
    for path, strategy in fields.items():
        value = draw(strategy)
        if value is ...:
            continue
        *parents, last = path.split(".")
        node = out
        for part in parents:
            nested = node.setdefault(part, {})
            if not isinstance(nested, dict):
                break
            node = nested
        else:
            node[last] = value
    return out


@st.composite
def full_records(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        doc = st.fixed_dictionaries({}, optional={"id": sometimes(ids)})
        hits = st.lists(
            sometimes(st.fixed_dictionaries({}, optional={"doc": sometimes(doc)})), max_size=6
        )
        labels = st.dictionaries(
            st.sampled_from(["arm", "b", "n"]),
            sometimes(st.text(max_size=3))
            | st.integers()
            | st.fixed_dictionaries({"x": st.text(max_size=2)}),
            max_size=3,
        )
        return record(draw, {
            "type": maybe(st.just("serve")), "ctx.req": maybe(ids), "at": maybe(seconds),
            "hits": maybe(hits), "exp": maybe(labels), "ctx.model": maybe(ids),
            "ctx.user": maybe(ids | st.none()), "client": maybe(ids), "q": maybe(ids),
        })  # fmt: skip
    return record(draw, {
        "type": maybe(st.just("act")), "ctx.req": maybe(ids), "at": maybe(seconds),
        "doc/id": maybe(ids), "what": maybe(st.sampled_from(["click", "buy", "hover"])),
        "stars": maybe(st.none() | st.floats(0, 4)), "rank": maybe(st.integers(-1, 30)),
        "e.id": maybe(ids),
    })  # fmt: skip


@st.composite
def indexed_records(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        return record(draw, {
            "ids": maybe(st.lists(ids, max_size=2)), "list": maybe(st.lists(ids, max_size=6)),
            "arm": maybe(ids | st.integers() | st.booleans()),
        })  # fmt: skip
    return record(draw, {
        "ids": maybe(st.lists(ids, max_size=2)), "t": maybe(st.sampled_from([NOW, NOW * 1000, 1.5])),  # noqa: E501
        "hit": maybe(st.lists(ids, max_size=3)), "a": maybe(st.sampled_from(["click", "view"])),
    })  # fmt: skip


@st.composite
def ubi_records(draw: st.DrawFn) -> dict[str, Any]:
    common = {"query_id": maybe(ids), "timestamp": maybe(rfc3339), "client_id": maybe(ids)}
    if draw(st.booleans()):
        return record(draw, {
            **common, "query_response_hit_ids": maybe(st.lists(ids, max_size=6)),
            "query_attributes": maybe(st.dictionaries(st.sampled_from(["m", "arm"]), ids)),
            "user_id": maybe(ids), "user_query": maybe(ids),
        })  # fmt: skip
    return record(draw, {
        **common,
        "action_name": st.sampled_from(["click", "purchase", "on_search", "impression"]),
        "event_attributes.object.object_id": maybe(ids),
        "event_attributes.position.ordinal": maybe(st.integers(-1, 9)),
    })  # fmt: skip


RECORDS = {"full": full_records(), "indexed": indexed_records(), "ubi": ubi_records()}


@st.composite
def written(draw: st.DrawFn, name: str) -> bytes:
    """A record written compactly (mostly), or spaced, with a key repeated, non-ASCII
    escaped, a BOM, or cut short."""
    rec = draw(RECORDS[name])
    how = draw(st.sampled_from(["compact"] * 5 + ["spaced", "repeat", "ascii", "bom", "cut"]))
    raw = json.dumps(rec, separators=(",", ":"), ensure_ascii=how == "ascii").encode()
    if how == "spaced":
        raw = json.dumps(rec).encode()
    elif how == "repeat" and rec:
        key = draw(st.sampled_from(sorted(rec)))
        raw = (
            b"{"
            + json.dumps(key).encode()
            + b":"
            + json.dumps(draw(anything)).encode()
            + b","
            + raw[1:]
        )
    elif how == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif how == "cut":
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


def both_ways(name: str, raw: bytes, kind: str | None, record_time: int | None) -> None:
    decoder = DECODERS[name]
    exact = decoder.decode_exact(raw, kind, NOW, record_time)
    fast = decoder.decode_fast(raw, kind, NOW, record_time)
    if fast is not None:
        assert type(fast) is type(exact)
        assert fast == exact
    assert decoder.decode(raw, kind, NOW, record_time) == exact


KINDS = st.sampled_from([None, None, "impression", "feedback", "other"])
TIMES = st.sampled_from([NOW, NOW - 30 * HOUR, None, -1])


@settings(max_examples=600, derandomize=True, deadline=None)
@given(written("full"), KINDS)
def test_full_mapping_fast_path_agrees_with_the_exact_path(raw: bytes, kind: str | None) -> None:
    both_ways("full", raw, kind, None)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(written("indexed"), KINDS, TIMES)
def test_indexed_mapping_fast_path_agrees(raw: bytes, kind: str | None, at: int | None) -> None:
    both_ways("indexed", raw, kind, at)


@settings(max_examples=500, derandomize=True, deadline=None)
@given(written("ubi"), KINDS)
def test_ubi_fast_path_agrees_with_the_exact_path(raw: bytes, kind: str | None) -> None:
    both_ways("ubi", raw, kind, None)


def compact(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


def test_well_formed_compact_records_take_the_fast_path() -> None:
    at = NOW // 1000
    records = {
        "full": [
            {"type": "serve", "ctx": {"req": "r1", "model": "v2", "user": None}, "at": at,
             "hits": [{"doc": {"id": "a"}}, {"doc": {"id": "b"}}], "exp": {"arm": {"n": "B"}},
             "client": "c1", "q": "shoes"},
            {"type": "act", "ctx": {"req": "r1"}, "at": at + 0.5, "doc/id": "a", "what": "buy",
             "stars": 2.5, "rank": 1, "e": {"id": "e1"}},
            {"type": "act", "ctx": {"req": "r1"}, "at": at, "doc/id": "a", "what": "hover"},
        ],
        "indexed": [{"ids": ["r1"], "list": ["a", "b"], "arm": 3},
                    {"ids": ["r1"], "t": NOW, "hit": ["x", "a"], "a": "click"}],
        "ubi": [
            {"query_id": "q", "timestamp": "2024-05-01T12:00:00.250Z", "client_id": "c",
             "query_response_hit_ids": ["a"], "query_attributes": {"m": "1"}},
            {"query_id": "q", "timestamp": "2024-05-01T12:00:00Z", "action_name": "click",
             "event_attributes": {"object": {"object_id": "a"}, "position": {"ordinal": 0}}},
            {"query_id": "q", "timestamp": NOW, "query_attributes": {}},  # no hits
            {"query_id": "q", "timestamp": NOW, "action_name": "impression",
             "event_attributes": {"object": {"object_id": "a"}, "position": {"ordinal": 3}}},
        ],
    }  # fmt: skip
    for name, batch in records.items():
        decoder = DECODERS[name]
        for rec in batch:
            fast = decoder.decode_fast(compact(rec), None, NOW, NOW)
            assert fast is not None, (name, rec)
            assert fast == decoder.decode_exact(compact(rec), None, NOW, NOW)


def test_the_written_function_is_readable_python_naming_the_pointers() -> None:
    source = fast_source(SPECS["full"])
    assert source.startswith("def fast(raw, kind, reference, record_time):")
    assert "d['ctx']['req']" in source and "d['doc/id']" in source  # '~1' unescaped
    compile(source, "<test>", "exec")


#: values of the types a model tells apart: bool from int, int from float, text at and past
#: the length limit (12 in DECODERS) in code points, huge integers, a number past the float
#: range (written 1e400: parsed as infinity), nested containers, separators inside text
INF = "__inf__"
typed = st.sampled_from([
    True, False, 0, 1, -1, 3, 2**63, 2**70, -(2**70), 0.0, -0.0, 1.5, 2.0, 1e308, -1e308, INF,
    "", "1", "x" * 12, "x" * 13, "é" * 12, "😀" * 12, "😀" * 13, "\u2028", 'q":', "a\\", None,
    [], {}, ["a"], {"a": "b"}, {"a": {"b": {"c": ["d"]}}}, [[[["x"]]]],
])  # fmt: skip
texts = st.sampled_from(
    ["a", "r1", "a", "r1", "x" * 12, "é" * 12, "😀" * 12, "\u2028", "", "x" * 13]
)
plausible = st.sampled_from([NOW // 1000, NOW / 1000 + 0.25, NOW / 1000 - 0.001])


def typed_in(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A good value or one of another type or size (inside a list or an object)."""
    return st.one_of(good, good, typed)


def typed_record(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """Good values but for one or two fields, which get a value of another type or size or
    are left out (a record broken everywhere would mostly test the first check)."""
    broken = draw(st.sets(st.sampled_from(sorted(fields)), max_size=2))
    return record(draw, {
        path: st.one_of(typed, st.just(...)) if path in broken else good
        for path, good in fields.items()
    })  # fmt: skip


@st.composite
def typed_full_records(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        hit = st.fixed_dictionaries({"doc": st.fixed_dictionaries({"id": typed_in(texts)})})
        return typed_record(draw, {
            "type": st.just("serve"), "ctx.req": texts, "at": plausible,
            "hits": st.lists(hit, max_size=7),
            "exp": st.dictionaries(texts, typed_in(texts), max_size=6), "ctx.model": texts,
            "ctx.user": texts, "client": texts, "q": texts,
        })  # fmt: skip
    return typed_record(draw, {
        "type": st.just("act"), "ctx.req": texts, "at": plausible, "doc/id": texts,
        "what": st.sampled_from(["click", "buy", "hover"]),
        "stars": st.floats(0, 4) | st.integers(0, 4) | st.none(), "rank": st.integers(0, 9),
        "e.id": texts,
    })  # fmt: skip


@st.composite
def typed_ubi_records(draw: st.DrawFn) -> dict[str, Any]:
    at = st.sampled_from(["2024-05-01T12:00:00.250Z", "2024-05-01T14:00:00.250+0200", NOW])
    common = {"query_id": texts, "timestamp": at}
    if draw(st.booleans()):
        return typed_record(draw, {
            **common, "query_response_hit_ids": st.lists(typed_in(texts), max_size=7),
            "query_attributes": st.dictionaries(texts, typed_in(texts), max_size=6),
            "user_id": texts, "client_id": texts, "user_query": texts,
        })  # fmt: skip
    return typed_record(draw, {
        **common, "action_name": st.sampled_from(["click", "purchase", "impression"]),
        "event_attributes.object.object_id": texts,
        "event_attributes.position.ordinal": st.integers(0, 9),
    })  # fmt: skip


def identical(fast: Any, exact: Any) -> None:
    """Equal, and equal down to the type of every value and the fields given (``==`` takes 1
    for 1.0 and True for 1)."""
    assert type(fast) is type(exact)
    assert fast == exact and repr(fast) == repr(exact)
    if hasattr(exact, "__pydantic_fields_set__"):
        assert fast.__pydantic_fields_set__ == exact.__pydantic_fields_set__
        assert fast.__pydantic_extra__ == exact.__pydantic_extra__
        assert fast.__pydantic_private__ == exact.__pydantic_private__
        assert fast.model_dump() == exact.model_dump()
        for name, value in exact.__dict__.items():
            assert type(fast.__dict__[name]) is type(value), name


def typed_both_ways(name: str, rec: dict[str, Any], kind: str | None) -> bool:
    """Both paths on ``rec`` written compactly; True: the fast path answered."""
    raw = compact(rec).replace(f'"{INF}"'.encode(), b"1e400")
    decoder = DECODERS[name]
    exact = decoder.decode_exact(raw, kind, NOW, None)
    fast = decoder.decode_fast(raw, kind, NOW, None)
    if fast is not None:
        identical(fast, exact)
    identical(decoder.decode(raw, kind, NOW, None), exact)
    return fast is not None


@settings(max_examples=800, derandomize=True, deadline=None)
@given(typed_full_records(), st.sampled_from([None, "impression", "feedback"]))
def test_fast_events_are_the_exact_ones_down_to_types(rec: dict[str, Any], kind: Any) -> None:
    typed_both_ways("full", rec, kind)


@settings(max_examples=500, derandomize=True, deadline=None)
@given(typed_ubi_records(), st.sampled_from([None, "impression", "feedback"]))
def test_fast_ubi_events_are_the_exact_ones_down_to_types(rec: dict[str, Any], kind: Any) -> None:
    typed_both_ways("ubi", rec, kind)


def test_events_built_directly_are_the_validated_ones() -> None:
    """Well-formed records (no validation on the fast path) and records at the limits (the
    model decides): the same events either way, down to the types and the fields given."""
    at = NOW // 1000
    long_items = [{"doc": {"id": "x" * 12}} for _ in range(5)]  # each fits, together they do not
    for rec in [
        {"type": "serve", "ctx": {"req": "r1", "model": 3}, "at": at, "hits": long_items,
         "exp": {"arm": True, "n": {"x": 1.5}}, "client": "c1", "q": "😀" * 12},
        {"type": "act", "ctx": {"req": "r1"}, "at": at, "doc/id": "a", "what": "buy"},
        {"type": "act", "ctx": {"req": "r1"}, "at": at, "doc/id": "a", "what": "x", "stars": 2},
        {"type": "act", "ctx": {"req": "r1"}, "at": at, "doc/id": "a", "what": "x", "stars": 2.5,
         "rank": 2**70, "e": {"id": "e"}},
    ]:  # fmt: skip
        assert typed_both_ways("full", rec, None), rec
    # short enough in all, but one label too many (DECODERS allow 4): the model refuses
    labels = {"a": "", "b": "", "c": "", "d": "", "e": ""}
    rec = {"type": "serve", "ctx": {"req": "r"}, "at": at, "hits": [], "exp": labels}
    assert not typed_both_ways("full", rec, None)


def nested_record(depth: int, opener: str) -> dict[str, Any]:
    """An impression of the full mapping carrying ``depth`` containers nested in a field it
    does not read (``opener``: '[' arrays, '{' objects, '[{' both in turn)."""
    value: Any = "x"
    for level in range(depth):
        value = [value] if opener[level % len(opener)] == "[" else {"k": value}
    return {"type": "serve", "ctx": {"req": "r"}, "at": NOW // 1000, "hits": [], "deep": value}


def test_records_nested_near_the_parser_limit_are_read_alike() -> None:
    """The fast path parses with msgspec, which reads containers nested deeper than the exact
    path's parser does: around that limit both still agree (refused, or the same event)."""
    refused = 0
    for depth in range(190, 215):
        for opener in ("[", "{", "[{"):
            rec = nested_record(depth, opener)
            if not typed_both_ways("full", rec, None):
                exact = DECODERS["full"].decode_exact(compact(rec), None, NOW, None)
                refused += getattr(exact, "reason", "") == "invalid_json"
    assert refused > 0  # the limit lies in the range tried


def test_records_nested_past_the_fast_parser_limit_are_refused_not_raised() -> None:
    """msgspec raises RecursionError, not ValueError, past about 1000 containers: a record
    nested that deep (one line of a file, one Kafka record) is refused as invalid JSON on
    every path, as the exact path refuses it, where it crashed a replay or the daemon."""
    for depth in (1000, 5000):
        for opener, closer in (("[", "]"), ('{"k":', "}")):
            deep = (opener * depth + '"x"' + closer * depth).encode()
            raw = compact(nested_record(0, "[")).replace(b'"deep":"x"', b'"deep":' + deep)
            for name, decoder in DECODERS.items():
                exact = decoder.decode_exact(raw, None, NOW, None)
                assert getattr(exact, "reason", None) == "invalid_json", (name, exact)
                assert decoder.decode_fast(raw, None, NOW, None) is None
                assert decoder.decode(raw, None, NOW) == exact
                rejections: list[Any] = []
                assert not list(decoder.decode_many([raw], None, rejections, NOW))
                assert rejections == [(0, exact)]


@settings(max_examples=1000, derandomize=True, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**80), 2**80))
def test_both_parsers_read_a_written_back_number_alike(number: float) -> None:
    """Where the bytes are the document written back (when the fast path parses with
    msgspec), pydantic-core reads the same number, bit for bit."""
    raw = encode({"at": number, "n": [number]})
    assert repr(from_json(raw)) == repr(msgspec.json.decode(raw))


EPOCH_DECODERS = {
    fmt: MappingDecoder(
        MappingSpec.model_validate({"feedback": {
            "request_id": "/r", "item": "/i", "action": "/a", "actions": {"click": 1},
            "time": {"path": "/t", "format": fmt},
        }}),
        Limits(), min_ts=0, max_lead=HOUR,
    )
    for fmt in ("epoch_s", "epoch_ms", "epoch_us", "epoch_ns")
}  # fmt: skip
#: around the current time in each unit, and anywhere
epoch_numbers = st.one_of(
    st.sampled_from([NOW // 1000, NOW, NOW * 1000, NOW * 1_000_000]).flatmap(
        lambda at: (
            st.integers(at - 10**7, at + 10**7)
            | st.floats(float(at - 10**7), float(at + 10**7))
            | st.integers(at - 10**7, at + 10**7).map(lambda n: n + 0.5)
        )
    ),
    st.integers(-(2**80), 2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.just(INF),
)


@settings(max_examples=600, derandomize=True, deadline=None)
@given(st.sampled_from(sorted(EPOCH_DECODERS)), epoch_numbers)
def test_epoch_times_read_inline_are_the_exact_ones(fmt: str, at: Any) -> None:
    raw = compact({"r": "r", "i": "i", "a": "click", "t": at}).replace(
        f'"{INF}"'.encode(), b"1e400"
    )
    decoder = EPOCH_DECODERS[fmt]
    exact = decoder.decode_exact(raw, None, NOW, None)
    fast = decoder.decode_fast(raw, None, NOW, None)
    if fast is not None:
        identical(fast, exact)
