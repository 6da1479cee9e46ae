"""The registry ``/metrics`` serves: the engine collector and its standard companions.

:func:`build_registry` puts the engine collector, ``evald_ready``, the process and platform
collectors and any ``extra`` collectors (the Kafka daemon's ``DaemonCollector``) on one private
``CollectorRegistry``; ``evald.http.MetricsServer`` serves it through the
:class:`~evald.exposition.encoder.Encoder`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.registry import CollectorRegistry

from evald.exposition.collector import EngineCollector, ReadyCollector
from evald.exposition.encoder import Collector

if TYPE_CHECKING:
    from evald.engine import Engine

__all__ = ["build_registry"]


def build_registry(
    engine: Engine | None,
    *,
    lock: AbstractContextManager[Any] | None = None,
    ready: Callable[[], object] | None = None,
    extra: Iterable[Collector] = (),
    process: bool = True,
) -> tuple[CollectorRegistry, EngineCollector]:
    """A private registry with the engine collector and the standard companions.

    ``ready`` adds ``evald_ready`` (leave it out when an ``extra`` collector exports it, as the
    Kafka daemon's does); ``extra`` collectors (the daemon's series) go on the same registry;
    ``process`` adds prometheus_client's process, platform and GC collectors. Returns the
    registry and the engine collector (to swap ``collector.engine`` later).
    """
    registry = CollectorRegistry(auto_describe=True)
    collector = EngineCollector(engine, lock=lock)
    registry.register(collector)
    if ready is not None:
        registry.register(ReadyCollector(ready))
    for item in extra:
        registry.register(item)
    if process:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry, collector
