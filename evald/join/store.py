"""JoinStore: the event-time windowed join of one input partition.

Impressions wait in a compact pending store until the partition's watermark reaches their
deadline (``window.deadline``); feedback is attached to them as it arrives and turned into
grades only when they close (vectorised over the closed batch). Each event is joined first,
then the watermark advances and closes whatever is due, so the outcome depends only on the
partition's event order. docs/semantics.md states every rule.

The parts, one module each: ``window`` (the closing rule), ``clock`` (the watermark),
``pending`` (impression columns and arenas), ``feedback`` (attached and held feedback),
``rid_table``, ``queues`` and ``offset_log`` (the low-level structures). This class composes
them and owns the decisions between them (duplicates, the cap, what closes when).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from evald.events import Feedback, Impression
from evald.join.clock import EventTimes, PartitionClock
from evald.join.feedback import AttachedFeedback, HeldEntry, HeldFeedback
from evald.join.offset_log import OffsetLog
from evald.join.pending import PendingImpressions
from evald.join.queues import DeadlineQueue, IntFifo
from evald.join.rid_table import NONE, RidTable
from evald.join.window import deadline, is_closed, misses_window, open_deadline
from evald.segments import LabelTable
from evald.stats import Stats

_BIG = 1 << 62  # "no deadline"

#: the ``Stats.events`` keys the join counts its outcomes under
IMPRESSION_ACCEPTED = ("impression", "accepted")
IMPRESSION_DUPLICATE = ("impression", "duplicate")
FEEDBACK_ACCEPTED = ("feedback", "accepted")
FEEDBACK_DUPLICATE = ("feedback", "duplicate")


@dataclass(slots=True)
class Closed:
    """Impressions closed by the watermark, the cap or a drain, ready to be scored."""

    slots: list[int]
    reasons: list[str]


@dataclass(slots=True)
class Joined:
    """A scored-ready batch: served grades per closed impression, in closing order."""

    request_ids: list[str]
    clusters: np.ndarray  # uint64 (n,): the user's cluster key, 0: no user id (or not kept)
    ts: np.ndarray  # int64 (n,)
    label_ids: list[int]
    segment_ids: np.ndarray  # intp (n,)
    labels: list[dict[str, str]]
    grades: np.ndarray  # float64 (n, width), 0-padded
    lengths: np.ndarray  # int64 (n,)
    reasons: list[str]


@dataclass(slots=True)
class Replay:
    """What a restore re-feeds. ``until``: kind -> first offset not seen before the crash
    (None: not restoring). ``evicted``: source offsets of impressions the cap closed (emitted
    before their window closed), which a replay from below them must not open again."""

    until: dict[str, int] | None = None
    evicted: set[int] = field(default_factory=set)


class JoinStore:
    """Pending impressions, attached and held feedback, and the watermark of one partition."""

    def __init__(
        self,
        partition: int,
        *,
        window: int,
        lateness: int,
        idle_timeout: int,
        quorum: int,
        max_pending: int,
        open_total: list[int],
        evict: Callable[[JoinStore], None],
        max_held: int,
        labels: LabelTable,
        stats: Stats,
        clock: Callable[[], float],
        user_cluster: Callable[[str], int] | None = None,
    ) -> None:
        """``user_cluster``: the cluster key of a user id, kept per pending impression for the
        clustered interval; None: not needed (no bootstrap), nothing is kept."""
        self.partition = partition
        self.window = window
        self.max_pending = max_pending
        #: open impressions over every partition of the engine (shared, one element)
        self._open_total = open_total
        self._evict = evict
        self.labels, self.stats, self._clock = labels, stats, clock
        self._wm = PartitionClock(
            lateness=lateness, quorum=quorum, idle_timeout=idle_timeout, clock=clock, stats=stats
        )
        self._due = _BIG  # earliest deadline in either queue (cached: checked on every event)
        self._table = RidTable()
        self._pending = PendingImpressions()
        self._queue: DeadlineQueue[int] = DeadlineQueue(self._deadline_of_slot, IntFifo())
        self._closed = Closed([], [])
        self.first_close_wall: float | None = None
        self._attached = AttachedFeedback()
        self._held = HeldFeedback(max_held)
        self._imp_offsets = OffsetLog()  # source offsets of pending impressions
        self._replay = Replay()
        self._kernel = self._bind_kernel(user_cluster)

    @property
    def replay_until(self) -> dict[str, int] | None:
        """Restore mode: kind -> first offset not seen before the crash; None otherwise."""
        return self._replay.until

    def _deadline_of_slot(self, slot: int) -> int:
        return deadline(self._pending.ts[slot], self.window)

    # ------------------------------------------------------------------ sizes

    @property
    def watermark(self) -> int | None:
        return self._wm.watermark

    @property
    def held(self) -> int:
        """Feedback held because its impression has not arrived (yet)."""
        return len(self._held)

    def held_request_id_count(self) -> int:
        """Request ids with held feedback (0 once every held entry is claimed or expired)."""
        return self._held.waiting()

    def pending(self) -> int:
        """Impressions held in memory: open plus closed-but-not-yet-scored."""
        return len(self._table) + len(self._closed.slots)

    def open(self) -> int:
        return len(self._table)

    # ------------------------------------------------------------------ events

    def _bind_kernel(self, user_cluster: Callable[[str], int] | None) -> tuple[Any, ...]:
        """What ``join_many`` reads on every event, bound once: the parts are never replaced
        (they grow inside), so their bound methods stay valid for the store's life."""
        pending, table = self._pending, self._table
        return (
            self.window,
            self.max_pending,
            self._open_total,
            self._wm,
            table.get,
            table.insert,
            pending,
            pending.new_slot,
            pending.fill,
            self.labels.acquire,
            self._queue.push,
            self._attach,
            self._held,
            self.stats.events,
            user_cluster,
        )

    def join_many(
        self,
        events: Iterable[tuple[int, Impression | Feedback]],
        offsets: Sequence[int] | None,
        grades: dict[str, float],
    ) -> None:
        """Join decoded (position, event) pairs in order: the one implementation of the join
        (``Engine.feed`` passes a batch of one). Counts each event's outcome in
        ``stats.events`` unless a restore re-fed it. ``offsets[position]`` is an event's
        source offset; ``grades`` maps actions to default grades (feedback without its own
        ``grade``).

        Long because: this loop is most of the engine's cost, so the parts' methods are bound
        once per store (``_bind_kernel``) and the per-event steps run inline instead of through
        one method per event kind (docs/performance.md §1); rare cases (held feedback, the cap,
        a restore) call out.
        """
        until = self._replay.until
        (
            window,
            max_pending,
            open_total,
            clock,
            table_get,
            table_insert,
            pending,
            new_slot,
            fill,
            acquire,
            push,
            attach,
            held,
            counts,
            user_cluster,
        ) = self._kernel
        see = clock.see
        for position, event in events:
            offset = None if offsets is None else offsets[position]
            ts = event.ts
            if isinstance(event, Feedback):
                replayed = (
                    until is not None and offset is not None and offset < until.get("feedback", -1)
                )
                grade = event.grade
                if grade is None:
                    grade = grades[event.action]
                evid = 0 if event.event_id is None else hash(event.event_id) or 1
                off = 0 if offset is None else offset + 1
                slot = table_get(hash(event.request_id))
                if slot == NONE:
                    outcome = self._hold(event, grade, evid, off, replayed)
                else:
                    imp_ts = pending.ts[slot]
                    outcome = attach(slot, imp_ts, ts, hash(event.item), grade, evid, off, replayed)
                if not replayed:
                    counts[outcome] += 1
            else:
                replayed = (
                    until is not None
                    and offset is not None
                    and offset < until.get("impression", -1)
                )
                due = open_deadline(ts, window, clock.watermark)  # None: closed already
                if replayed and (due is None or offset in self._replay.evicted):
                    continue  # re-fed, and emitted before the crash
                rid = event.request_id
                key = hash(rid)
                if open_total[0] >= max_pending:
                    if table_get(key) != NONE:
                        if not replayed:
                            counts[IMPRESSION_DUPLICATE] += 1
                        continue
                    self._evict(self)
                slot = new_slot()
                if table_insert(key, slot) != NONE:
                    pending.free_slot(slot)
                    if not replayed:
                        counts[IMPRESSION_DUPLICATE] += 1
                    continue
                user = event.user_id
                cluster = user_cluster(user) if user and user_cluster is not None else 0
                fill(slot, ts, key, acquire(event.labels), event.items, rid, cluster)
                if offset is not None:
                    pending.offset[slot] = offset + 1
                    self._imp_offsets.push(offset, slot)
                open_total[0] += 1
                for entry in held.claim(rid) if held.count else ():
                    attach(
                        slot,
                        ts,
                        entry.ts,
                        entry.item,
                        entry.grade,
                        entry.evid,
                        entry.offset,
                        entry.replayed,
                    )
                if due is None:  # late (a replayed one was skipped above)
                    self._close(slot, "late")
                else:
                    push(due, slot)
                    if due < self._due:
                        self._due = due
                if not replayed:
                    counts[IMPRESSION_ACCEPTED] += 1
            mark = see(ts, replayed)  # joined first, then the watermark moves
            if mark is not None and is_closed(self._due, mark):
                self._close_due(mark)

    def _attach(
        self,
        slot: int,
        imp_ts: int,
        ts: int,
        item: int,
        grade: float,
        evid: int,
        off: int,
        replayed: bool,
    ) -> tuple[str, str]:
        """Attach feedback to the pending impression in ``slot`` if its window covers it."""
        miss = misses_window(imp_ts, ts, self.window)
        if miss is not None:
            if not replayed:
                self.stats.unattributed[miss] += 1
            return FEEDBACK_ACCEPTED
        pending = self._pending
        head = pending.head[slot]
        if evid and self._attached.has_event(head, evid):
            if not replayed:
                self.stats.unattributed["duplicate"] += 1
            return FEEDBACK_DUPLICATE
        pending.head[slot] = self._attached.add(head, item, grade, evid, off, replayed)
        return FEEDBACK_ACCEPTED

    def _hold(
        self, fb: Feedback, grade: float, evid: int, off: int, replayed: bool
    ) -> tuple[str, str]:
        """Feedback before its impression: keep it until its own deadline passes."""
        due = open_deadline(fb.ts, self.window, self._wm.watermark)
        if due is None:
            # no impression that could still arrive on time can claim it (docs/semantics.md)
            if not replayed:
                self.stats.unattributed["orphaned"] += 1
            return FEEDBACK_ACCEPTED
        rid = fb.request_id
        held = self._held
        if evid and held.has_event(rid, evid):
            if not replayed:
                self.stats.unattributed["duplicate"] += 1
            return FEEDBACK_DUPLICATE
        if held.full():
            self.stats.unattributed["orphaned"] += held.expire_oldest()
            self._refresh_due()
        held.add(HeldEntry(rid, fb.ts, hash(fb.item), grade, evid, off, replayed, due))
        if due < self._due:
            self._due = due
        return FEEDBACK_ACCEPTED

    # ------------------------------------------------------------------ watermark

    def event_times(self) -> EventTimes:
        """What the watermark's next moves depend on, for the checkpoint."""
        return self._wm.event_times()

    def _refresh_due(self) -> None:
        due = self._queue.min_deadline()
        held = self._held.min_deadline()
        self._due = min(_BIG if due is None else due, _BIG if held is None else held)

    def _close_due(self, mark: int) -> None:
        """Close every open impression and expire every held feedback due at ``mark``."""
        slots, due = self._queue.pop_due(mark)
        for slot in slots:
            self._close(slot, "window")
        held = self._held.min_deadline()
        if held is not None and is_closed(held, mark):
            self.stats.unattributed["orphaned"] += self._held.expire_due(mark)
            held = self._held.min_deadline()
        self._due = due if held is None or due <= held else held

    def set_watermark(self, mark: int) -> None:
        """Move the watermark forward (never back) and close everything now due."""
        if self._wm.advance(mark) is not None and is_closed(self._due, mark):
            self._close_due(mark)

    def idle(self, now: float) -> None:
        """Called on every tick: the idle fallback (``PartitionClock.idle``)."""
        mark = self._wm.idle(now)
        if mark is not None and is_closed(self._due, mark):
            self._close_due(mark)

    def restore(
        self,
        watermark: int | None,
        consumed: dict[str, int],
        event_times: EventTimes | None = None,
        evicted: Iterable[int] = (),
    ) -> None:
        """Start again after a crash: watermark as checkpointed, events before ``consumed`` are
        re-fed silently (see Engine.restore). With ``event_times`` (``event_times()`` at the
        checkpoint) re-fed events are not counted again: they are in it. Impressions at the
        ``evicted`` offsets were emitted by the cap and are skipped when re-fed."""
        self._replay.evicted.update(evicted)
        if event_times is not None:
            self._wm.restore_times(event_times)
        if watermark is not None:
            self.set_watermark(watermark)
        self._replay.until = dict(consumed)
        self._wm.restart()

    # ------------------------------------------------------------------ closing

    def evict_oldest(self) -> None:
        """At the cap: close this partition's open impression with the earliest deadline."""
        if self._queue:
            slot = self._queue.pop()
            offset = int(self._pending.offset[slot]) - 1
            if offset >= 0:
                self._replay.evicted.add(offset)
            self._close(slot, "cap")
            self._refresh_due()

    def _close(self, slot: int, reason: str) -> None:
        """Take an open impression out of the join; it is scored by the next take()."""
        self._table.remove(self._pending.key[slot])
        self._open_total[0] -= 1
        if not self._closed.slots and self.first_close_wall is None:
            self.first_close_wall = self._clock()
        self._closed.slots.append(slot)
        self._closed.reasons.append(reason)

    def close_all(self) -> None:
        """Drain: close every open impression now; held feedback is orphaned."""
        slots = self._queue.take_all_slots(self._pending.column("ts"), self.window)
        if slots:
            table = self._table
            if len(slots) == len(table):  # every open impression: one clear, no probe runs
                table.clear()
            else:
                key = self._pending.key
                for slot in slots:
                    table.remove(key[slot])
            self._open_total[0] -= len(slots)
            closed = self._closed
            if not closed.slots and self.first_close_wall is None:
                self.first_close_wall = self._clock()
            closed.slots.extend(slots)
            closed.reasons.extend(["drain"] * len(slots))
        self.stats.unattributed["orphaned"] += self._held.expire_all()
        self._refresh_due()

    def take(self, limit: int) -> Joined | None:
        """Remove up to ``limit`` closed impressions (closing order) and grade their items."""
        closed = self._closed
        if not closed.slots:
            return None
        slots, reasons = closed.slots[:limit], closed.reasons[:limit]
        del closed.slots[:limit], closed.reasons[:limit]
        if not closed.slots:
            self.first_close_wall = None
        pending = self._pending
        idx = np.asarray(slots, dtype=np.intp)
        items, mask, lengths = pending.items(idx)
        grades = np.zeros(items.shape, np.float64)
        heads = pending.column("head")[idx]
        self.stats.unattributed["unknown_item"] += self._attached.credit(heads, items, mask, grades)
        request_ids = pending.request_ids(idx)
        clusters = pending.clusters(idx)
        label_ids = pending.label_ids(idx)
        table = self.labels
        labels = cast("list[dict[str, str]]", [table.labels[i] for i in label_ids])  # live ids
        segment_ids = np.asarray([table.segment[i] for i in label_ids], dtype=np.intp)
        ts = pending.column("ts")[idx].copy()
        for label_id, count in Counter(label_ids).items():
            table.release(label_id, count)
        pending.release(slots)
        return Joined(
            request_ids, clusters, ts, label_ids, segment_ids, labels, grades, lengths, reasons
        )

    # ------------------------------------------------------------------ checkpoints

    def low_offsets(self) -> dict[str, int | None]:
        """Smallest source offset per kind still needed to rebuild this partition's state:
        pending impressions, the feedback attached to them, and held feedback."""
        held = self._held.offsets()
        attached = self._attached.low_offset()
        if attached is not None:
            held.append(attached)
        return {
            "impression": self._imp_offsets.low(self._pending.column("offset")),
            "feedback": min(held, default=None),
        }

    def evicted(self, since: int | None) -> list[int]:
        """Offsets (sorted) of impressions closed by the cap at or after ``since``, the
        impression offset a checkpoint replays from; older ones are forgotten (no replay
        reaches them). None: nothing will be replayed."""
        replay = self._replay
        if since is None:
            replay.evicted.clear()
        elif replay.evicted:
            replay.evicted = {o for o in replay.evicted if o >= since}
        return sorted(replay.evicted)

    def scanned_offsets(self) -> dict[str, list[int]]:
        """Every source offset the pending state still holds, by kind, found by a full scan:
        the slow reference ``low_offsets`` is checked against."""
        pending = self._pending
        live = pending.live_slots()
        imp = [int(o) - 1 for o in pending.column("offset")[live] if o > 0]
        fbs = [
            o
            for head in pending.column("head")[live].tolist()
            for o in self._attached.offsets(head)
        ]
        return {"impression": imp, "feedback": fbs + self._held.offsets()}
