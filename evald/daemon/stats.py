"""Daemon-only counters and their Prometheus collector (names fixed in docs/architecture.md)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from evald.exposition.collector import ready_family
from evald.histograms import Committed

__all__ = ["DaemonCollector", "DaemonStats"]


@dataclass
class DaemonStats:
    """Plain counters written by the consumer loop, read by scrapes (a lock guards the maps).

    Each field has one writer, named beside it: the runner (its poll cycle and sessions), the
    transaction (what a commit or an abort did), the rebalance listener and the health probe.
    """

    pauses: int = 0  # runner
    results_produced: int = 0  # transaction
    dlq: Counter[str] = field(default_factory=Counter)  # transaction
    lag: dict[tuple[str, int], int] = field(default_factory=dict)  # health (set_lag)
    ready: bool = False  # health (set_ready)
    commits: int = 0  # transaction
    aborts: int = 0  # transaction
    sessions: int = 0  # runner
    restores: int = 0  # runner
    #: sessions that failed because the broker rejected a commit as stale (fenced producer or
    #: generation), a stop's last session too; runner
    fenced_sessions: int = 0
    #: open transactions given up because another member had taken the partitions over (lost
    #: partitions); rebalance
    fenced_revocations: int = 0
    #: largest number of pending impressions seen after a tick (memory high-water mark); runner
    peak_pending: int = 0
    #: the engine's counters and histograms as of the last commit, over every session of the
    #: process (the engine's series show these, ``Engine.export_committed``)
    committed: Committed = field(default_factory=Committed)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def fenced(self) -> int:
        """Open transactions abandoned because this instance was fenced, either way."""
        return self.fenced_sessions + self.fenced_revocations

    def set_lag(self, lag: dict[tuple[str, int], int]) -> None:
        """Replace the consumer-lag snapshot (partitions no longer owned disappear)."""
        with self.lock:
            self.lag = dict(lag)


class DaemonCollector:
    """Exposes :class:`DaemonStats` next to the engine's series on the same registry."""

    def __init__(self, stats: DaemonStats, *, include_ready: bool = True) -> None:
        self.stats = stats
        self.include_ready = include_ready

    def collect(self) -> Iterable[Metric]:
        stats = self.stats
        with stats.lock:
            lag = sorted(stats.lag.items())
            dlq = sorted(stats.dlq.items())
        lag_family = GaugeMetricFamily(
            "evald_consumer_lag",
            "Records in the input topic partition not yet fed to the engine",
            labels=["topic", "partition"],
        )
        for (topic, partition), value in lag:
            lag_family.add_metric([topic, str(partition)], value)
        yield lag_family
        yield CounterMetricFamily(
            "evald_backpressure_pauses",
            "Times the impressions partitions were paused because "
            "pending impressions reached the high-water mark",
            value=stats.pauses,
        )
        dlq_family = CounterMetricFamily(
            "evald_dlq_records",
            "Rejected records written to the dead-letter topic",
            labels=["reason"],
        )
        for reason, value in dlq:
            dlq_family.add_metric([reason], value)
        yield dlq_family
        yield CounterMetricFamily(
            "evald_results_produced",
            "Finalized results written to the results topic (in transactions that committed)",
            value=stats.results_produced,
        )
        yield CounterMetricFamily(
            "evald_transactions_fenced",
            "Open transactions abandoned because this instance was fenced: its partitions "
            "were taken over, or the broker rejected its commit as stale",
            value=stats.fenced,
        )
        if not self.include_ready:
            return
        yield ready_family(stats.ready)
