"""The statistics topic: every partition's final shares, folded into the comparisons and the
interleaving preference test.

Each commit writes, in its transaction, the shares of its partitions that became final and each
partition's final mark (transaction.py, step 4); this module reads them back. Every instance
runs one ``ComparisonReader``: it reads the topic from the beginning with ``read_committed`` and
folds a window once every input partition's mark has passed it (``LiveStatistics.fold``). The
fold reads only the shares, so every instance computes the same comparison whichever
partitions it owns, and a restart recomputes it by reading the topic again (docs/design.md,
"Statistics over all partitions").

The topic is compacted and has one partition, so the records of a transaction are read in
the order they were written: a partition's shares before the mark that makes them count.
Keys: ``share.<window start>.<partition>.<chunk>`` (written once: a restore resumes after the
last committed mark; a share of many segments takes several chunks) and ``final.<partition>``
(one per window at most: compaction keeps the newest). Its size is about one share per
(window, partition) that held data over the comparison's life, plus the marks. With
``interleaving.teams`` declared, the interleaving credit shares travel the same way as records
of their own kinds (``credit.<window start>.<partition>.<chunk>`` and
``credit_final.<partition>``, evald/interleaving/shares.py), folded into ``LiveCredit``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from evald.config import EngineConfig
from evald.daemon import names
from evald.daemon.backoff import Backoff
from evald.daemon.kafka_compat import StopEvent, close_quietly, without_auto_create
from evald.daemon.settings import Settings, TopicSettings
from evald.interleaving.fold import Settings as PreferenceSettings
from evald.interleaving.live import LiveCredit
from evald.interleaving.shares import KINDS as CREDIT_KINDS
from evald.interleaving.shares import CreditFrozen, CreditShare, decode_credit
from evald.statistics.live import LiveStatistics
from evald.statistics.shares import Frozen, Share, decode_record

__all__ = [
    "ComparisonReader",
    "StatisticsReaderCollector",
    "decode_statistics",
    "publishes_statistics",
    "statistics_topic",
]

log = logging.getLogger("evald.daemon")

#: the topic's only partition
PARTITION = 0
POLL_MS = 500


def statistics_topic(topics: TopicSettings) -> str:
    """The statistics topic of these settings (the name's rule: names.py)."""
    return names.statistics_topic(topics.checkpoint_topic)


def publishes_statistics(config: EngineConfig) -> bool:
    """Whether `evald run` writes and folds the statistics topic: with comparisons, or with
    interleaving teams declared (their credit shares)."""
    return bool(config.statistics.comparisons or config.interleaving.teams)


def decode_statistics(raw: bytes) -> Share | Frozen | CreditShare | CreditFrozen:
    """A statistics topic record of any kind: the comparisons' (``decode_record``, every
    version it reads) or the interleaving credit's; ValueError on anything else."""
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed statistics record: {exc!r}") from None
    if isinstance(doc, dict) and doc.get("kind") in CREDIT_KINDS:
        return decode_credit(doc)
    return decode_record(raw)


def preference_fold(config: EngineConfig) -> LiveCredit:
    """The interleaving test's fold, as the engine's own (component.py) is made."""
    inter = config.interleaving
    settings = PreferenceSettings(
        inter.alpha, inter.tuning_n, inter.min_n, inter.srm_alpha, inter.start
    )
    return LiveCredit(settings, inter.window, config.statistics.bootstrap_replicates)


class ComparisonReader:
    """Reads the statistics topic in a thread and keeps ``live`` folded (one per process:
    it outlives the Kafka sessions of the main loop)."""

    def __init__(
        self,
        settings: Settings,
        config: EngineConfig,
        measures: Sequence[str],
        partitions: int,
    ) -> None:
        self.topic = statistics_topic(settings.topics)
        self.partitions = partitions
        self.live = LiveStatistics(config, measures)
        #: the interleaving preference test, from the credit shares
        self.credit = preference_fold(config)
        #: the reader's stop, which also ends a bootstrap under way and closes the clients of
        #: each attempt (a consumer whose constructor raised keeps its I/O thread otherwise)
        self._stop = StopEvent()
        self._client = settings.kafka.client_config(self._stop.client)
        self._backoff = Backoff(
            settings.daemon.retry_backoff_initial_ms / 1000,
            settings.daemon.retry_backoff_max_ms / 1000,
        )
        self._thread = threading.Thread(target=self._run, name="evald-statistics", daemon=True)
        #: the next offset to read (kept across reconnects: the fold is never reset)
        self.position = 0
        #: records that are not statistics records, skipped (the first is logged with its reason)
        self.malformed = 0
        self._waiting: list[int] | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            consumer = None
            try:
                consumer = KafkaConsumer(
                    group_id=None,
                    enable_auto_commit=False,
                    # offset 0 may be compacted away: start at the oldest record kept
                    auto_offset_reset="earliest",
                    isolation_level="read_committed",
                    bootstrap_timeout_ms=self._client["request_timeout_ms"],  # as the session's
                    **without_auto_create(),
                    **self._client,
                )
                tp = TopicPartition(self.topic, PARTITION)
                consumer.assign([tp])
                consumer.seek(tp, self.position)
                while not self._stop.is_set():
                    for records in consumer.poll(timeout_ms=POLL_MS).values():
                        for record in records:
                            self._take(record.offset, record.value)
                    self.live.fold(range(self.partitions))
                    self.credit.fold(range(self.partitions))
                    self._note_waiting()
                    self._backoff.reset()
            except KafkaError as exc:
                if self._stop.is_set():  # e.g. the stop ended a bootstrap: nothing to retry
                    log.info("statistics topic %s: reader stopping (%r)", self.topic, exc)
                    break
                delay = self._backoff.next_delay()
                log.warning("statistics topic %s: %s; retrying in %.1fs", self.topic, exc, delay)
                self._stop.wait(delay)
            except Exception:  # never die: the comparisons would silently stop moving
                delay = self._backoff.next_delay()
                log.exception(
                    "reading statistics topic %s failed; retrying in %.1fs", self.topic, delay
                )
                self._stop.wait(delay)
            finally:
                if consumer is not None:
                    close_quietly(consumer)
                self._stop.close_clients()

    def _note_waiting(self) -> None:
        """Log when the partitions holding the fold back change (no final mark: no event yet,
        or its owner has not committed since): the comparisons' marks, or with interleaving
        teams only, the credit's."""
        fold = self.live if self.live.settings.comparisons else self.credit
        waiting = fold.unmarked(range(self.partitions))
        if waiting != self._waiting:
            self._waiting = waiting
            if waiting:
                log.info(
                    "the statistics fold waits for input partitions %s: no window is final "
                    "there yet (no event so far, or not committed yet)",
                    waiting,
                )
            else:
                log.info("statistics fold: every input partition has final windows")

    def _take(self, offset: int, value: bytes | None) -> None:
        self.position = offset + 1
        try:
            record = decode_statistics(value or b"")
        except ValueError as exc:
            self.malformed += 1
            # one line, not one per record: a foreign producer on the topic would flood the log
            if self.malformed == 1:
                log.warning(
                    "statistics topic %s offset %d skipped: %s (further malformed records are "
                    "counted in evald_statistics_records_malformed_total)",
                    self.topic,
                    offset,
                    exc,
                )
            else:
                log.debug("statistics topic %s offset %d skipped: %s", self.topic, offset, exc)
            return
        if isinstance(record, CreditShare | CreditFrozen):
            self.credit.add(record)
        else:
            self.live.add(record)


class StatisticsReaderCollector:
    """Exposes the statistics topic reader's count of skipped records (docs/metrics-reference.md).

    ``reader`` returns the process's reader, or None before the first session has started one
    (or without comparisons): the counter is absent then."""

    def __init__(self, reader: Callable[[], ComparisonReader | None]) -> None:
        self.reader = reader

    def collect(self) -> Iterable[Metric]:
        reader = self.reader()
        if reader is None:
            return
        yield CounterMetricFamily(
            "evald_statistics_records_malformed",
            "Records on the statistics topic that are not statistics records, skipped "
            "(the first is logged with its reason)",
            value=reader.malformed,
        )
