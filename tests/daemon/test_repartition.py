"""The repartition stage's counters on /metrics, documented where every series is."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from evald.daemon.repartition.stage import RepartitionCollector, RepartitionStats

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_collector_exposes_copies_and_rejections_per_topic() -> None:
    stats = RepartitionStats()
    stats.repartitioned.update({"ubi_queries": 7, "ubi_events": 3})
    stats.rejected.update({("ubi_events", "missing_field"): 2})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RepartitionCollector(stats))
    text = generate_latest(registry).decode()
    assert 'evald_repartitioned_records_total{topic="ubi_queries"} 7.0' in text
    assert 'evald_repartitioned_records_total{topic="ubi_events"} 3.0' in text
    assert (
        'evald_repartition_rejected_records_total{reason="missing_field",topic="ubi_events"} 2.0'
        in text
    )


def test_the_series_are_documented() -> None:
    reference = (DOCS / "metrics-reference.md").read_text()
    contract = (DOCS / "architecture.md").read_text()
    for name in ("evald_repartitioned_records_total", "evald_repartition_rejected_records_total"):
        assert f"`{name}`" in reference and f"`{name}`" in contract
