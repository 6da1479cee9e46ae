"""The A/B comparison the drill-down's seeded streams are read with (replayed in
tests/drilldown, through Kafka in tests/daemon): arm "control" against "treatment" in
5-minute windows, no bootstrap, on the reciprocal rank of 2-minute lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def ab_statistics(start: int = 0, **extra: Any) -> dict[str, Any]:
    """``engine.statistics`` with the one comparison ``ab`` from ``start`` (ms)."""
    comparison = {
        "name": "ab",
        "label": "arm",
        "control": "control",
        "treatments": ["treatment"],
        "start": start,
    }
    return {"window": "5m", "bootstrap_replicates": 0, **extra, "comparisons": [comparison]}


def ab_config(windows: Sequence[str] = ("5m", "1h"), **statistics: Any) -> dict[str, Any]:
    """The engine settings: segments arm and surface, ``windows``, and the comparison with
    ``statistics`` added to its settings."""
    return {
        "min_event_time": 0,
        "max_event_lead": None,
        "window": "2m",
        "lateness": "1m",
        "measures": "RR",
        "label_keys": ["arm", "surface"],
        "windows": list(windows),
        "retention": "6h",
        "statistics": ab_statistics(**statistics),
    }
