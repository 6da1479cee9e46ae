"""The click model of ``evald run`` through a kill -9 on Apache Kafka (chaos tier: three lives
of `evald run` take longer than a ``make test`` Kafka test may).

A first life consumes a third of the traffic and stops (SIGTERM); a second, given another third,
restores the partitions' click models from the checkpoints and is killed -9 at its first commit
holding results (after the checkpoints, before anything after them); a third restores again and
consumes everything. The examination curve it exports must equal, to the last digit, the one
of an uninterrupted engine fed every record (the oracle's), and the committed checkpoints must
carry the models. The fast equivalent over the in-memory Kafka, which fails when the state is
not restored, is tests/daemon/test_click_model_restore.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from kafka_harness import KafkaTools, wait_until
from kafka_instances import Instance, make_settings, names
from prometheus_client.parser import text_string_to_metric_families as parse_text
from replay_traffic import traffic
from test_kafka import committed_checkpoint

from evald.config import ClickModelConfig
from evald.engine import Engine

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]

PARTITIONS = (0, 1)
CLICKS = {"model": "pbm", "refit_every": 100}
EXTRA = ("--set", f"engine.click_model={json.dumps(CLICKS)}")


def exported(instance: Instance, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    status, text = instance.get("/metrics")
    assert status == 200
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in parse_text(text)
        for sample in family.samples
        if sample.name == name
    }


def test_kill_9_at_a_commit_leaves_the_examination_curve_of_an_uninterrupted_run(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    base = int(time.time() * 1000) - 30 * 60_000
    records = {p: traffic(seed=13, partition=p, n=900, base=base) for p in PARTITIONS}
    thirds = [
        {p: rows[len(rows) * k // 3 : len(rows) * (k + 1) // 3] for p, rows in records.items()}
        for k in range(3)
    ]
    kafka_tools.produce_rows(topics["impressions"], topics["feedback"], thirds[0])
    first = instances("a", extra=EXTRA)
    wait_until(lambda: first.lag_zero(2), 120, "the first life to consume its third")
    time.sleep(1.0)
    assert first.terminate() == 0
    kafka_tools.produce_rows(topics["impressions"], topics["feedback"], thirds[1])
    second = instances("a", extra=EXTRA, crash_at="committed")
    wait_until(lambda: second.proc.poll() is not None, 120, "the kill -9 at a commit")
    assert second.proc.returncode == -9
    config = make_settings(kafka_tools.bootstrap, unique).engine_config()
    config = config.model_copy(update={"click_model": ClickModelConfig(**CLICKS)})  # type: ignore[arg-type]
    restored = Engine(config)  # the click models the third life restores
    assert restored.clicks is not None
    for p in PARTITIONS:
        held = committed_checkpoint(kafka_tools, unique, p).state.click_model
        assert held is not None and "records" not in held, "a model past the inline limit"
        restored.clicks.load(p, held)
    assert any(row[4] for row in restored.clicks.debiased.rows())  # earlier lives scored some
    kafka_tools.produce_rows(topics["impressions"], topics["feedback"], thirds[2])
    last = instances("a", extra=EXTRA)
    wait_until(lambda: last.lag_zero(2), 120, "the last life to catch up")
    time.sleep(1.0)
    got = exported(last, "evald_click_examination")
    _, engine = kafka_tools.expected(config, topics["impressions"], topics["feedback"])
    want_debiased = debiased_beyond(engine, restored)
    assert all(any(v > 0 for v in part.values()) for part in want_debiased.values())

    def debiased() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        return {part: exported(last, f"evald_click_measure_{part}") for part in want_debiased}

    # the counters show what the last life's commits held: the commit after the end
    wait_until(lambda: debiased() == want_debiased, 60, "the debiased counters")
    for p in PARTITIONS:
        assert committed_checkpoint(kafka_tools, unique, p).state.click_model is not None, p
    assert last.terminate() == 0

    clicks = engine.clicks
    assert clicks is not None and all(m.fits >= 3 for m in clicks.models.values())
    want = examination_curve(engine)
    assert want and got == want


def examination_curve(engine: Engine) -> dict[tuple[tuple[str, str], ...], float]:
    """The ``evald_click_examination`` samples ``engine``'s click models give (labels ->
    value), for the ranks shown at least once."""
    assert engine.clicks is not None
    keys = list(engine.config.label_keys)
    return {
        tuple(sorted({**dict(zip(keys, labels, strict=True)), "rank": str(r + 1)}.items())): v
        for labels, curve, shown in engine.clicks.rows()
        for r, (v, n) in enumerate(zip(curve.tolist(), shown.tolist(), strict=True))
        if n > 0
    }


def debiased_beyond(
    engine: Engine, restored: Engine
) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Per part (``sum``, ``count``) the debiased series of what ``engine`` scored beyond the
    sums ``restored`` loaded: what a process restored from them counts itself, to the last
    digit (integers of 2^-32 apart)."""
    assert engine.clicks is not None and restored.clicks is not None
    keys = list(engine.config.label_keys)
    loaded = {(row[0], row[1]): row for row in restored.clicks.debiased.rows()}
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {"sum": {}, "count": {}}
    for row in engine.clicks.debiased.rows():
        labels = {**dict(zip(keys, row[0], strict=True)), "measure": row[1], "relevance": "pbm"}
        before = loaded.get((row[0], row[1]), (row[0], row[1], 0.0, 0.0, 0))
        for part, column in (("sum", 2), ("count", 4)):
            out[part][tuple(sorted(labels.items()))] = float(row[column] - before[column])
    return out
