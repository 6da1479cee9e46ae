"""`evald run --mapping ubi` on the real Kafka-protocol test broker: UBI query and event
records give exactly the results one engine gives on the equivalent native records.

The native records come from the simulator; each is rewritten to UBI (same key, partition and
record timestamp) on a second pair of topics, with UBI actions that judge nothing
(``on_search``, ``product_hover``) mixed in. The daemon runs as its own process, stopped by PID.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka_harness import ENGINE, KafkaTools, wait_until
from kafka_instances import Instance, names

from evald.config import load_config
from evald.events import format_timestamp

pytestmark = pytest.mark.kafka


def to_ubi(value: bytes, kind: str, noise: int) -> list[bytes]:
    """The UBI form of one native record, plus ``noise`` events UBI sends that judge nothing."""
    event = json.loads(value)
    when = format_timestamp(event["ts"])
    if kind == "impression":
        query = {
            "application": "shop",
            "query_id": event["request_id"],
            "client_id": event.get("user_id", "c"),
            "user_query": event.get("query"),
            "timestamp": when,
            "query_response_hit_ids": event["items"],
            "query_attributes": event.get("labels", {}),
        }
        return [json.dumps(query).encode()]
    click = {
        "application": "shop",
        "action_name": event["action"],
        "query_id": event["request_id"],
        "timestamp": when,
        "event_attributes": {
            "object": {"object_id": event["item"], "object_id_field": "sku"},
            "position": {"ordinal": event.get("position")},
        },
    }
    hover = {**click, "action_name": ("on_search", "product_hover")[noise % 2]}
    return [json.dumps(click).encode()] + [json.dumps(hover).encode()] * (noise % 3 == 0)


def produce_ubi(tools: KafkaTools, records: list, topic: str, kind: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=tools.bootstrap, linger_ms=10)
    try:
        for n, record in enumerate(records):
            for value in to_ubi(record.value, kind, n):
                producer.send(
                    topic,
                    key=record.key,
                    value=value,
                    partition=record.partition,
                    timestamp_ms=record.timestamp,
                )
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def scrape(run: Instance) -> str:
    status, text = run.get("/metrics")
    return text if status == 200 else ""


def total(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name)] in " {"
    )


def test_run_with_the_ubi_mapping_equals_the_native_engine(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    native = {"impressions": f"imp-n-{unique}", "feedback": f"fb-n-{unique}"}
    topics = names(unique)  # evald reads the UBI pair
    ubi = {"impressions": topics["impressions"], "feedback": topics["feedback"]}
    kafka_tools.create({**{t: 2 for t in native.values()}, **{t: 2 for t in ubi.values()}})
    kafka_tools.produce_sim(
        native["impressions"], native["feedback"], events=3000, seed=7, clean=True
    )
    for kind, key in (("impression", "impressions"), ("feedback", "feedback")):
        produce_ubi(kafka_tools, kafka_tools.read(native[key]), ubi[key], kind)
    expected, _ = kafka_tools.expected(
        load_config(ENGINE), native["impressions"], native["feedback"]
    )
    assert len(expected) > 100, "the reference finalized too little: the data is too short"
    for doc in expected.values():  # the preset reads UBI's application as a label
        doc["labels"] = {**doc["labels"], "application": "shop"}

    results, dlq = topics["results"], topics["dlq"]
    run = instances(extra=("--mapping", "ubi"))
    try:

        def results_done() -> dict[str, list[dict[str, Any]]] | None:
            got: dict[str, list[dict[str, Any]]] = {}
            for record in kafka_tools.read(results):
                doc = json.loads(record.value)
                got.setdefault(doc["request_id"], []).append(doc)
            return got if len(got) >= len(expected) else None

        got = wait_until(results_done, 120, "the daemon's results")
        text = wait_until(
            lambda: (t := scrape(run)) and total(t, "evald_feedback_skipped_total") > 0 and t,
            30,
            "the skipped counter on /metrics",
        )
    finally:
        returncode = run.terminate() if run.proc.poll() is None else run.proc.returncode
    assert returncode == 0, run.log_path.read_text()[-2000:]
    assert set(got) == set(expected)
    for request_id, docs in got.items():
        assert all(doc == expected[request_id] for doc in docs), request_id
    assert total(text, "evald_rejected_total") == 0
    skipped = [line for line in text.splitlines() if line.startswith("evald_feedback_skipped")]
    assert any('action="on_search"' in line for line in skipped), skipped
    assert kafka_tools.read(dlq) == []


def test_run_takes_the_event_time_from_the_kafka_record_timestamp(
    kafka_tools: KafkaTools, unique: str, tmp_path: Path, instances: Callable[..., Instance]
) -> None:
    """``time: {source: record}``: UBI records without a ``timestamp`` field, the time only in
    the Kafka record; results equal one engine's over native records carrying those times."""
    from kafka import KafkaProducer

    from evald.engine import Engine

    start = 1_714_564_800_000  # 2024-05-01T12:00:00Z
    topics = names(unique)
    results, dlq = topics["results"], topics["dlq"]
    kafka_tools.create({**{t: 1 for t in topics.values()}, results: 1})
    native: list[tuple[str, int, dict[str, Any]]] = []  # (kind, record timestamp, event)
    ubi: list[tuple[str, int, dict[str, Any]]] = []
    for n in range(60):  # 10 minutes of event time, in time order
        at, rid, labels = start + n * 10_000, f"q{n}", {"model": f"m{n % 2}"}
        items = ["a", "b", "c"]
        native.append(
            ("impression", at, {"request_id": rid, "ts": at, "items": items, "labels": labels})
        )
        ubi.append(
            (
                "impression",
                at,
                {"query_id": rid, "query_response_hit_ids": items, "query_attributes": labels},
            )
        )
        if n % 2 == 0:
            attributes = {"object": {"object_id": "b"}, "position": {"ordinal": 1}}
            click = {
                "request_id": rid,
                "ts": at + 3000,
                "item": "b",
                "action": "click",
                "position": 1,
            }
            native.append(("feedback", at + 3000, click))
            ubi.append(
                (
                    "feedback",
                    at + 3000,
                    {"query_id": rid, "action_name": "click", "event_attributes": attributes},
                )
            )
        if n % 3 == 0:  # an action that judges nothing: skipped
            ubi.append(("feedback", at + 4000, {"query_id": rid, "action_name": "product_hover"}))
    producer = KafkaProducer(bootstrap_servers=kafka_tools.bootstrap, linger_ms=10)
    try:
        for kind, at, record in ubi:
            topic = topics["impressions" if kind == "impression" else "feedback"]
            producer.send(topic, value=json.dumps(record).encode(), partition=0, timestamp_ms=at)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)
    reference: list[Any] = []
    # each event confirms its time: 90 events close most of the 60 impressions (the subject
    # here is where the time comes from, not the watermark's blocks: tests/join/test_clock.py)
    every_event = ("--set", "engine.watermark_quorum=1")
    engine = Engine(load_config({**ENGINE, "watermark_quorum": 1}), on_result=reference.append)
    for kind, _at, event in native:
        engine.feed(json.dumps(event).encode(), kind=kind)
    engine.tick()
    expected = {r.request_id: r.to_json() for r in reference}
    assert len(expected) > 40, "the reference finalized too little"
    mapping = tmp_path / "record-time.yaml"
    record_time = "{source: record, path: null, format: null}"
    mapping.write_text(
        f"extends: ubi\nimpression:\n  time: {record_time}\nfeedback:\n  time: {record_time}\n"
    )

    run = instances(extra=("--mapping", str(mapping), *every_event))
    try:

        def results_done() -> dict[str, dict[str, Any]] | None:
            got = {}
            for record in kafka_tools.read(results):
                doc = json.loads(record.value)
                got[doc["request_id"]] = doc
            return got if set(expected) <= set(got) else None

        got = wait_until(results_done, 120, "the daemon's results")
        text = wait_until(
            lambda: (t := scrape(run)) and total(t, "evald_feedback_skipped_total") >= 20 and t,
            30,
            "the skipped counter on /metrics",
        )
    finally:
        returncode = run.terminate() if run.proc.poll() is None else run.proc.returncode
    assert returncode == 0, run.log_path.read_text()[-2000:]
    for request_id, doc in expected.items():
        assert got[request_id] == doc, request_id
    # the result times are the record timestamps: nothing in the values carries a time
    assert got["q7"]["ts"] == format_timestamp(start + 70_000)
    assert got["q0"]["measures"]["RR"] == 0.5 and got["q1"]["measures"]["RR"] == 0.0
    assert total(text, "evald_rejected_total") == 0
    assert total(text, "evald_feedback_skipped_total") == 20
    assert kafka_tools.read(dlq) == []
