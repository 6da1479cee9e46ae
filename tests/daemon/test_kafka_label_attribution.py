"""The drop attribution over a label that is not a segment key, through `evald run` on Apache
Kafka with a kill -9 (the chaos tier: about a minute of Kafka; the engine-level restore is
tested at three cut points in tests/drilldown/test_labels.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from ab_comparison import ab_statistics
from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import Instance, names
from label_stream import events

from evald.config import EngineConfig

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]

BASE = 1_700_002_800_000  # a whole hour, in the past
STATISTICS = ab_statistics(BASE)
EXTRA = (
    "--set",
    f"engine.statistics={json.dumps(STATISTICS)}",
    "--set",
    'engine.label_keys=["arm", "surface"]',
    "--set",
    "engine.measures=RR",
    "--set",
    "engine.drilldown.label_capacity=16",  # the session ids purge the label summaries
)


def rows(seed: int) -> list[tuple[str, int, bytes]]:
    """The stream of tests/drilldown/test_label_attribution.py (device=android carries the
    treatment's drop; a session id new on every list), an hour from ``BASE``, then impressions
    of no arm 20 minutes on, so the watermark passes every window with data."""
    out = []
    for line in events(seed, spread=False):
        doc = json.loads(line)
        doc["ts"] += BASE
        kind = "impression" if "items" in doc else "feedback"
        out.append((kind, doc["ts"], json.dumps(doc).encode()))
    quorum = EngineConfig.model_fields["watermark_quorum"].default
    ts = max(at for _, at, _ in out) + 1_200_000
    for i in range(2 * quorum):
        tail = {"request_id": f"tail-{i}", "ts": ts, "items": ["x"], "labels": {"arm": "none"}}
        out.append(("impression", ts, json.dumps(tail).encode()))
    return out


def page(inst: Instance) -> dict[str, Any] | None:
    """GET /queries once its attribution names the drops of both surfaces (None before)."""
    status, text = inst.get("/queries?k=1000")
    if status != 200:
        return None
    doc: dict[str, Any] = json.loads(text)
    drops = [r for r in doc.get("attribution", []) if r["against"] == "control"]
    return doc if len(drops) == 2 and all(r["explanations"] for r in drops) else None


def test_kill_9_the_label_attribution_comes_back_exactly(
    broker: Broker, kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    kafka_tools.produce_rows(topics["impressions"], topics["feedback"], {0: rows(27)})
    first = instances("a", extra=EXTRA)
    wait_until(lambda: first.lag_zero(1), 180, "the first instance to consume everything")

    def quiet() -> float | None:  # results stopped moving: every commit is in
        before = first.metric("evald_results_produced_total")
        time.sleep(1.0)
        return before if first.metric("evald_results_produced_total") == before else None

    wait_until(quiet, 60, "the results to stop moving")
    before = wait_until(lambda: page(first), 60, "the attribution of both surfaces")
    for record in (r for r in before["attribution"] if r["against"] == "control"):
        first_one = record["explanations"][0]
        assert (first_one["dimension"], first_one["value"]) == ("device", "android"), record
    first.kill()

    second = instances("a", extra=EXTRA)
    wait_until(lambda: second.lag_zero(1), 120, "the restarted instance to catch up")
    # the label summaries came back from the snapshot and the results after it: the same
    # explanations, to the last digit of every explanatory power and surprise
    wait_until(lambda: page(second) == before, 60, "the same /queries page")
    assert second.terminate() == 0
