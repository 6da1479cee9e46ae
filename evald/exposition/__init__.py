"""Prometheus exposition of an Engine: a series table, its collector, a registry, an encoder.

One job per module:

* :mod:`~evald.exposition.series`: the declarative table of the engine's series (name, type,
  help, labels, how to read it from the engine, its share of the series budget). A new series
  is one entry there, plus its row in docs/metrics-reference.md.
* :mod:`~evald.exposition.collector`: ``EngineCollector`` renders the table from one snapshot
  of the engine per scrape; ``ReadyCollector`` exports ``evald_ready``.
* :mod:`~evald.exposition.budget`: ``SeriesShape``, the worst-case series count of the
  settings, summed from the table; ``check_series_budget`` holds it against ``max_series``.
* :mod:`~evald.exposition.registry`: ``build_registry``, the private registry HTTP serves.
* :mod:`~evald.exposition.encoder`: ``Encoder``, byte-identical text / OpenMetrics rendering
  with a per-series prefix cache, independent of what is collected.
* :mod:`~evald.exposition.shared`: ``SingleFlight``, so concurrent scrapes share a rendering.

Series names, types and labels are listed in docs/metrics-reference.md.
"""

from __future__ import annotations

from evald.exposition.budget import SeriesShape, check_series_budget
from evald.exposition.collector import EngineCollector, ReadyCollector, Snapshot
from evald.exposition.encoder import Collector, Encoder, FrozenLabels
from evald.exposition.registry import build_registry
from evald.exposition.series import ENGINE_FAMILIES, SERIES, WINDOW_SERIES, Series
from evald.exposition.shared import SingleFlight

__all__ = [
    "ENGINE_FAMILIES",
    "SERIES",
    "WINDOW_SERIES",
    "Collector",
    "Encoder",
    "EngineCollector",
    "FrozenLabels",
    "ReadyCollector",
    "Series",
    "SeriesShape",
    "SingleFlight",
    "Snapshot",
    "build_registry",
    "check_series_budget",
]
