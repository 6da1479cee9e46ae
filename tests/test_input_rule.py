"""The input rule in its one home: the repeated key and the byte-order mark get the same verdict
from the event decoder and `evald score`'s JSONL reader, which both read it from input_rule.py."""

from __future__ import annotations

import pytest

from evald.decode import Decoder, Rejection
from evald.events import Limits
from evald.input_rule import BOM, BOM_TEXT, duplicate_key, repeated_key
from evald.score.jsonl import parse_line
from evald.score.records import Query


def decoder() -> Decoder:
    return Decoder(Limits(), {"click": 1.0}, min_ts=0, max_lead=None)


def test_the_first_repeated_key_of_an_object() -> None:
    assert repeated_key([("a", 1), ("b", 2), ("a", 3), ("b", 4)]) == "a"
    assert repeated_key([("a", 1), ("b", 2)]) is None
    assert BOM.decode("utf-8") == BOM_TEXT


@pytest.mark.parametrize(
    ("event", "line", "key"),
    [
        ('"ts": 1, "ts": 2', '"qid": 1, "qid": 2', ("ts", "qid")),
        ('"labels": {"arm": "a", "arm": "b"}', '"qrels": {"d": 1, "d": 0}', ("arm", "d")),
        ('"x": {"k": 1, "\\u006b": 2}', '"x": {"k": 1, "\\u006b": 2}', ("k", "k")),
    ],
)
def test_a_repeated_key_is_rejected_naming_it_by_the_decoder_and_by_score(
    event: str, line: str, key: tuple[str, str]
) -> None:
    raw = ('{"request_id": "r", "ts": 5, "items": ["a"], ' + event + "}").encode()
    rejected = decoder().decode(raw)
    assert isinstance(rejected, Rejection) and rejected.reason == "duplicate_key"
    assert duplicate_key(raw) == key[0] and repr(key[0]) in rejected.detail
    text = '{"qid": "q", "ranking": ["d"], "qrels": {"d": 1}, ' + line + "}"
    assert parse_line(text) == f'duplicate key "{key[1]}"'


def test_a_leading_byte_order_mark_is_ignored_by_both_and_only_a_leading_one() -> None:
    raw = b'{"request_id": "r", "ts": 5, "items": ["a"]}'
    assert not isinstance(decoder().decode(BOM + raw), Rejection)
    assert isinstance(decoder().decode(b" " + BOM + raw), Rejection)
    from evald.score.jsonl import read_line

    line = (BOM_TEXT + '{"qid": "q", "ranking": ["d"], "qrels": {"d": 1}}').encode()
    assert isinstance(read_line(line, 1, "f"), Query)
