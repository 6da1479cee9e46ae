"""Hostile input on every decoder path: nothing raises, every reject says why.

Property tests (hypothesis, derandomized: the same examples on every run) over the engine's
JSON decoder (one record and batches, kind inferred and given, through ``Engine.feed`` and
``feed_batch``), replay's bounded line reader, `evald score`'s JSON Lines and TREC readers
and the daemon settings loader (file, environment, ``--set``). Each asserts that no exception
escapes and that every rejection carries a reason: one of ``REASONS`` for events, a non-empty
message naming the field for settings, a ``file:line: reason`` for score input.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evald.config import load_config
from evald.daemon.settings import Settings, SettingsError, load_settings, set_overrides
from evald.decode import BOM, REASONS, Decoder, Rejection
from evald.engine import Engine
from evald.events import Feedback, Impression
from evald.replay import bounded_lines
from evald.score.jsonl import read_jsonl
from evald.score.records import Rejection as ScoreRejection
from evald.score.trec import read_qrels, read_run

FUZZ = settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NOW_MS = 1_763_683_200_000  # the reference time the engine's clock gives (2025-11-21)

# ---------------------------------------------------------------- event records


@st.composite
def rfc3339(draw: Any) -> str:
    """A time around now, spelt in the RFC 3339 variants (case, offset, fraction)."""
    when = datetime(2025, 11, 21, tzinfo=timezone.utc) + timedelta(
        milliseconds=draw(st.integers(-(10**12), 10**12))
    )
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if draw(st.booleans()):
        text += "." + "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=1, max_size=9)))
    text += draw(st.sampled_from(["Z", "z", "+00:00", "-05:30", "", "+24:00"]))
    if draw(st.booleans()):
        text = text.replace("T", draw(st.sampled_from(["t", " ", "_"])))
    return text


@st.composite
def timestamps(draw: Any) -> Any:
    return draw(
        st.one_of(
            st.integers(-(2**64), 2**64),
            st.integers(NOW_MS - 10**10, NOW_MS + 10**10),
            rfc3339(),
            st.text(max_size=30),
            st.floats(),
            st.booleans(),
            st.none(),
        )
    )


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
ITEMS = st.lists(st.text(max_size=8), max_size=6)


@st.composite
def event_pairs(draw: Any) -> list[tuple[str, Any]]:
    """Key/value pairs of an impression- or feedback-like object, possibly broken."""
    pairs: list[tuple[str, Any]] = [
        ("request_id", draw(st.one_of(st.text(max_size=12), VALUES))),
        ("ts", draw(timestamps())),
    ]
    if draw(st.booleans()):
        pairs.append(("items", draw(st.one_of(ITEMS, VALUES))))
        if draw(st.booleans()):
            labels = st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=4)
            pairs.append(("labels", draw(st.one_of(labels, VALUES))))
    else:
        pairs.append(("item", draw(st.one_of(st.text(max_size=8), VALUES))))
        action = st.sampled_from(["click", "purchase", "judgment", "add_to_cart", "wink"])
        pairs.append(("action", draw(st.one_of(action, VALUES))))
        if draw(st.booleans()):
            pairs.append(("grade", draw(st.one_of(st.floats(-2, 5), VALUES))))
    if draw(st.booleans()):
        pairs.append(("kind", draw(st.sampled_from(["impression", "feedback", "other"]))))
    extra = st.lists(st.tuples(st.text(max_size=6), VALUES), max_size=2)
    pairs += draw(extra)
    pairs = draw(st.permutations(pairs))
    if pairs and draw(st.integers(0, 4)) == 0:  # a repeated key
        pairs.append((draw(st.sampled_from(pairs))[0], draw(VALUES)))
    return pairs


def encode(pairs: list[tuple[str, Any]], bom: bool, cut: int | None) -> bytes:
    body = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs) + "}"
    raw = body.encode("utf-8", errors="surrogatepass")
    if cut is not None:
        raw = raw[:cut]
    return (BOM if bom else b"") + raw


@st.composite
def records(draw: Any) -> bytes:
    return draw(
        st.one_of(
            st.builds(
                encode,
                event_pairs(),
                st.booleans(),
                st.one_of(st.none(), st.integers(0, 200)),
            ),
            st.binary(max_size=200),
            st.sampled_from([b"", b"null", b"[]", b"{}", b"{" * 5000, b'"\\ud800"', BOM]),
        )
    )


KINDS = st.one_of(st.none(), st.sampled_from(["impression", "feedback", "nonsense"]))


def fresh_engine() -> Engine:
    config = load_config({"window": "10m", "lateness": "1m", "limits": {"max_event_bytes": 400}})
    return Engine(config, clock=lambda: NOW_MS / 1000)


def check(outcome: object) -> None:
    if isinstance(outcome, Rejection):
        assert outcome.reason in REASONS and outcome.detail
        assert outcome.kind in ("impression", "feedback", "unknown")
        json.dumps(outcome.to_json())  # the rejected line / DLQ headers can be written
    else:
        assert isinstance(outcome, Impression | Feedback)
        assert 946_684_800_000 <= outcome.ts <= NOW_MS + 3_600_000


@FUZZ
@given(raws=st.lists(records(), max_size=8), kind=KINDS, per_record=st.lists(KINDS, max_size=8))
def test_the_engine_decoder_never_raises_and_every_reject_has_a_reason(raws, kind, per_record):
    one, batch = fresh_engine(), fresh_engine()
    outcomes = [one.feed(raw, kind=kind, offset=k) for k, raw in enumerate(raws)]
    for outcome in outcomes:
        check(outcome)
    rejected = dict(batch.feed_batch(raws, kinds=kind, offsets=list(range(len(raws)))))
    assert rejected == {k: o for k, o in enumerate(outcomes) if isinstance(o, Rejection)}
    assert one.stats.rejected == batch.stats.rejected and one.stats.events == batch.stats.events
    one.tick()
    one.drain()
    # one kind per record (the Kafka path feeds both topics of a partition in one batch)
    kinds = (per_record * len(raws))[: len(raws)] if per_record else None
    for position, rejection in fresh_engine().feed_batch(raws, kinds=kinds):
        check(rejection)
        assert 0 <= position < len(raws)


def repeats_a_key(raw: bytes) -> bool | None:
    """Reference: does any object of ``raw`` repeat a key (None: not JSON)?"""
    found: list[bool] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found.append(len({k for k, _ in pairs}) != len(pairs))
        return {}

    try:
        json.loads(raw, object_pairs_hook=hook)
    except (ValueError, RecursionError):
        return None
    return any(found)


def render(value: Any, colons: str | list[str]) -> str:
    """JSON text of nested tuples of pairs (objects, so keys may repeat) and plain values;
    the n-th key of an object is followed by ``colons[n % len(colons)]``."""
    styles = [colons] if isinstance(colons, str) else colons
    if isinstance(value, tuple):
        inner = ",".join(
            f"{json.dumps(k)}{styles[n % len(styles)]}{render(v, styles)}"
            for n, (k, v) in enumerate(value)
        )
        return "{" + inner + "}"
    return json.dumps(value)


@st.composite
def valid_records_maybe_repeating_a_key(draw: Any) -> str:
    """Impressions and feedback that validate, one key possibly repeated somewhere."""
    text = st.text(max_size=6)
    ts = st.integers(NOW_MS - 10**6, NOW_MS)
    labels = draw(st.lists(st.tuples(st.sampled_from(["m", "a", "s"]), text), max_size=3))
    extra = draw(st.lists(st.tuples(st.sampled_from(["x", "y"]), st.integers()), max_size=2))
    if draw(st.booleans()):
        top = [("request_id", draw(text)), ("ts", draw(ts)), ("items", draw(ITEMS))]
        top.append(("labels", tuple(labels)))
    else:
        top = [("request_id", draw(text)), ("ts", draw(ts)), ("item", draw(text))]
        top.append(("action", "click"))
    if draw(st.booleans()):
        top += [("u", tuple(extra)), *extra]  # unknown fields, a nested object
    top = draw(st.permutations(top))
    where = draw(st.sampled_from(["none", "top", "labels", "nested"]))
    if where == "top":
        top.append(draw(st.sampled_from(top)))
    elif where == "labels" and labels:
        i = [k for k, _ in top].index("labels") if ("labels", tuple(labels)) in top else None
        if i is not None:
            top[i] = ("labels", (*labels, labels[0]))
    elif where == "nested":
        top.append(("n", (("k", 1), ("k", draw(st.integers())))))
    styles = st.sampled_from([":", " : ", ":\n", ": ", "\t:", "\r\n:"])
    return render(tuple(top), draw(st.lists(styles, min_size=1, max_size=4)))


@FUZZ
@given(
    body=st.one_of(
        valid_records_maybe_repeating_a_key(),
        st.builds(render, event_pairs().map(tuple), st.just(":")),
    )
)
def test_duplicate_keys_are_found_exactly(body):
    """Accepted exactly when no object repeats a key, whatever the layout; the decoder's
    cheap key count (keys_surely_unique) must never let a repeated key through."""
    raw = body.encode("utf-8", errors="surrogatepass")
    decoder = Decoder(fresh_engine().config.limits, {"click": 1.0}, min_ts=0)
    got = decoder.decode(raw)
    rejected: list[tuple[int, Rejection]] = []
    batch = dict(decoder.decode_many([raw], None, rejected))  # its inlined fast path
    assert batch.get(0, dict(rejected).get(0)) == got
    repeated = repeats_a_key(raw)
    if isinstance(got, Impression | Feedback):
        assert repeated is False
    else:
        assert got.reason in REASONS
        if got.reason == "duplicate_key":
            assert repeated


# ---------------------------------------------------------------- replay's line reader


@FUZZ
@given(
    chunks=st.lists(
        st.one_of(st.binary(max_size=300), st.sampled_from([b"\n", b"\r\n", b"\r", BOM])),
        max_size=12,
    ),
    limit=st.integers(1, 200),
)
def test_the_replay_line_reader_never_raises_and_bounds_every_line(chunks, limit):
    data = b"".join(chunks)
    lines = list(bounded_lines(io.BytesIO(data), limit))
    assert sum(consumed for _, consumed, _ in lines) == len(data)
    for line, _, length in lines:
        assert len(line) <= max(limit, length) and len(line) <= limit + 1
        assert length > limit or len(line) == length


# ---------------------------------------------------------------- evald score's readers

LINE = st.one_of(
    st.binary(max_size=120),
    st.builds(
        lambda pairs, bom: encode(pairs, bom, None),
        st.lists(
            st.tuples(
                st.sampled_from(["qid", "ranking", "qrels", "scores", "x"]),
                st.one_of(VALUES, ITEMS, st.dictionaries(st.text(max_size=4), SCALARS)),
            ),
            max_size=5,
        ),
        st.booleans(),
    ),
)
TREC = st.lists(
    st.one_of(st.text(max_size=12), st.sampled_from(["q1", "Q0", "0", "1", "-1", "nan", "1e999"])),
    max_size=7,
).map(lambda parts: " ".join(parts).encode("utf-8", errors="surrogatepass"))


def check_score_rejections(rejections: list[ScoreRejection], lines: int) -> None:
    for rejection in rejections:
        assert rejection.reason and 1 <= rejection.line <= lines
        assert str(rejection).startswith("in:")


@FUZZ
@given(lines=st.lists(LINE, max_size=10))
def test_score_jsonl_reader_never_raises(lines):
    got = list(read_jsonl(lines, "in"))
    check_score_rejections([r for r in got if isinstance(r, ScoreRejection)], len(lines))


@FUZZ
@given(
    run=st.lists(st.one_of(TREC, st.binary(max_size=60)), max_size=10),
    qrels=st.lists(TREC, max_size=10),
)
def test_score_trec_readers_never_raise(run, qrels):
    _, run_rejections = read_run(run, "in")
    check_score_rejections(run_rejections, len(run))
    _, qrels_rejections = read_qrels(qrels, "in")
    check_score_rejections(qrels_rejections, len(qrels))


# ---------------------------------------------------------------- the settings loader

SECTIONS = st.sampled_from(["kafka", "topics", "daemon", "engine", "bogus", "KAFKA", ""])
FIELDS = st.sampled_from(
    [
        "bootstrap_servers",
        "session_timeout_ms",
        "impressions",
        "commit_interval_ms",
        "window",
        "max_event_lead",
        "min_event_time",
        "watermark_quorum",
        "limits",
        "group_id",
        "nope",
        "",
    ]
)
SETTING_TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["30m", "-1", "null", "[1, 2]", "{a: 1}", "2000-01-01", "1e999", "{", "~"]),
)


def load_or_reason(**kwargs: Any) -> None:
    try:
        got = load_settings(**kwargs)
    except SettingsError as exc:
        assert str(exc).strip()
    else:
        assert isinstance(got, Settings)


@FUZZ
@given(
    env=st.dictionaries(
        st.builds(lambda s, f: f"EVALD_{s}__{f}".upper(), SECTIONS, FIELDS),
        SETTING_TEXT,
        max_size=4,
    ),
    items=st.lists(
        st.builds(lambda s, f, v: f"{s}.{f}={v}", SECTIONS, FIELDS, SETTING_TEXT), max_size=4
    ),
    text=st.one_of(
        st.text(max_size=80),
        st.builds(lambda s, f, v: f"{s}:\n  {f}: {v}\n", SECTIONS, FIELDS, SETTING_TEXT),
    ),
)
def test_the_settings_loader_never_raises_anything_but_a_named_settings_error(env, items, text):
    env = {"EVALD_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9092", **env}
    try:
        flags = set_overrides(items)
    except SettingsError as exc:
        assert str(exc).startswith("--set ")
        flags = {}
    load_or_reason(environ=env, flags=flags)
    with tempfile.NamedTemporaryFile(
        "w", suffix=".yaml", delete=False, encoding="utf-8", errors="surrogatepass"
    ) as fh:
        fh.write(text)
    try:
        load_or_reason(file=fh.name, environ={"EVALD_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9092"})
    finally:
        os.unlink(fh.name)
