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

from evald.events import Feedback, Impression, Shown
from evald.input_rule import blank
from evald.interleaving.teams import Teams
from evald.join.clock import EventTimes, PartitionClock
from evald.join.feedback import AttachedFeedback, HeldEntry, HeldFeedback
from evald.join.lists import Lists, OpenList, widen
from evald.join.offset_log import OffsetLog
from evald.join.pending import PendingImpressions
from evald.join.queries import QueryTable
from evald.join.queues import DeadlineQueue, IntFifo
from evald.join.replay_marks import ReplayMarks
from evald.join.rid_table import NONE, RidTable
from evald.join.window import deadline, is_closed, misses_window, open_deadline
from evald.query import QueryNormalizer
from evald.segments import LabelTable
from evald.stats import Stats

_BIG = 1 << 62  # "no deadline"
_MAX_PENDING = 1  # where the kernel (``JoinStore._bind_kernel``) holds max_pending

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
    #: per row the teams of an interleaved list (None: not interleaved); None: no row is
    teams: list[Teams | None] | None = None
    #: the normalised query of each list (evald.query; "": none)
    queries: list[str] = field(default_factory=list)
    #: with ``key_depth``: the stable keys (evald.join.item_keys) of each list's first items,
    #: 0-padded (n, key_depth), and how many each list has; None: not kept
    item_keys: np.ndarray | None = None
    key_lengths: np.ndarray | None = None


@dataclass(slots=True)
class Replay:
    """What a restore re-feeds. ``until``: kind -> first offset not seen before the crash
    (None: not restoring). ``evicted``: source offsets of impressions the cap closed (emitted
    before their window closed) or that were ignored as repeats, which a replay from below
    them must not open again; ``evicted_feedback``: the same for shown items (the records of
    lists of several records, docs/design.md). ``marks``: what this life decided that a later
    replay must skip (``ReplayMarks``), for the next checkpoints. ``held``: offsets of the
    feedback that was held at the checkpoint, whose outcome (orphaned, early, late, duplicate)
    is still to be counted when it is re-fed and held again; each leaves the set when it is
    re-fed."""

    marks: ReplayMarks
    until: dict[str, int] | None = None
    evicted: set[int] = field(default_factory=set)
    evicted_feedback: set[int] = field(default_factory=set)
    held: set[int] = field(default_factory=set)

    def skipped(self, kind: str) -> set[int]:
        return self.evicted if kind == "impression" else self.evicted_feedback


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
        merge: bool = False,
        max_items: int = 1000,
        max_query_length: int = 100,
        key_depth: int = 0,
    ) -> None:
        """``user_cluster``: the cluster key of a user id, kept per pending impression for the
        clustered interval; None: not needed (no bootstrap), nothing is kept. ``merge``: the
        records of one request id make one list (a mapping's ``repeats: merge`` or
        ``shown_actions``; docs/mapping.md), a list then has at most ``max_items`` shown items.
        ``max_query_length``: the bound of the query rule (evald/query.py). ``key_depth``: the
        first items of each list whose stable keys ``take`` hands out (0: none)."""
        self.partition = partition
        self.window = window
        #: open impressions over every partition of the engine (shared, one element)
        self._open_total = open_total
        self._evict = evict
        self.labels, self.stats, self._clock = labels, stats, clock
        self._wm = PartitionClock(
            lateness=lateness, quorum=quorum, idle_timeout=idle_timeout, clock=clock, stats=stats
        )
        self._due = _BIG  # earliest deadline in either queue (cached: checked on every event)
        self._table = RidTable()
        self._pending = PendingImpressions(
            queries=QueryTable(QueryNormalizer(max_query_length)), key_depth=key_depth
        )
        self._queue: DeadlineQueue[int] = DeadlineQueue(self._deadline_of_slot, IntFifo())
        self._closed = Closed([], [])
        self.first_close_wall: float | None = None
        self._attached = AttachedFeedback()
        self._held = HeldFeedback(max_held)
        self._imp_offsets = OffsetLog()  # source offsets of pending impressions
        self._replay = Replay(ReplayMarks(window))
        #: the open lists of several records; None: every record is a list of its own
        self._lists = Lists(self._replay.marks, max_items, user_cluster) if merge else None
        self._kernel = self._bind_kernel(user_cluster, max_pending)

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
    def behind(self) -> int:
        """Events that came behind the watermark (``PartitionClock.behind``)."""
        return self._wm.behind

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

    def oldest_open(self) -> int | None:
        """Event time of the oldest impression still waiting for its window; None: none."""
        due = self._queue.min_deadline()
        return None if due is None else due - self.window

    # ------------------------------------------------------------------ events

    def _bind_kernel(
        self, user_cluster: Callable[[str], int] | None, max_pending: int
    ) -> tuple[Any, ...]:
        """What ``join_many`` reads on every event, bound once: the parts are never replaced
        (they grow inside), so their bound methods stay valid for the store's life."""
        pending, table = self._pending, self._table
        return (
            self.window,
            max_pending,
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
            self._lists,
            self._pending.queries.acquire,
        )

    def join_many(
        self,
        events: Iterable[tuple[int, Impression | Feedback | Shown]],
        offsets: Sequence[int] | None,
        grades: dict[str, float],
        refused: list[tuple[int, str, str, str]] | None = None,
    ) -> None:
        """Join decoded (position, event) pairs in order: the one implementation of the join
        (``Engine.feed`` passes a batch of one). Counts each event's outcome in
        ``stats.events`` unless a restore re-fed it. ``offsets[position]`` is an event's
        source offset; ``grades`` maps actions to default grades (feedback without its own
        ``grade``). With lists of several records (``merge``), a record the join refuses (a
        second, different list for a request id) is appended to ``refused`` as (position,
        reason, detail, kind) for the caller to count and keep, unless a restore re-fed it.

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
            lists,
            query_of,
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
                eid = event.event_id  # a blank one is none (docs/semantics.md, "Identifiers")
                evid = 0 if eid is None or blank(eid) else hash(eid) or 1
                off = 0 if offset is None else offset + 1
                slot = table_get(hash(event.request_id))
                if slot == NONE:
                    outcome = self._hold(event, grade, evid, off, replayed)
                else:
                    imp_ts = pending.ts[slot]
                    outcome = attach(slot, imp_ts, ts, hash(event.item), grade, evid, off, replayed)
                if not replayed:
                    counts[outcome] += 1
            elif lists is not None and (
                event.__class__ is Shown or table_get(hash(event.request_id)) != NONE
            ):
                # a shown item, or a query record whose request id has an open list
                kind = "feedback" if event.__class__ is Shown else "impression"
                replayed = until is not None and offset is not None and offset < until.get(kind, -1)
                if not self._assembled(event, position, offset, replayed, refused):
                    continue
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
                        self._repeated(offset, ts, replayed)
                        continue
                    self._evict(self)
                slot = new_slot()
                if table_insert(key, slot) != NONE:
                    pending.free_slot(slot)
                    self._repeated(offset, ts, replayed)
                    continue
                # (a Shown took the branch above: ``__class__ is`` is cheap, mypy cannot see it)
                user = event.user_id  # type: ignore[union-attr]
                named = user is not None and not blank(user)  # a blank user id is none
                cluster = user_cluster(user) if named and user_cluster is not None else 0
                labels = acquire(event.labels)  # type: ignore[union-attr]
                query = query_of(event.query)  # type: ignore[union-attr]
                fill(slot, ts, key, labels, event.items, rid, cluster, query)  # type: ignore[union-attr]
                if event.teams is not None:  # type: ignore[union-attr]
                    pending.teams.give(slot, event)
                if offset is not None:
                    pending.offset[slot] = offset + 1
                    self._imp_offsets.push(offset, slot)
                open_total[0] += 1
                if held.replayed and not replayed:
                    self._replay_fed()
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

    def _repeated(self, offset: int | None, ts: int, replayed: bool) -> None:
        """An impression whose request id is pending: ignored and counted as a duplicate, and
        marked, so that a replay that re-feeds it after the first was emitted (its time is
        later) ignores it again instead of opening the request id a second time."""
        if offset is not None:
            self._replay.marks.add("impression", offset, ts)
        if not replayed:
            self.stats.events[IMPRESSION_DUPLICATE] += 1

    # ------------------------------------------------------------------ lists of several records

    def _assembled(
        self,
        event: Impression | Shown,
        position: int,
        offset: int | None,
        replayed: bool,
        refused: list[tuple[int, str, str, str]] | None,
    ) -> bool:
        """A record of a list of several records (docs/mapping.md): a shown item, or a query
        record whose request id has an open list. Returns whether it was accepted (then its
        time counts for the watermark)."""
        if isinstance(event, Shown):
            return self._show(event, position, offset, replayed, refused)
        slot = self._table.get(hash(event.request_id))
        return self._merge(slot, event, position, offset, replayed, refused)

    def _show(
        self,
        event: Shown,
        position: int,
        offset: int | None,
        replayed: bool,
        refused: list[tuple[int, str, str, str]] | None,
    ) -> bool:
        """A shown item joins its request's open list, or opens one if none is open and it is
        not late; a late one with no list is orphaned, like held feedback no list can claim."""
        lists = self._lists
        assert lists is not None
        counts = self.stats.events
        slot = self._table.get(hash(event.request_id))
        if slot == NONE:
            if self._held.replayed and not replayed:
                self._replay_fed()
            due = open_deadline(event.ts, self.window, self._wm.watermark)
            if replayed and (due is None or offset in self._replay.evicted_feedback):
                return False  # re-fed, and its list was emitted before the crash
            if due is None:
                self.stats.unattributed["orphaned"] += 1
                counts[FEEDBACK_ACCEPTED] += 1
                return True
            slot = self._open_shown(event, offset, due)
        entry = lists.of(slot, self._pending.offset[slot])
        if entry.count >= lists.max_items:
            if offset is not None:  # a replay after the list was emitted refuses it too
                lists.marks.add("feedback", offset, event.ts)
            if refused is not None and not replayed:
                detail = f"{event.request_id!r}: more than {lists.max_items} shown items"
                refused.append((position, "too_many_items", detail, "feedback"))
            return False
        off = 0 if offset is None else offset + 1
        entry.head = lists.shown.add(entry.head, hash(event.item), event.position, event.ts, off)
        entry.count += 1
        if not replayed:
            counts[FEEDBACK_ACCEPTED] += 1
        return True

    def _open_shown(self, event: Shown, offset: int | None, due: int) -> int:
        """A list opened by a shown item: no items, labels or user until a query record
        gives them; claims the feedback held for its request id."""
        lists = self._lists
        assert lists is not None
        if self._open_total[0] >= self._kernel[_MAX_PENDING]:
            self._evict(self)
        rid, ts = event.request_id, event.ts
        key = hash(rid)
        slot = self._pending.new_slot()
        self._table.insert(key, slot)
        self._pending.fill(slot, ts, key, self.labels.acquire({}), [], rid)
        self._open_total[0] += 1
        opener = None if offset is None else ("feedback", offset)
        lists.open[slot] = OpenList(opener, queried=False)
        for held in self._held.claim(rid) if self._held.count else ():
            self._attach(
                slot, ts, held.ts, held.item, held.grade, held.evid, held.offset, held.replayed
            )
        self._queue.push(due, slot)
        if due < self._due:
            self._due = due
        return slot

    def _merge(
        self,
        slot: int,
        event: Impression,
        position: int,
        offset: int | None,
        replayed: bool,
        refused: list[tuple[int, str, str, str]] | None,
    ) -> bool:
        """A query record whose request id has an open list: without items it adds nothing
        (but the labels, user and query of a list that has none from a query record yet);
        the first with items gives them; the same items again are a duplicate, other items
        a conflict (refused)."""
        lists, pending = self._lists, self._pending
        assert lists is not None
        entry = lists.of(slot, pending.offset[slot])
        if offset is not None:
            entry.joiners.append((offset, event.ts))
        counts = self.stats.events
        if event.items:
            if not pending.length(slot):
                pending.set_items(slot, event.items)
                if event.teams is not None:
                    pending.teams.give(slot, event)
                self._describe(slot, entry, event, offset)
            elif [hash(item) for item in event.items] == pending.item_hashes(slot):
                if not replayed:
                    counts[IMPRESSION_DUPLICATE] += 1
                return False
            else:
                if refused is not None and not replayed:
                    n = pending.length(slot)
                    detail = f"{event.request_id!r} already has a served list of {n} other items"
                    refused.append((position, "conflicting_list", detail, "impression"))
                return False
        elif not entry.queried:
            self._describe(slot, entry, event, offset)
        if not replayed:
            counts[IMPRESSION_ACCEPTED] += 1
        return True

    def _describe(self, slot: int, entry: OpenList, event: Impression, offset: int | None) -> None:
        """The list takes ``event``'s labels and user; its offset is then one to replay."""
        lists, pending, labels = self._lists, self._pending, self.labels
        assert lists is not None
        old = pending.label_of(slot)
        user = event.user_id  # a blank one is none
        named = lists.user_cluster is not None and user is not None and not blank(user)
        cluster = lists.user_cluster(user) if named else 0  # type: ignore[arg-type,misc]
        pending.relabel(slot, labels.acquire(event.labels), cluster)
        labels.release(old)
        old_query = pending.query_of(slot)
        pending.requery(slot, pending.queries.acquire(event.query))
        pending.queries.release(old_query)
        entry.queried = True
        if offset is not None and not pending.offset[slot]:
            pending.offset[slot] = offset + 1
            self._imp_offsets.push(offset, slot)

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
        pending.head[slot] = self._attached.add(head, item, grade, evid, off)
        return FEEDBACK_ACCEPTED

    def _hold(
        self, fb: Feedback, grade: float, evid: int, off: int, replayed: bool
    ) -> tuple[str, str]:
        """Feedback before its impression: keep it until its own deadline passes.

        Feedback a restore re-feeds that was held at the checkpoint (``_replay.held``) is
        held again as it was, undecided: its duplicate check was made when it first came, and
        made again now it would find the replay's copy of an earlier delivery (attached to an
        impression emitted before the checkpoint, so never held by an uninterrupted engine)."""
        if self._held.replayed and not replayed:
            self._replay_fed()
        undecided = replayed and off - 1 in self._replay.held
        if undecided:
            self._replay.held.discard(off - 1)
        due = open_deadline(fb.ts, self.window, self._wm.watermark)
        if due is None:
            # no impression that could still arrive on time can claim it (docs/semantics.md)
            if not replayed or undecided:
                self.stats.unattributed["orphaned"] += 1
            return FEEDBACK_ACCEPTED
        rid = fb.request_id
        held = self._held
        if evid and not undecided and held.has_event(rid, evid):
            if not replayed:
                self.stats.unattributed["duplicate"] += 1
            return FEEDBACK_DUPLICATE
        if held.full():
            self.stats.unattributed["orphaned"] += held.expire_oldest()
            self._refresh_due()
        counted = replayed and not undecided
        held.add(HeldEntry(rid, fb.ts, hash(fb.item), grade, evid, off, counted, due))
        if due < self._due:
            self._due = due
        return FEEDBACK_ACCEPTED

    def _replay_fed(self) -> None:
        """The first record past a restore's replay: the feedback the replay held again whose
        outcome was decided before the checkpoint goes (``HeldFeedback.forget_replayed``)."""
        self._held.forget_replayed()
        self._refresh_due()

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
        evicted_feedback: Iterable[int] = (),
        held_feedback: Iterable[int] = (),
    ) -> None:
        """Start again after a crash: watermark as checkpointed, events before ``consumed`` are
        re-fed silently (see Engine.restore). With ``event_times`` (``event_times()`` at the
        checkpoint) re-fed events are not counted again: they are in it. Impressions at the
        ``evicted`` offsets (and shown items at ``evicted_feedback``) open no list when re-fed:
        their list was emitted before (``evicted``). Feedback at the ``held_feedback`` offsets
        (``held_feedback()`` at the checkpoint) has its outcome counted when re-fed and held
        again; other re-fed feedback held again had its outcome counted before."""
        self._replay.evicted.update(evicted)
        self._replay.evicted_feedback.update(evicted_feedback)
        self._replay.held.update(held_feedback)
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
        self._replay.marks.prune(self._wm.watermark)
        pending = self._pending
        idx = np.asarray(slots, dtype=np.intp)
        items, mask, lengths = pending.items(idx)
        lists = self._lists
        if lists is not None and lists.open:
            times = pending.column("ts")[idx].tolist()
            rows = lists.taken(slots, reasons, lengths.tolist(), times)
            if rows:  # lists no record gave items to: their shown items, in position order
                items, mask, lengths = widen(items, mask, lengths, rows)
        teams = pending.teams.take(slots)
        keys = key_lengths = None
        if pending.keys is not None:
            keys, key_lengths = pending.keys.take(idx)
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
        query_ids = pending.query_ids(idx)
        queries = pending.queries
        texts = [queries.texts[q] for q in query_ids]
        for query_id, count in Counter(query_ids).items():
            queries.release(query_id, count)
        pending.release(slots)
        return Joined(
            request_ids,
            clusters,
            ts,
            label_ids,
            segment_ids,
            labels,
            grades,
            lengths,
            reasons,
            teams,
            texts,
            keys,
            key_lengths,
        )

    # ------------------------------------------------------------------ checkpoints

    def low_offsets(self) -> dict[str, int | None]:
        """Smallest source offset per kind still needed to rebuild this partition's state:
        pending impressions, the feedback attached to them, and held feedback."""
        held = self._held.offsets()
        attached = self._attached.low_offset()
        if attached is not None:
            held.append(attached)
        shown = None if self._lists is None else self._lists.shown.low_offset()
        if shown is not None:
            held.append(shown)
        return {
            "impression": self._imp_offsets.low(self._pending.column("offset")),
            "feedback": min(held, default=None),
        }

    def evicted(self, since: int | None, kind: str = "impression") -> list[int]:
        """Offsets (sorted) of records of ``kind`` at or after ``since``, the offset a
        checkpoint replays that kind from, that a replay must not let open a list: impressions
        closed by the cap, repeated impressions, and with lists of several records their other
        records once the list closed (``ReplayMarks``); older ones are forgotten (no replay
        reaches them). None: nothing will be replayed."""
        replay = self._replay
        skipped = replay.skipped(kind)
        if since is None:
            skipped.clear()
            return []
        if skipped:
            skipped.intersection_update([o for o in skipped if o >= since])
        marked = self._replay.marks.offsets(kind, since, self._wm.watermark)
        return sorted(skipped.union(marked))

    def held_feedback(self, since: int | None) -> list[int]:
        """Offsets (sorted) at or after ``since`` (the checkpoint's committed feedback offset)
        of the feedback held now whose outcome is still to be counted, and of the feedback a
        restore named so (``restore``'s ``held_feedback``) that its replay has not re-fed yet:
        what a restore from that checkpoint counts the outcome of. Older ones are forgotten
        (no replay reaches them); None: nothing will be replayed."""
        waiting = self._replay.held
        if since is None:
            waiting.clear()
            return []
        if waiting:
            waiting.intersection_update([o for o in waiting if o >= since])
        return sorted(waiting.union(self._held.uncounted_offsets()))

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
        if self._lists is not None:
            shown = self._lists.shown
            fbs += [o for entry in self._lists.open.values() for o in shown.offsets(entry.head)]
        return {"impression": imp, "feedback": fbs + self._held.offsets()}
