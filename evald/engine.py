"""Engine: decode -> join -> score -> aggregate, one instance per process.

The same engine runs under ``evald replay`` (files), ``evald demo`` and ``evald run`` (Kafka).
``feed`` does the per-event work (validate, join, advance the partition's watermark);
``tick`` applies the idle fallback and scores everything the watermarks closed, in numpy
batches; ``drain`` closes everything. State read by the exposition is plain attributes:
``stats`` (counters), ``aggregates`` (histograms and window sums), ``pending()``,
``pending_feedback()``, ``watermarks()`` and ``window_rows()``.

Daemon hooks (exactly-once on Kafka): ``state`` / ``resume`` (the partition's state as one
value, evald/partition_state.py), ``final_shares``, ``drop_partition``, ``snapshot`` /
``load_snapshot``, ``absorb_results`` and the ``on_result`` callback; docs/semantics.md. The
per-field reads ``state`` is made of (``low_offsets``, ``checkpoint``, ``evicted`` ...) and
``restore`` stay for the join's own tests.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from evald.aggregate import Aggregates, WindowRow
from evald.clicks.stream import StreamClicks
from evald.clicks.totals import ClickTotals
from evald.config import EngineConfig
from evald.decode import Decoder, EventDecoder, Rejection, Skipped
from evald.events import Feedback, Impression, Shown
from evald.histograms import Committed, Histograms, empty_like
from evald.interleaving.component import Interleaving
from evald.interleaving.shares import CreditFrozen
from evald.join import Joined, JoinStore
from evald.join.clock import EventTimes
from evald.join.window import complete_before
from evald.metrics import Batch, evaluate, parse_measures, required_depth
from evald.partition_state import MAX_HELD_RUNS, PartitionState, from_runs, to_runs
from evald.result import Result, read_result
from evald.segments import LabelTable, SegmentIndex
from evald.statistics.bootstrap import (
    list_clusters,
    poisson_weights,
    request_clusters,
    user_cluster,
)
from evald.statistics.live import LiveStatistics
from evald.statistics.shares import Frozen, PartitionShares
from evald.stats import Stats
from evald.zerofeedback.component import ZeroFeedback, parse_field, result_fields
from evald.zerofeedback.windows import ZeroRow, last_rows

log = logging.getLogger(__name__)


def _first(pair: tuple[int, Rejection]) -> int:
    return pair[0]


class Engine:
    """The streaming evaluation engine; not thread-safe (one loop drives it).

    Long because: it is the one place that wires every stage (docs/architecture.md), and the
    hot paths keep their collaborators' bound methods.
    """

    #: an optional hook that sees each scored batch of lists (partition, Joined) before it is
    #: scored: ``evald replay --click-model`` collects its sessions there (evald/clicks/)
    on_joined: Callable[[int, Joined], None] | None = None

    def __init__(
        self,
        config: EngineConfig,
        *,
        clock: Callable[[], float] = time.time,
        on_result: Callable[[Result], None] | None = None,
        decoder: EventDecoder | None = None,
        global_statistics: bool = False,
    ) -> None:
        """``decoder`` reads the input format; None: the native JSON schema (:class:`Decoder`)
        with the config's limits, action grades and event-time bounds. ``global_statistics``:
        this engine sees every input partition (replay, the demo), so it folds its own shares
        of the configured comparisons (``statistics``); without it the engine only keeps its
        partitions' shares (``shares``) for the daemon to publish and fold."""
        self.config = config
        self.clock = clock
        self.on_result = on_result
        self.decoder: EventDecoder = decoder or Decoder(
            config.limits,
            config.action_grades,
            min_ts=config.min_event_time,
            max_lead=config.max_event_lead,
        )
        self._measures = parse_measures(config.measures)
        self.measure_names: list[str] = [str(m) for m in self._measures]
        self._depth = required_depth(self._measures)
        self.segments = SegmentIndex(config.label_keys, config.label_value_cap, config.max_segments)
        #: each partition's counters of this engine's life; a revoked one's go to ``_retired``
        self._stats: dict[int, Stats] = {}
        self._retired = Stats()
        #: per partition, what the checkpoint it was resumed from had counted (its lives before)
        self._counted_before: dict[int, dict[str, int]] = {}
        #: what ``/metrics`` shows instead of this engine's counts (the daemon's commits)
        self._committed: Committed | None = None
        #: RBO between arms, unjudged and empty lists (evald/zerofeedback/)
        self.zero_feedback = ZeroFeedback(config.zero_feedback, config.retention)
        self.aggregates = Aggregates(
            self.measure_names,
            self.segments,
            config.histogram_bounds,
            config.bucket,
            config.windows,
            config.retention,
            config.statistics.bootstrap_replicates,
            config.drilldown.capacity,
            self.zero_feedback.enabled,
            config.drilldown.label_capacity if config.drilldown.capacity else 0,
            config.drilldown.label_keys,
        )
        #: each partition's shares of the comparison windows (evald/statistics/shares.py), and
        #: the comparisons' fold: the engine's own (``global_statistics``) or one attached
        self.shares, self.statistics = self._comparisons(global_statistics)
        self._folds_shares = self.statistics is not None
        #: interleaved lists: credit, window sums, the preference test (evald/interleaving/)
        self.interleaving = Interleaving(
            config.interleaving,
            self.segments,
            self.aggregates.replicates,
            fold=global_statistics,
            window=config.window,
        )
        self._stores: dict[int, JoinStore] = {}
        self._open_total = [0]  # open impressions over all partitions, kept by the stores
        self._drained = False
        self._decode = self.decoder.decode
        self._grades = self.decoder.action_grades
        #: the decoder's records of one request id make one list (docs/mapping.md)
        self._merges = bool(getattr(self.decoder, "merges_repeats", False))
        #: the click model fitted on the stream (``click_model``; evald/clicks/stream.py)
        self.clicks: StreamClicks | None = None
        if config.click_model.model is not None:
            self.clicks = StreamClicks(config.click_model, self.segments, self.measure_names)
            self.decoder = self.clicks.wrap(self.decoder)
            self._decode = self.decoder.decode

    def _comparisons(
        self, global_statistics: bool
    ) -> tuple[PartitionShares | None, LiveStatistics | None]:
        config = self.config
        if not config.statistics.comparisons:
            return None, None
        shares = PartitionShares(
            config.statistics.window,
            config.window,
            len(self.measure_names),
            self.segments,
            config.statistics.bootstrap_replicates,
        )
        live = LiveStatistics(config, self.measure_names) if global_statistics else None
        return shares, live

    # ------------------------------------------------------------------ counters

    def _stats_of(self, partition: int) -> Stats:
        stats = self._stats.get(partition)
        if stats is None:
            stats = self._stats[partition] = Stats()
        return stats

    @property
    def stats(self) -> Stats:
        """What this engine counted, every partition summed (a new value each call): a
        partition restored from a checkpoint starts at 0, what earlier lives counted is in
        the checkpoint (:meth:`state`)."""
        return Stats.merged([self._retired, *self._stats.values()])

    @property
    def counters(self) -> Stats:
        """The counters ``/metrics`` shows: :attr:`stats`, or what :meth:`export_committed`
        named has committed."""
        return self.stats if self._committed is None else self._committed.counted

    def scored(self) -> Histograms:
        """The measure histograms of everything this engine scored (its arrays, not a copy)."""
        return Histograms.of(self.aggregates, self.segments.segments)

    def histograms(self) -> Histograms:
        """The measure histograms ``/metrics`` shows: :meth:`scored`, or what
        :meth:`export_committed` named has committed."""
        if self._committed is None:
            return self.scored()
        return self._committed.histograms or empty_like(self.scored())

    def click_totals(self) -> ClickTotals | None:
        """The click counters ``/metrics`` shows (None without the click model): what this
        engine's click model scored, or what :meth:`export_committed` named has committed."""
        if self.clicks is None:
            return None
        if self._committed is None:
            return self.clicks.scored()
        return self._committed.clicks or ClickTotals(tuple(self.clicks.debiased.names))

    def export_committed(self, committed: Committed) -> None:
        """Show what ``committed`` holds as this engine's counters and histograms on
        ``/metrics``: the daemon's, as of its last commit, so that a kill -9 never leaves a
        count in a series that the restart makes again."""
        self._committed = committed

    # ------------------------------------------------------------------ input

    def _store(self, partition: int) -> JoinStore:
        store = self._stores.get(partition)
        if store is None:
            cfg = self.config
            store = self._stores[partition] = JoinStore(
                partition,
                window=cfg.window,
                lateness=cfg.lateness,
                idle_timeout=cfg.idle_timeout,
                quorum=cfg.watermark_quorum,
                max_pending=cfg.max_pending,
                open_total=self._open_total,
                evict=self._evict,
                max_held=cfg.max_held_feedback,
                labels=LabelTable(self.segments),
                stats=self._stats_of(partition),
                clock=self.clock,
                user_cluster=user_cluster if self.aggregates.replicates else None,
                merge=self._merges,
                max_items=cfg.limits.max_items,
                max_query_length=cfg.drilldown.max_query_length,
                key_depth=cfg.zero_feedback.depth,
            )
        return store

    def _evict(self, store: JoinStore) -> None:
        """``max_pending`` reached: close the oldest open impression of the partition that
        is receiving one, or of the fullest partition if that one has none open."""
        if not store.open():
            store = max(self._stores.values(), key=JoinStore.open)
        store.evict_oldest()

    def feed(
        self,
        raw: bytes,
        *,
        partition: int = 0,
        kind: str | None = None,
        offset: int | None = None,
        timestamp: int | None = None,
    ) -> Impression | Feedback | Shown | Rejection | None:
        """Validate and join one raw event; never raises on bad data (returns a Rejection).
        None: the decoder skipped the record (``stats.skipped``, by action), or refused a
        record a restore re-fed (refused, and dead-lettered, before the checkpoint).

        ``kind`` comes from the source when it knows it (a Kafka topic); ``offset`` is the
        source offset, remembered for ``low_offsets``; ``timestamp`` (epoch ms) is the source's
        time of the record (a Kafka record timestamp), the reference the event time may lead
        by at most ``max_event_lead`` (None or negative: the engine's clock), and the event
        time itself for a mapping that declares so.
        """
        reference = timestamp
        if reference is None or reference < 0:
            reference = int(self.clock() * 1000)
        event = self._decode(raw, kind, reference, timestamp)
        store = self._stores.get(partition) or self._store(partition)
        if isinstance(event, Skipped):
            self._count_skip(partition, event, store.replay_until, kind, offset)
            return None
        if isinstance(event, Rejection):
            counted = self._count_rejection(partition, event, store.replay_until, kind, offset)
            return event if counted else None
        refused: list[tuple[int, str, str, str]] = []
        offsets = None if offset is None else (offset,)
        store.join_many(((0, event),), offsets, self._grades, refused)
        self._drained = False
        if refused:  # a second, different list for a request id (never a re-fed record)
            _, reason, detail, known = refused[0]
            rejection = Rejection(reason, detail, raw, known)
            self._count_rejection(partition, rejection, None, kind, offset)
            return rejection
        return event

    def feed_batch(
        self,
        raws: Sequence[bytes],
        *,
        partition: int = 0,
        kinds: Sequence[str | None] | str | None = None,
        offsets: Sequence[int] | None = None,
        timestamps: Sequence[int | None] | None = None,
    ) -> list[tuple[int, Rejection]]:
        """``feed`` for a poll batch, in order: the same outcome and counters, several times
        less Python per event (docs/performance.md). Returns (position, rejection) for every
        refused record a restore did not re-feed (a re-fed one was refused, and dead-lettered,
        before the checkpoint); ``kinds`` is one kind for all records, one per record, or None;
        ``timestamps`` one source time per record as ``feed``'s ``timestamp``, or None.
        """
        store = self._stores.get(partition) or self._store(partition)
        rejections: list[tuple[int, Rejection]] = []
        skips: list[tuple[int, Skipped]] = []
        wall = int(self.clock() * 1000)
        references: list[int] | int = wall
        if timestamps is not None:
            references = [wall if t is None or t < 0 else t for t in timestamps]
        events = self.decoder.decode_many(raws, kinds, rejections, references, timestamps, skips)
        refused: list[tuple[int, str, str, str]] = []
        store.join_many(events, offsets, self._grades, refused)
        for position, reason, detail, known in refused:  # never re-fed records
            rejections.append((position, Rejection(reason, detail, raws[position], known)))
        if refused:
            rejections.sort(key=_first)
        until = store.replay_until
        single = kinds is None or isinstance(kinds, str)
        fresh: list[tuple[int, Rejection]] = []
        for position, rejection in rejections:
            kind = kinds if single else kinds[position]  # type: ignore[index]
            offset = None if offsets is None else offsets[position]
            if self._count_rejection(partition, rejection, until, kind, offset):  # type: ignore[arg-type]
                fresh.append((position, rejection))
        for position, skip in skips:
            kind = kinds if single else kinds[position]  # type: ignore[index]
            offset = None if offsets is None else offsets[position]
            self._count_skip(partition, skip, until, kind, offset)  # type: ignore[arg-type]
        if len(rejections) < len(raws):
            self._drained = False
        return fresh

    def reject(self, rejection: Rejection) -> None:
        """Count a record its source refused before decoding (replay's over-long line, never
        read whole) like any rejection (partition 0's)."""
        self._count_rejection(0, rejection, None, None, None)

    def _count_rejection(
        self,
        partition: int,
        rejection: Rejection,
        until: Mapping[str, int] | None,
        kind: str | None,
        offset: int | None,
    ) -> bool:
        """Count a refused record, unless a restore re-fed it (it was counted before);
        returns whether it was counted."""
        if until is None or offset is None or offset >= until.get(kind or "", -1):
            stats = self._stats_of(partition)
            stats.rejected[rejection.reason] += 1
            stats.events[(rejection.kind, "rejected")] += 1
            return True
        return False

    def _count_skip(
        self,
        partition: int,
        skip: Skipped,
        until: Mapping[str, int] | None,
        kind: str | None,
        offset: int | None,
    ) -> None:
        """Count a skipped record, unless a restore re-fed it (it was counted before)."""
        if until is None or offset is None or offset >= until.get(kind or "", -1):
            limit = self.config.limits.max_string_length
            self._stats_of(partition).count_skipped(skip.action, limit)

    # ------------------------------------------------------------------ finalization

    def tick(self) -> int:
        """Idle fallback, then score and aggregate everything closed; returns how many."""
        now = self.clock()
        done = 0
        stores = list(self._stores.values())
        for store in stores:
            store.idle(now)
            done += self._finalize(store, now)
        self._fold_shares(final=False)
        self.interleaving.advance(self._watermarks())
        for store in stores:
            self._prune(store)
        if self.clicks is not None:
            self.clicks.prune(self.complete_before(), self.pending())
            self.clicks.refresh()
        return done

    def drain(self) -> int:
        """Close and score everything pending (end of input, draining shutdown)."""
        now = self.clock()
        done = 0
        for store in list(self._stores.values()):
            store.close_all()
            done += self._finalize(store, now)
        self._drained = True
        if self.clicks is not None:
            self.clicks.refresh()
        self._fold_shares(final=True)
        self.interleaving.advance(self._watermarks(), final=True)
        return done

    def _fold_shares(self, *, final: bool) -> None:
        """``global_statistics``: hand every partition's final shares to the fold, then fold
        the windows final in every partition that has a watermark (``final``: all)."""
        live, shares = self.statistics, self.shares
        if not self._folds_shares or live is None or shares is None:
            return
        for p, store in self._stores.items():
            frozen = shares.freeze(p, store.watermark, final=final)
            if frozen is not None:
                live.add(frozen)
        live.fold([p for p, store in self._stores.items() if store.watermark is not None])

    def _watermarks(self) -> dict[int, int | None]:
        return {p: store.watermark for p, store in self._stores.items()}

    def attach_statistics(self, live: LiveStatistics) -> None:
        """Expose a fold fed elsewhere (the daemon's statistics topic reader) as this engine's
        comparisons; the engine then only accumulates its partitions' shares."""
        self.statistics = live
        self._folds_shares = False

    def _finalize(self, store: JoinStore, now: float) -> int:
        done = 0
        started = store.first_close_wall
        while True:
            joined = store.take(self.config.batch_size)
            if joined is None:
                break
            self._score(store.partition, joined)
            n = len(joined.request_ids)
            done += n
            if started is not None:
                store.stats.observe_lag(now - started, n)
        return done

    def _batch(self, joined: Joined) -> Batch:
        """Batch where every served item is judged (as Batch.from_served_grades), built from
        the padded matrix directly so no per-item Python list is made."""
        grades, lengths = joined.grades, joined.lengths
        width = self._depth or grades.shape[1]
        if width <= grades.shape[1]:
            cut = np.ascontiguousarray(grades[:, :width])
        else:
            cut = np.zeros((grades.shape[0], width))
            cut[:, : grades.shape[1]] = grades
        ideal = -np.sort(-grades, axis=1)
        judged = np.arange(width) < lengths[:, None]
        return Batch(cut, lengths, ideal, judged)

    def _score(self, partition: int, joined: Joined) -> None:
        if self.on_joined is not None:
            self.on_joined(partition, joined)
        if self.clicks is not None:
            self.clicks.observe(partition, joined)
        n = len(joined.request_ids)
        scored = evaluate(self._measures, self._batch(joined))
        values = np.empty((n, len(self._measures)))
        for j, measure in enumerate(self._measures):
            values[:, j] = scored[measure]
        abandoned: np.ndarray = np.logical_not((joined.grades > 0).any(axis=1))
        values[abandoned] = 0.0
        stats = self._stats_of(partition)
        for reason in joined.reasons:
            stats.finalized[reason] += 1
        stats.abandoned += int(abandoned.sum())
        clusters = weights = None
        aggregates = self.aggregates
        if aggregates.replicates:  # one weight row per result, for the window and share sums
            clusters = list_clusters(joined.clusters, joined.request_ids)
            weights = poisson_weights(clusters, aggregates.replicates, aggregates.seed)
        if self.shares is not None:
            self.shares.observe(
                partition,
                joined.segment_ids,
                joined.ts,
                values,
                joined.reasons,
                weights,
                None if weights is None else joined.clusters != 0,
            )
        aggregates.observe(
            partition,
            joined.segment_ids,
            joined.ts,
            values,
            abandoned=abandoned,
            clusters=clusters,
            weights=weights,
            queries=joined.queries,
            labels=joined.labels,
        )
        credits: Sequence[dict[str, Any] | None] | None = None
        if joined.teams is not None:
            credits = self.interleaving.observe(partition, joined, joined.clusters != 0, weights)
        zero = None
        if aggregates.zero is not None:
            zero = self.zero_feedback.score(partition, joined)
            aggregates.zero.observe(partition, joined.segment_ids, joined.ts, zero)
        if self.on_result is not None:
            self._emit(partition, joined, values, abandoned, credits, zero)

    def _emit(
        self,
        partition: int,
        joined: Joined,
        values: np.ndarray,
        abandoned: np.ndarray,
        credits: Sequence[dict[str, Any] | None] | None,
        zero: np.ndarray | None = None,
    ) -> None:
        """One ``Result`` per scored list to ``on_result``; ``credits``: each list's
        interleaving credit (None: no list of the batch is interleaved); ``zero``: the lists'
        zero-feedback values (None: off)."""
        callback = self.on_result
        assert callback is not None
        # one (name, value) pair stream per measure, zipped into rows: cheaper than a
        # dict(zip(names, row)) per result
        columns = [
            zip(repeat(name), col)
            for name, col in zip(self.measure_names, values.T.tolist(), strict=True)
        ]
        n = len(joined.request_ids)
        zeros = repeat(None, n) if zero is None else result_fields(zero)
        for request_id, ts, labels, measures, reason, empty, cluster, query, credit, zf in zip(
            joined.request_ids,
            joined.ts.tolist(),
            joined.labels,
            map(dict, zip(*columns, strict=True)),
            joined.reasons,
            abandoned.tolist(),
            joined.clusters.tolist(),
            joined.queries,
            repeat(None, n) if credits is None else credits,
            zeros,
            strict=True,
        ):
            callback(
                Result(
                    request_id,
                    ts,
                    labels,
                    measures,
                    partition,
                    reason,
                    empty,
                    cluster,
                    interleaving=credit,
                    query=query,
                    zero_feedback=zf,
                )
            )

    def _prune(self, store: JoinStore) -> None:
        wm = store.watermark
        if wm is not None:
            self.aggregates.prune(store.partition, wm - self.config.window - self.config.retention)

    # ------------------------------------------------------------------ reading

    def pending(self) -> int:
        """Impressions in memory (waiting for their window, or closed and not yet scored)."""
        return sum(s.pending() for s in self._stores.values())

    def pending_feedback(self) -> int:
        """Feedback held because its impression has not arrived (yet)."""
        return sum(s.held for s in self._stores.values())

    def behind_watermark(self) -> int:
        """Events whose time was behind their partition's watermark when they came (more
        than the lateness behind a newer one): out of order past what the lateness allows."""
        return sum(s.behind for s in self._stores.values())

    def oldest_open(self) -> int | None:
        """Event time (ms) of the oldest impression still waiting for its attribution window,
        over all partitions; None when none waits. With the watermark and the window it says
        when the next aggregate window completes (`evald top`)."""
        times = [t for s in self._stores.values() if (t := s.oldest_open()) is not None]
        return min(times) if times else None

    def watermarks(self) -> dict[int, int | None]:
        """Event-time watermark (ms) per partition; None before its first event."""
        return {p: s.watermark for p, s in sorted(self._stores.items())}

    def complete_before(self) -> int | None:
        """Event time before which every impression is finalized, over all partitions.

        An impression with ``ts + window <= watermark`` is closed; the least advanced
        partition bounds it. None before any event.
        """
        marks = [s.watermark for s in self._stores.values() if s.watermark is not None]
        return complete_before(min(marks), self.config.window) if marks else None

    def zero_feedback_rows(self) -> list[ZeroRow]:
        """The zero-feedback values of the last complete window per width (the exposition's
        ``evald_zero_feedback_*``), complete as ``window_rows`` says; [] with the signals off."""
        zero = self.aggregates.zero
        if zero is None:
            return []
        return last_rows(
            zero, self.segments, self.config.windows, self.complete_before(), final=self._drained
        )

    def window_rows(self, *, last_only: bool = True) -> list[WindowRow]:
        """Window aggregates of the last complete window per width (``last_only``, what the
        exposition shows) or of every complete window in retention. After a drain all data is
        final, so the window holding the newest impression counts as complete."""
        return self.aggregates.window_rows(
            self.complete_before(), last_only=last_only, final=self._drained
        )

    # ------------------------------------------------------------------ daemon hooks

    def state(self, partition: int, fed: Mapping[str, int]) -> PartitionState:
        """The partition's state for a checkpoint (evald/partition_state.py), ``fed`` being
        per kind the next offset not fed yet: where a restart must read again from (the low
        offsets, never above ``fed``), the watermark and event times, what a replay from there
        must skip or count, and the open comparison shares. Take the final shares
        (:meth:`final_shares`) first: the open ones are what freezing them left."""
        low = self.low_offsets(partition)
        committed = {}
        for kind in ("impression", "feedback"):
            low_kind = low.get(kind)
            committed[kind] = fed[kind] if low_kind is None else min(low_kind, fed[kind])
        held = to_runs(self.held_feedback(partition, committed["feedback"]))
        return PartitionState(
            watermark=self.checkpoint(partition),
            committed=committed,
            event_times=self.event_times(partition),
            evicted=to_runs(self.evicted(partition, committed["impression"])),
            evicted_feedback=to_runs(self.evicted(partition, committed["feedback"], "feedback")),
            held_feedback=held[:MAX_HELD_RUNS],
            statistics=self._open_shares(partition),
            zero_feedback=self.zero_feedback.state(partition),
            counters=self.counted(partition),
            click_model=None if self.clicks is None else self.clicks.state(partition),
        )

    def _open_shares(self, partition: int) -> dict[str, Any] | None:
        """The checkpoint's ``statistics``: the comparisons' open shares, with the open
        interleaving credit shares under ``interleaving`` (docs/design.md)."""
        doc = None if self.shares is None else self.shares.state(partition)
        credit = self.interleaving.state_of(partition)
        if credit is not None:
            doc = {**(doc or {}), "interleaving": credit}
        return doc

    def counted(self, partition: int) -> dict[str, int]:
        """Everything counted for ``partition`` since its first life (``PartitionState``'s
        ``counters``): what the checkpoint it was resumed from held plus what this engine
        counted since."""
        total = dict(self._counted_before.get(partition, {}))
        for key, n in self._stats_of(partition).counted().items():
            total[key] = total.get(key, 0) + n
        return total

    def resume(self, partition: int, state: PartitionState, consumed: Mapping[str, int]) -> None:
        """Rebuild ``partition`` from the ``state`` a checkpoint holds (:meth:`restore`, with
        ``consumed`` the offsets fed before it), its open comparison shares included."""
        self.restore(
            partition,
            state.watermark,
            consumed,
            state.event_times,
            from_runs(state.evicted),
            from_runs(state.evicted_feedback),
            from_runs(state.held_feedback),
        )
        if self.shares is not None:
            self.shares.load(partition, state.statistics, state.watermark)
        self._counted_before[partition] = dict(state.counters)
        stored = state.statistics.get("interleaving") if state.statistics else None
        self.interleaving.load(partition, stored, state.watermark)
        self.zero_feedback.load(partition, state.zero_feedback)
        if self.clicks is not None:
            self.clicks.load(partition, state.click_model)
        for setting, held, on in (
            ("engine.click_model", state.click_model, self.clicks is not None),
            ("engine.zero_feedback.depth", state.zero_feedback, self.zero_feedback.enabled),
        ):
            if held is not None and not on:  # switched off across the restart
                log.warning(
                    "partition %d: its checkpoint holds state of %s, which is off now: "
                    "dropped (switched on again, it starts afresh)",
                    partition,
                    setting,
                )

    def final_shares(self, partition: int) -> list[Frozen | CreditFrozen]:
        """The partition's comparison shares and interleaving credit shares the watermark made
        final since the last call, each kind with its final mark, handed out once (forgotten
        here); empty without comparisons or teams, or when nothing became final."""
        watermark = self.checkpoint(partition)
        found = [
            None if self.shares is None else self.shares.freeze(partition, watermark),
            self.interleaving.final_shares(partition, watermark),
        ]
        return [frozen for frozen in found if frozen is not None]

    def shares_due(self, partition: int) -> bool:
        """Whether :meth:`final_shares` has something to hand out (the watermark moved, maybe
        by the idle fallback, with no result to commit)."""
        watermark = self.checkpoint(partition)
        return (
            self.shares is not None and self.shares.due(partition, watermark)
        ) or self.interleaving.shares_due(partition, watermark)

    def low_offsets(self, partition: int) -> dict[str, int | None]:
        """Smallest offset per source kind still needed to rebuild ``partition``'s state:
        pending impressions, the feedback merged into them and held feedback. Call after
        ``tick()`` so closed impressions have been emitted. None: nothing pending."""
        store = self._stores.get(partition)
        if store is None:
            return {"impression": None, "feedback": None}
        return store.low_offsets()

    def checkpoint(self, partition: int) -> int | None:
        """The partition's watermark (ms) to store with the committed offsets."""
        store = self._stores.get(partition)
        return None if store is None else store.watermark

    def event_times(self, partition: int) -> EventTimes:
        """The partition's confirmed event time and the block of event times being filled, to
        store with its checkpoint: the watermark's next moves depend on them
        (docs/semantics.md §3)."""
        store = self._stores.get(partition)
        return EventTimes(None) if store is None else store.event_times()

    def restore(
        self,
        partition: int,
        watermark_ms: int | None,
        consumed: Mapping[str, int],
        event_times: EventTimes | None = None,
        evicted: Sequence[int] = (),
        evicted_feedback: Sequence[int] = (),
        held_feedback: Sequence[int] = (),
    ) -> None:
        """Rebuild ``partition`` after a restart by re-feeding from its low offsets.

        Events fed with ``offset < consumed[kind]`` were seen before the crash: impressions
        among them whose window closed by ``watermark_ms`` were already emitted and are
        skipped; the others, and their feedback, rebuild the pending state; no counter moves.
        Feedback re-fed while its impression is not pending is held again; its outcome (expired
        as orphaned, or early, late or a duplicate when its impression comes) is counted when
        its offset is in ``held_feedback``, what ``held_feedback`` returned at the checkpoint
        (it was held then, undecided), and not otherwise (it was attached to an impression
        emitted since: decided and counted). Later offsets behave normally.
        ``event_times`` is what ``event_times`` returned at the checkpoint (None: unknown, as
        in a checkpoint written before it existed; re-fed events then count again).
        ``evicted`` is what ``evicted`` returned at the checkpoint: impressions the cap
        closed (and emitted) before their window, skipped when re-fed; ``evicted_feedback``
        what ``evicted(kind="feedback")`` returned (lists of several records).
        """
        self._store(partition).restore(
            watermark_ms, dict(consumed), event_times, evicted, evicted_feedback, held_feedback
        )

    def held_feedback(self, partition: int, since: int | None) -> list[int]:
        """Offsets >= ``since`` (the checkpoint's committed feedback offset) of the feedback
        held whose outcome is still to be counted, for the checkpoint: a restore counts the
        outcome of these when they expire or are claimed, as an uninterrupted run would, and
        of no other re-fed feedback (docs/semantics.md §6)."""
        store = self._stores.get(partition)
        return [] if store is None else store.held_feedback(since)

    def evicted(self, partition: int, since: int | None, kind: str = "impression") -> list[int]:
        """Offsets of ``kind`` >= ``since`` (the checkpoint's committed offset of that kind)
        of records a restore replaying from ``since`` must not let open a list: impressions
        ``max_pending`` closed early and that were emitted, repeated impressions (ignored
        while their request id was pending), and with lists of several records the later
        records of lists already emitted (docs/design.md). Forgets older ones."""
        store = self._stores.get(partition)
        return [] if store is None else store.evicted(since, kind)

    def snapshot(self, partition: int) -> bytes:
        """The partition's window aggregates, exact (``Aggregates.snapshot``), so a restart
        loads them instead of re-reading every result since the partition was assigned."""
        return self.aggregates.snapshot(partition)

    def load_snapshot(self, partition: int, raw: bytes) -> None:
        """Replace the partition's window aggregates by a ``snapshot`` (ValueError if it is
        not one); results emitted after it are added with ``absorb_result``."""
        self.aggregates.load(partition, raw)

    def drop_partition(self, partition: int) -> None:
        """Forget a partition's pending state and window sums (histograms stay)."""
        store = self._stores.pop(partition, None)
        if store is not None:
            self._open_total[0] -= store.open()
        stats = self._stats.pop(partition, None)
        if stats is not None:
            self._retired = Stats.merged([self._retired, stats])
        self._counted_before.pop(partition, None)
        self.aggregates.drop_partition(partition)
        self.interleaving.drop(partition)
        self.zero_feedback.drop(partition)
        if self.shares is not None:
            self.shares.drop(partition)
        if self.clicks is not None:
            self.clicks.drop(partition)

    def absorb_result(self, result: Mapping[str, Any], partition: int) -> bool:
        """Add an already-emitted result (read back from the results topic) to the window
        sums of ``partition``; histograms are untouched (they are process counters).

        The bootstrap cluster is the result's ``"cluster"`` (its user, as when it was scored);
        without one (no user id, or a record written before the field existed) the result is
        its own cluster. Returns False, changing nothing, for a record that is not a result
        (bad ``ts``, labels, measures or cluster): read-back data must not crash the engine.
        """
        return self.absorb_results([result], partition) == 1

    def absorb_results(self, results: Sequence[Any], partition: int) -> int:
        """``absorb_result`` of many results in one aggregation call (a restore absorbs
        thousands per partition, and one call per result cost a millisecond each); the window
        sums come out as if absorbed one by one (the clustered interval's to the last digits:
        its replicate sums are added per run of results). Returns how many were results; the
        others are left out."""
        segments: list[int] = []
        times: list[int] = []
        rows: list[list[float]] = []
        clusters: list[int | None] = []
        rids: list[str] = []
        queries: list[str] = []
        labels: list[dict[str, str]] = []
        zero_rows: list[list[float]] = []
        for result in results:
            read = read_result(result, self.measure_names)
            if read is None:
                continue
            try:
                field = read.zero_feedback
                zero_row = [math.nan] * 3 if field is None else parse_field(field)
            except ValueError:
                continue
            segments.append(self.segments.segment_of(read.labels))
            times.append(read.ts)
            rows.append(read.row)
            clusters.append(read.cluster)
            rids.append(read.request_id if read.cluster is None else "")
            queries.append(read.query)
            labels.append(read.labels)
            zero_rows.append(zero_row)
        if not segments:
            return 0
        keys = np.asarray([0 if k is None else k for k in clusters], dtype=np.uint64)
        own = [i for i, k in enumerate(clusters) if k is None]
        if own:
            keys[own] = request_clusters([rids[i] for i in own])
        self.aggregates.observe(
            partition,
            np.asarray(segments),
            np.asarray(times, dtype=np.int64),
            np.asarray(rows, dtype=np.float64),
            histogram=False,
            clusters=keys,
            queries=queries,
            labels=labels,
        )
        if self.aggregates.zero is not None:
            self.aggregates.zero.observe(
                partition,
                np.asarray(segments, np.intp),
                np.asarray(times, np.int64),
                np.asarray(zero_rows, np.float64),
            )
        return len(segments)
