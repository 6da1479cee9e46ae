"""Ids that say nothing (docs/semantics.md, "Identifiers"): a blank request id or item id (empty,
or white space only) is ``empty_id``, in the same words and counted the same, on every path
that reads events: the native decoder one by one and in batches, a mapping's exact path, its
fast path (which leaves such a record to the exact one), the UBI preset, and ``evald replay``
of plain lines, OpenSearch ``_bulk`` files and search-hit dumps. A blank optional id (user,
event id) is none."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from evald.cli import main
from evald.config import load_config
from evald.decode import Decoder, Rejection
from evald.engine import Engine
from evald.events import Feedback, Impression
from evald.mapping import MappingDecoder, decoder_for, load_spec

NOW = 1_732_700_000_000
STAMP = "2024-11-27T09:33:20.000Z"  # NOW as UBI writes it
BLANKS = ["", " ", "\t\u3000"]
#: the words every reader gives after the field (input_rule.EMPTY_ID)
EMPTY_ID = "an id is empty or only white space"


def blank(text: str) -> bool:
    """The rule: empty, or white space only as ``str.isspace`` has it (input_rule.blank)."""
    return not text or text.isspace()


#: a team's own schema: nested paths, items as objects
OWN = {
    "kind": {"field": "/type", "impression": "serve", "feedback": "act"},
    "impression": {
        "request_id": "/req/id",
        "time": {"path": "/at", "format": "epoch_ms"},
        "items": {"path": "/hits", "id": "/doc"},
        "user_id": ["/who"],
    },
    "feedback": {
        "request_id": "/req/id",
        "time": {"path": "/at", "format": "epoch_ms"},
        "item": "/doc",
        "action": "/what",
        "event_id": "/eid",
        "actions": {"click": 1},
    },
}


def native(field: str, bad: str) -> tuple[dict[str, Any], str]:
    """(record, where its detail says the blank id is) in the native schema."""
    if field == "list":
        return {"request_id": bad, "ts": NOW, "items": ["a", "b"]}, "request_id"
    if field == "served":
        return {"request_id": "r", "ts": NOW, "items": ["a", bad]}, "items.1"
    if field == "feedback":
        return {"request_id": bad, "ts": NOW, "item": "a", "action": "click"}, "request_id"
    return {"request_id": "r", "ts": NOW, "item": bad, "action": "click"}, "item"


def ubi(field: str, bad: str) -> tuple[dict[str, Any], str]:
    """The same in OpenSearch UBI records (query records, events)."""
    query = {"query_id": "q", "timestamp": STAMP, "query_response_hit_ids": ["a", "b"]}
    event = {
        "query_id": "q",
        "timestamp": STAMP,
        "action_name": "click",
        "event_attributes": {"object": {"object_id": "a"}, "position": {"ordinal": 0}},
    }
    if field == "list":
        return {**query, "query_id": bad}, "/query_id"
    if field == "served":
        return {**query, "query_response_hit_ids": ["a", bad]}, "/query_response_hit_ids/1"
    if field == "feedback":
        return {**event, "query_id": bad}, "/query_id"
    event["event_attributes"]["object"]["object_id"] = bad  # type: ignore[index]
    return event, "/event_attributes/object/object_id"


def own(field: str, bad: str) -> tuple[dict[str, Any], str]:
    """The same in :data:`OWN`."""
    serve = {"type": "serve", "req": {"id": "r"}, "at": NOW, "hits": [{"doc": "a"}, {"doc": "b"}]}
    act = {"type": "act", "req": {"id": "r"}, "at": NOW, "doc": "a", "what": "click"}
    if field == "list":
        return {**serve, "req": {"id": bad}}, "/req/id"
    if field == "served":
        return {**serve, "hits": [{"doc": "a"}, {"doc": bad}]}, "/hits/1"
    if field == "feedback":
        return {**act, "req": {"id": bad}}, "/req/id"
    return {**act, "doc": bad}, "/doc"


SCHEMAS: dict[str, Callable[[str, str], tuple[dict[str, Any], str]]] = {
    "native": native,
    "ubi": ubi,
    "own": own,
}
FIELDS = ["list", "served", "feedback", "item"]


def decoder(schema: str, tmp_path: Path) -> Decoder | MappingDecoder:
    config = load_config({})
    if schema == "native":
        return Decoder(config.limits, config.action_grades)
    if schema == "ubi":
        found = decoder_for("ubi", config)
        assert found is not None
        return found
    path = tmp_path / "own.json"
    path.write_text(json.dumps(OWN))
    spec = load_spec(str(path))
    assert spec is not None
    return MappingDecoder(spec, config.limits)


def paths(dec: Decoder | MappingDecoder, raw: bytes) -> dict[str, Any]:
    """What every decoding path makes of ``raw``."""
    batch: list[tuple[int, Rejection]] = []
    events = list(dec.decode_many([raw], None, batch, NOW))
    got: dict[str, Any] = {"decode": dec.decode(raw, None, NOW), "decode_many": (events, batch)}
    if isinstance(dec, MappingDecoder):
        got["exact"] = dec.decode_exact(raw, None, NOW)
        got["fast"] = dec.decode_fast(raw, None, NOW)
    engine = Engine(load_config({}), clock=lambda: NOW / 1000, decoder=dec)
    got["engine"] = (engine.feed(raw), dict(engine.stats.rejected))
    return got


@pytest.mark.parametrize("bad", BLANKS, ids=repr)
@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_a_blank_id_is_empty_id_on_every_decoding_path(
    schema: str, field: str, bad: str, tmp_path: Path
) -> None:
    record, where = SCHEMAS[schema](field, bad)
    raw = json.dumps(record).encode()
    got = paths(decoder(schema, tmp_path), raw)
    detail = f"{where}: {EMPTY_ID}"
    kind = "impression" if field in ("list", "served") else "feedback"
    want = Rejection("empty_id", detail, raw, kind)
    assert got["decode"] == want
    assert got["decode_many"] == ([], [(0, want)])
    if "exact" in got:
        assert got["exact"] == want
        assert got["fast"] is None  # not an event: the exact path words why
    rejection, counted = got["engine"]
    assert rejection == want
    assert counted["empty_id"] == 1 and sum(counted.values()) == 1


def replay_rejections(
    lines: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], *mapping: str
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    path = tmp_path / "in.ndjson"
    path.write_text("".join(line + "\n" for line in lines))
    rejected = tmp_path / "rejected.jsonl"
    argv = [str(path), *mapping, "--rejected", str(rejected), "--progress", "never"]
    assert main(["replay", *argv, "--format", "json"]) == 0
    counts = json.loads(capsys.readouterr().out)["rejected"]
    lines_out = [json.loads(x) for x in rejected.read_text().splitlines()]
    return counts, [(x["reason"], x["detail"]) for x in lines_out]


@pytest.mark.parametrize("shape", ["plain", "bulk", "hits"])
@pytest.mark.parametrize("schema", ["native", "ubi"])
def test_replay_rejects_every_blank_id_as_empty_id_in_every_file_shape(
    schema: str, shape: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = {"list": "ubi_queries", "served": "ubi_queries"}
    records, wants = [], []
    for field in FIELDS:
        for bad in BLANKS:
            record, where = SCHEMAS[schema](field, bad)
            records.append((index.get(field, "ubi_events"), record))
            wants.append(("empty_id", f"{where}: {EMPTY_ID}"))
    if shape == "plain":
        lines = [json.dumps(doc) for _, doc in records]
    elif shape == "bulk":
        lines = []
        for n, (name, doc) in enumerate(records):
            lines += [json.dumps({"index": {"_index": name, "_id": f"id-{n}"}}), json.dumps(doc)]
    else:
        lines = [
            json.dumps({"_index": name, "_id": f"id-{n}", "_score": 1.0, "_source": doc})
            for n, (name, doc) in enumerate(records)
        ]
    mapping = ("--mapping", "ubi") if schema == "ubi" else ()
    counts, rejected = replay_rejections(lines, tmp_path, capsys, *mapping)
    assert counts == {"empty_id": len(wants)}
    assert rejected == wants


def test_the_id_pattern_and_blank_agree_on_every_character() -> None:
    """pydantic-core's regex (the models), Python's (``evald score``'s chunked reader) and
    ``blank`` (the fast paths, the optional ids) are one rule: they agree on every one-character
    id."""
    from evald.score.jsonl_chunks import read_chunk

    config = load_config({})
    dec = Decoder(config.limits, config.action_grades)
    for code in [*range(0x3000 + 1), *range(0xFEFF, 0xFF00)]:
        if 0xD800 <= code < 0xE000:
            continue
        rid = chr(code)
        got = dec.decode(json.dumps({"request_id": rid, "ts": NOW, "items": []}).encode())
        assert isinstance(got, Rejection) == blank(rid), hex(code)
        line = json.dumps({"qid": rid, "ranking": [], "qrels": {}}).encode()
        assert bool(read_chunk([line], 0, "f").rejections) == blank(rid), hex(code)


@pytest.mark.parametrize("bad", BLANKS, ids=repr)
def test_a_blank_user_id_is_no_user_on_every_path(bad: str, tmp_path: Path) -> None:
    """A blank user id is none: the list is its own cluster (an id shared by every blank
    one would make one user of them all), and a mapping reads its next source instead."""
    config = load_config({})
    native_raw = json.dumps({"request_id": "r", "ts": NOW, "items": ["a"], "user_id": bad})
    ubi_doc = {"query_id": "q", "timestamp": STAMP, "user_id": bad, "client_id": "c-7"}
    own_doc, _ = own("served", "b")
    mapped = decoder("ubi", tmp_path), decoder("own", tmp_path)
    for dec, raw, user in (
        (mapped[0], json.dumps(ubi_doc), "c-7"),
        (mapped[0], json.dumps({**ubi_doc, "client_id": bad}), None),
        (mapped[1], json.dumps({**own_doc, "who": bad}), None),
    ):
        exact = dec.decode_exact(raw.encode(), None, NOW)
        assert isinstance(exact, Impression) and exact.user_id == user
        assert dec.decode_fast(raw.encode(), None, NOW) == exact
    results: list[Any] = []
    engine = Engine(config, clock=lambda: NOW / 1000, on_result=results.append)
    assert isinstance(engine.feed(native_raw.encode()), Impression)
    engine.drain()
    engine.tick()
    (result,) = results
    assert result.cluster == 0


@pytest.mark.parametrize("bad", BLANKS, ids=repr)
def test_a_blank_event_id_does_not_make_feedback_a_duplicate(bad: str) -> None:
    """Two clicks with a blank event id are two clicks, as two without one are; with the same
    named event id the second is a duplicate."""
    config = load_config({})
    engine = Engine(config, clock=lambda: NOW / 1000)
    engine.feed(json.dumps({"request_id": "r", "ts": NOW, "items": ["a", "b"]}).encode())
    for item in ("a", "b"):
        click = {"request_id": "r", "ts": NOW + 1, "item": item, "action": "click", "event_id": bad}
        assert isinstance(engine.feed(json.dumps(click).encode()), Feedback)
    assert engine.stats.unattributed["duplicate"] == 0


OFFLINE = [
    ({"qid": "{bad}", "ranking": ["a"], "qrels": {}}, '"qid"'),
    ({"qid": "q", "ranking": ["a", "{bad}"], "qrels": {}}, '"ranking"[1]'),
    ({"qid": "q", "ranking": ["a"], "qrels": {"a": 1, "{bad}": 2}}, '"qrels" key {json}'),
]


@pytest.mark.parametrize("bad", BLANKS, ids=repr)
@pytest.mark.parametrize("case", range(len(OFFLINE)))
def test_evald_score_refuses_a_blank_qid_or_docid_on_every_reader(
    case: int, bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON Lines of ``evald score``: the exact reader words it, the two fast ones (per line,
    per chunk) leave it to the exact one; the command reports the line."""
    from evald.score.jsonl import accept_line, parse_line
    from evald.score.jsonl_chunks import read_chunk

    shape, where = OFFLINE[case]
    line = json.dumps(shape).replace("{bad}", json.dumps(bad)[1:-1])
    want = f"{where.replace('{json}', json.dumps(bad))}: {EMPTY_ID}"
    assert parse_line(line) == want
    assert accept_line(line.encode()) is None
    good = json.dumps({"qid": "g", "ranking": ["a"], "qrels": {"a": 1}})
    chunk = read_chunk([good.encode(), line.encode()], 0, "f")
    assert chunk.qids == ["g"] and [r.reason for r in chunk.rejections] == [want]
    path = tmp_path / "in.jsonl"
    path.write_text(good + "\n" + line + "\n")
    assert main(["score", str(path)]) == 1
    assert f"{path}:2: {want}" in capsys.readouterr().err


@pytest.mark.parametrize("bad", BLANKS, ids=repr)
@pytest.mark.parametrize("field", ["query", "served"])
def test_evald_judge_refuses_a_blank_query_or_served_id(
    field: str, bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"query": "q", "served": ["a", "b"], "clicked": ["a"]}
    line = {**good, "query": bad} if field == "query" else {**good, "served": ["a", bad]}
    log = tmp_path / "s.jsonl"
    log.write_text(json.dumps(good) + "\n" + json.dumps(line) + "\n")
    assert main(["judge", str(log), "--qrels", str(tmp_path / "j.qrels")]) == 1
    where = '"query"' if field == "query" else '"served"[1]'
    assert f"{log}:2: {where}: {EMPTY_ID}" in capsys.readouterr().err
