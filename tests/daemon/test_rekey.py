"""The repartition stage's pure parts: internal topic names, Kafka's default partitioner, and
the request id read with each mapping."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from evald.daemon.names import internal_topic
from evald.daemon.repartition.rekey import (
    RequestIdReader,
    Unkeyable,
    murmur2,
    partition_for,
)
from evald.daemon.repartition.stage import main_stage_settings
from evald.daemon.settings import load_settings

#: Utils.murmur2 of Kafka's Java client on these strings (its UtilsTest), signed 32-bit
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_equals_the_java_client() -> None:
    assert {key: murmur2(key) for key in JAVA_MURMUR2} == JAVA_MURMUR2


def test_murmur2_equals_kafka_python_on_random_keys_of_every_length() -> None:
    rng = random.Random(5)
    for length in range(0, 70):
        for _ in range(20):
            key = rng.randbytes(length)
            unsigned = kafka_python_murmur2(key)
            assert murmur2(key) == (unsigned - (1 << 32) if unsigned >= 1 << 31 else unsigned)


def test_partition_is_kafkas_default_partitioner() -> None:
    """``toPositive(murmur2(key)) % n``: as kafka-python's DefaultPartitioner picks it."""
    rng = random.Random(6)
    for _ in range(500):
        key = f"req-{rng.getrandbits(48):x}".encode()
        n = rng.randint(1, 64)
        assert partition_for(key, n) == (kafka_python_murmur2(key) & 0x7FFFFFFF) % n
        assert partition_for(key, n) == partition_for(key, n)  # stable
    # a key whose hash is negative still lands in range (toPositive, not abs)
    assert murmur2(b"21") < 0 and 0 <= partition_for(b"21", 7) < 7


def test_internal_topic_names_and_the_main_stage_reads_them() -> None:
    assert internal_topic("evald-ubi", "ubi_queries") == "evald-ubi.ubi_queries.evald-repartition"
    settings = load_settings(environ={}, flags={"input": {"repartition": True}})
    main = main_stage_settings(settings)
    assert main.topics.impressions == "evald.evald.impressions.evald-repartition"
    assert main.topics.feedback == "evald.evald.feedback.evald-repartition"
    assert (main.topics.results, main.topics.dlq) == (settings.topics.results, "evald.dlq")
    assert main.topics.checkpoint_topic == settings.topics.checkpoint_topic


def test_native_request_id_for_both_kinds() -> None:
    reader = RequestIdReader("evald")
    assert reader.key(b'{"request_id":"r1","ts":1,"items":[]}', "impression") == b"r1"
    assert reader.key(b'\xef\xbb\xbf{"request_id":"r\\u00e9"}', "feedback") == "ré".encode()
    # nothing else is validated: the engine decodes the record in full later
    assert reader.key(b'{"request_id":"r2","ts":"not a time"}', "feedback") == b"r2"


def test_ubi_request_id_is_the_query_id() -> None:
    reader = RequestIdReader("ubi")
    query = b'{"query_id":"q-1","client_id":"c-9","timestamp":"2026-01-01T00:00:00Z"}'
    assert reader.key(query, "impression") == b"q-1"
    event = b'{"action_name":"click","query_id":"q-1","client_id":"c-9"}'
    assert reader.key(event, "feedback") == b"q-1"


def test_a_mapping_file_with_a_nested_request_id(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    spec = {
        "impression": {
            "request_id": "/ctx/search id",
            "time": {"path": "/t", "format": "epoch_s"},
            "items": "/hits",
        }
    }
    path.write_text(yaml.safe_dump(spec))
    reader = RequestIdReader(str(path))
    assert reader.key(b'{"ctx":{"search id":"s1"}}', "impression") == b"s1"
    assert reader.key(b'{"ctx":{}}', "impression") == Unkeyable(
        "missing_field", "/ctx/search id: missing"
    )
    assert reader.key(b"{}", "feedback") == Unkeyable(
        "unknown_kind", "the mapping has no feedback section"
    )


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "invalid_json"),
        (None, "invalid_json"),
        (b"{nope", "invalid_json"),
        (b"NaN", "invalid_json"),
        (b"[1]", "not_an_object"),
        (b'"r1"', "not_an_object"),
        (b"{}", "missing_field"),
        (b'{"request_id":null}', "missing_field"),
        (b'{"request_id":7}', "wrong_type"),
        (b'{"request_id":["r1"]}', "wrong_type"),
    ],
)
def test_unreadable_request_ids_have_the_engines_reasons(raw: bytes | None, reason: str) -> None:
    got = RequestIdReader("evald").key(raw, "impression")
    assert isinstance(got, Unkeyable) and got.reason == reason
    assert got.detail


def test_the_documented_conventions() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    daemon, design = (docs / "daemon.md").read_text(), (docs / "design.md").read_text()
    assert f"`{internal_topic('<group_id>', '<topic>')}`" in daemon
    assert "`(murmur2(key) & 0x7fffffff) % n`" in design
    mapping = (docs / "mapping.md").read_text()
    event = b'{"action_name": "click", "client_id": "c-9"}'
    got = RequestIdReader("ubi").key(event, "feedback")
    assert got == Unkeyable("missing_field", "/query_id: missing")
    assert f"`evald-reason: {got.reason}`" in mapping and f"`evald-detail: {got.detail}`" in mapping
