"""The input side of the owned partitions: buffer what each poll returns, merge the two topics
of a partition into one order (merge.py) and feed the engine.

One :class:`InputPartition` per owned partition number p holds, for as long as p is assigned,
its input offsets (fetched, fed, to replay) and its merge buffer; the result side of p is the
transaction's (ledger.py, interval.py). :class:`Inputs` owns them and the two reasons a fetch
is paused: a merge buffer over ``MERGE_BUFFER_CAP`` (per partition and kind) and backpressure
(the impressions, see backpressure.py); a partition resumes only when neither holds it.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any, Protocol

from kafka import TopicPartition

from evald.daemon.kafka_compat import FetchWatch
from evald.daemon.main.checkpoint import Checkpoint
from evald.daemon.main.merge import KINDS, Merger
from evald.decode import Rejection

__all__ = [
    "MERGE_BUFFER_CAP",
    "Fed",
    "InputPartition",
    "Inputs",
    "Positions",
    "Rejected",
    "Restored",
]

log = logging.getLogger("evald.daemon")

#: records of one kind held in a partition's merge buffer before its fetch is paused
MERGE_BUFFER_CAP = 20_000

#: ``feed_batch`` of the engine (see Engine.feed_batch)
FeedBatch = Callable[..., list[tuple[int, Rejection]]]
#: one record the engine refused: (rejection, record, kind), for the dead letters
Rejected = tuple[Rejection, Any, str]


class Positions(Protocol):
    """What the inputs read of the group consumer (kafka-python's ``KafkaConsumer``): where
    it fetches from and the high watermarks fetches reported. Pausing and resuming is the
    caller's, from what :meth:`Inputs.take`, :meth:`Inputs.feed` and the backpressure
    methods return."""

    def position(self, tp: TopicPartition) -> int | None: ...

    def highwater(self, tp: TopicPartition) -> int | None: ...


@dataclass
class Fed:
    """What one :meth:`Inputs.feed` did: records fed per partition (those fed at all), the
    records the engine refused, in feeding order, and the fetches to resume (merge buffers
    drained below half their cap)."""

    counts: dict[int, int] = field(default_factory=dict)
    rejected: list[Rejected] = field(default_factory=list)
    resume: list[TopicPartition] = field(default_factory=list)


@dataclass(frozen=True)
class Restored:
    """Where a restore left partition p (restore.py): both inputs sought to ``start``, the
    records below ``replay_end`` to be replayed, from ``checkpoint`` (None: a fresh start)."""

    start: dict[str, int]
    replay_end: dict[str, int]
    checkpoint: Checkpoint | None = None


@dataclass
class InputPartition:
    """The input side of one owned partition number p (both input topics), as long as it is
    assigned: written by :class:`Inputs` only."""

    partition: int
    merger: Merger[Any]
    restored: bool = False
    fed_next: dict[str, int] = field(default_factory=dict)
    fetched_next: dict[str, int] = field(default_factory=dict)
    #: per kind, the offset the restored checkpoint had consumed up to: records below it are
    #: read again only to rebuild pending joins
    replay_end: dict[str, int] = field(default_factory=dict)
    #: restored and not every record below ``replay_end`` fed yet: later records wait
    #: (``Merger.defer``), and a commit keeps the checkpoint's consumed offsets
    replaying: bool = False
    merge_paused: set[str] = field(default_factory=set)

    def begin_replay(self) -> None:
        """Just restored: replaying while ``fed_next`` is below ``replay_end``."""
        self.replaying = any(self.fed_next[k] < self.replay_end.get(k, 0) for k in KINDS)

    def consumed(self) -> dict[str, int]:
        """Per kind, the next offset never fed before, for the checkpoint: ``fed_next``, but
        never below the restored checkpoint's consumed offset. A commit made while the
        replay is not all fed (a periodic one, a revocation, the shutdown) must not hand the
        records above ``fed_next`` to the next restore as new: they were fed, and their
        results and dead letters written, before the checkpoint being replayed."""
        return {k: max(self.fed_next[k], self.replay_end.get(k, 0)) for k in KINDS}


class Inputs:
    """The owned partitions between the consumer and the engine."""

    def __init__(
        self, impressions: str, feedback: str, clock: Callable[[], float], merge_hold_s: float
    ) -> None:
        self._impressions = impressions
        self._feedback = feedback
        self._clock = clock
        self._merge_hold_s = merge_hold_s
        self.parts: dict[int, InputPartition] = {}
        self._to_restore: set[int] = set()
        #: the impressions partitions backpressure paused (not those still fetching a replay)
        self.held: set[TopicPartition] = set()
        self._consumer: Positions | None = None
        #: when each partition's high watermark was last confirmed by a fetch (caught_up)
        self._watch: FetchWatch | None = None
        #: a poll returned records since the last :meth:`fetched` (the broker is answering)
        self._fetched = False

    # -- naming ---------------------------------------------------------------------------

    def kind(self, topic: str) -> str:
        """ "impression" or "feedback": which input ``topic`` is."""
        return "impression" if topic == self._impressions else "feedback"

    def tp(self, kind: str, p: int) -> TopicPartition:
        """Partition ``p`` of the input topic of ``kind``."""
        return TopicPartition(self._impressions if kind == "impression" else self._feedback, p)

    # -- ownership ------------------------------------------------------------------------

    def connect(self, consumer: Positions | None) -> None:
        """The session's group consumer (positions, high watermarks, the fetches answered);
        None: disconnected."""
        self._consumer = consumer
        self._watch = None if consumer is None else FetchWatch(consumer, self._clock)

    def assign(self, partitions: set[int]) -> None:
        """Take on ``partitions``: each is restored at the start of the next :meth:`take`."""
        for p in partitions:
            if p not in self.parts:
                self.parts[p] = InputPartition(p, Merger(self._merge_hold_s, self._clock))
                self._to_restore.add(p)

    def revoke(self, partitions: set[int]) -> list[int]:
        """Forget ``partitions``; returns those that were owned (the engine drops them)."""
        dropped = []
        for p in partitions:
            part = self.parts.pop(p, None)
            self._to_restore.discard(p)
            self.held.discard(self.tp("impression", p))
            if part is not None:
                dropped.append(p)
        return dropped

    def clear(self) -> None:
        """The session ended: nothing is owned, nothing held."""
        self.parts.clear()
        self._to_restore.clear()
        self.held = set()

    def waiting(self) -> list[int]:
        """Partitions assigned but not restored yet."""
        return sorted(self._to_restore | {p for p, s in self.parts.items() if not s.restored})

    def restored(self) -> list[InputPartition]:
        """The owned partitions that are restored (the ones fed and committed)."""
        return [part for part in self.parts.values() if part.restored]

    def fetched(self) -> bool:
        """Whether a poll returned records since the last call."""
        fetched, self._fetched = self._fetched, False
        return fetched

    # -- the poll cycle -------------------------------------------------------------------

    def to_restore(self) -> list[int]:
        """The partitions assigned since the last :meth:`take`: the caller restores them (all
        in one call: restore.py reads their state together) and hands each back to
        :meth:`resume` before that take."""
        return sorted(self._to_restore)

    def resume(self, p: int, restored: Restored) -> None:
        """Partition ``p`` was restored (its inputs sought to ``restored.start``): fed and
        fetched from there, the records below ``restored.replay_end`` replayed."""
        part = self.parts[p]
        part.replay_end = dict(restored.replay_end)
        part.fed_next = dict(restored.start)
        part.fetched_next = dict(restored.start)
        part.merger.clear()
        part.restored = True

    def take(self, batches: dict[TopicPartition, list[Any]]) -> list[TopicPartition]:
        """Buffer what the poll returned; returns the fetches to pause (a merge buffer over
        ``MERGE_BUFFER_CAP``). A partition assigned since the last cycle (restored
        just before, see :meth:`to_restore`) starts replaying and drops this poll's records:
        they may come from the position it had before (kafka-python can keep a reassigned
        partition's position and fetched batches), and the restore's seek has them fetched
        again from the checkpoint.
        Taken as an offset gap instead, they would make the re-fetch look like a duplicate."""
        restored = set(self._to_restore)
        for p in sorted(restored):
            part = self.parts.get(p)
            if part is not None and part.restored:
                part.begin_replay()
        self._to_restore.clear()
        pause: list[TopicPartition] = []
        for tp, records in batches.items():
            if tp.partition not in restored:
                if self._buffer(tp, records):
                    pause.append(tp)
                self._fetched = True
        return pause

    def _buffer(self, tp: TopicPartition, records: list[Any]) -> bool:
        """Buffer ``records`` of ``tp``; returns whether its fetch is to be paused now."""
        part = self.parts.get(tp.partition)
        if part is None or not part.restored or not records:
            return False  # not ours (any more): the new owner re-reads from the committed offset
        kind = self.kind(tp.topic)
        expected = part.fetched_next[kind]
        if records[0].offset < expected:  # re-fetched after a seek: skip what we have
            records = [record for record in records if record.offset >= expected]
            if not records:
                return False
        first, last = records[0].offset, records[-1].offset
        if first > expected or last - first + 1 != len(records):
            # a gap can only come from compaction/retention (or transaction markers): accept
            # it, never go back
            log.debug("offset gap on %s: expected %d, got %d..%d", tp, expected, first, last)
        replay_end = part.replay_end.get(kind, 0)
        if first < replay_end:
            # rebuilding pending joins: these records were merged before the crash
            replayed = records[: bisect_left(records, replay_end, key=attrgetter("offset"))]
            part.merger.extend(
                kind, [record.timestamp for record in replayed], replayed, replayed=True
            )
            records = records[len(replayed) :]
        if records:
            timestamps = [record.timestamp for record in records]
            if part.replaying:  # fed after the whole replay, as before the crash
                part.merger.defer(kind, timestamps, records)
            else:
                part.merger.extend(kind, timestamps, records)
        part.fetched_next[kind] = last + 1
        if part.merger.buffered(kind) > MERGE_BUFFER_CAP and kind not in part.merge_paused:
            part.merge_paused.add(kind)
            return True
        return False

    def caught_up(self, part: InputPartition) -> dict[str, float]:
        """Per kind, the time as of which its topic partition is known to be fetched to its
        end (``Merger.release_runs``): when the latest fetch request answered for it was built,
        if what is fetched reaches the high watermark that answer reported; ``inf`` while
        backpressure pauses its impressions; ``-inf`` otherwise, and always before the records
        to replay are all fetched (replayed records of the other kind skip the hold on the
        strength of this). While the partition replays, ``inf`` once they are: only replayed
        records are merged until the replay is all fed, and none of this kind is to come.

        Not simply "position ≥ ``consumer.highwater``": that watermark is the last one any
        fetch returned, and while the partition's leader moves it is stale (see FetchWatch)."""
        consumer, watch = self._consumer, self._watch
        assert consumer is not None and watch is not None
        out = {}
        for kind in KINDS:
            fetched = part.fetched_next[kind]
            tp = self.tp(kind, part.partition)
            if fetched < part.replay_end.get(kind, 0):
                out[kind] = -math.inf
                continue
            if part.replaying:
                # only replayed records are merged now, and this kind's are all fetched
                out[kind] = math.inf
                continue
            if tp in self.held:
                out[kind] = math.inf
                continue
            answered = watch.answered(tp)
            if answered is None:
                out[kind] = -math.inf
                continue
            sent_at, high = answered
            if fetched < high:
                # the position passes the commit marker after a transactional producer's last
                # record (the repartition stage's internal topics), the record offsets do not
                fetched = max(fetched, consumer.position(tp) or 0)
            out[kind] = sent_at if fetched >= high else -math.inf
        return out

    def feed(self, feed_batch: FeedBatch) -> Fed:
        """Feed every record the merge releases, one engine call per partition (two in the
        cycle that ends a partition's replay); returns what was fed and refused, and the
        fetches to resume."""
        fed = Fed()
        for p, part in sorted(self.parts.items()):
            if not part.restored:
                continue
            count = self._feed_part(part, feed_batch, fed.rejected)
            if part.replaying and self._replay_fed(part):
                part.replaying = False
                part.merger.end_replay()
                log.info("partition %d: replay fed up to %s", p, part.replay_end)
                count += self._feed_part(part, feed_batch, fed.rejected)
            if count:
                fed.counts[p] = count
            for kind in list(part.merge_paused):
                if part.merger.buffered(kind) <= MERGE_BUFFER_CAP // 2:
                    part.merge_paused.discard(kind)
                    if self.tp(kind, p) not in self.held:
                        fed.resume.append(self.tp(kind, p))
        return fed

    def _feed_part(
        self, part: InputPartition, feed_batch: FeedBatch, rejected: list[Rejected]
    ) -> int:
        """One engine call with what the merge of ``part`` releases; returns how many."""
        runs = part.merger.release_runs(self.caught_up(part))
        if not runs:
            return 0
        # one engine call per partition and cycle: feed_batch pays its setup per call
        fed_next = part.fed_next
        records: list[Any] = []
        kinds: list[str] = []
        for kind, run in runs:
            records += run
            kinds += repeat(kind, len(run))
            fed_next[kind] = run[-1].offset + 1
        rejections = feed_batch(
            [record.value or b"" for record in records],
            partition=part.partition,
            kinds=kinds,
            offsets=[record.offset for record in records],
            timestamps=[record.timestamp for record in records],
        )
        for position, rejection in rejections:
            rejected.append((rejection, records[position], kinds[position]))
        return len(records)

    @staticmethod
    def _replay_fed(part: InputPartition) -> bool:
        """Every record below the replay end is fetched and none is left in the merge (while
        replaying it holds only replayed records; an offset gap may skip the last ones)."""
        return all(
            part.fetched_next[kind] >= part.replay_end.get(kind, 0)
            and not part.merger.merging(kind)
            for kind in KINDS
        )

    # -- backpressure ---------------------------------------------------------------------

    def feedback_waiting(self) -> bool:
        """Feedback is buffered, or fetchable, on a restored partition."""
        consumer = self._consumer
        assert consumer is not None
        for p, part in self.parts.items():
            if not part.restored:
                continue
            if part.merger.buffered("feedback"):
                return True
            high = consumer.highwater(self.tp("feedback", p))
            if high is not None and part.fetched_next["feedback"] < high:
                return True
        return False

    def hold_impressions(self) -> list[TopicPartition]:
        """Hold the impressions of every restored partition (backpressure); returns the
        fetches to pause. A partition still fetching its replay is not held: the replayed
        impressions were pending before the restart, and the other topic's replayed records
        wait for them."""
        pause = [
            self.tp("impression", p)
            for p, part in self.parts.items()
            if part.restored
            and part.fetched_next["impression"] >= part.replay_end.get("impression", 0)
        ]
        self.held = set(pause)
        return pause

    def release_impressions(self) -> list[TopicPartition]:
        """Release what :meth:`hold_impressions` held; returns the fetches to resume (not those
        a merge buffer still holds)."""
        resume = [
            tp
            for tp in self.held
            if tp.partition in self.parts
            and "impression" not in self.parts[tp.partition].merge_paused
        ]
        self.held = set()
        return resume
