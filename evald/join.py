"""JoinStore: the event-time windowed join of one input partition.

Impressions wait in a compact pending store until the partition's watermark reaches
``ts + window``; feedback is attached to them as it arrives and turned into grades only when
they close (vectorised over the closed batch). docs/semantics.md states every rule; in short:

* watermark = max event ts seen - lateness (never goes back); an idle fallback advances it
  with the wall clock. Each event is joined first, then the watermark advances and closes
  whatever is due, so the outcome depends only on the partition's event order.
* feedback counts for an impression when ``imp.ts <= fb.ts <= imp.ts + window``; feedback for
  an impression not seen yet is held until the watermark passes ``fb.ts + window``.

Memory layout, per pending impression: item ids as 64-bit hashes in one flat numpy arena
(``_items``, slot ``s`` owns ``_items[_start[s] : _start[s] + _len[s]]``), fixed-width numpy
columns per slot, the request id string as the key of one dict, and interned label dicts.
Attached feedback lives in numpy columns chained per slot. Nothing per item is a Python object.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from evald.events import Feedback, Impression
from evald.segments import LabelTable
from evald.stats import Stats

_NONE = -1


_BIG = 1 << 62  # "no deadline"


@dataclass(slots=True)
class Closed:
    """Impressions closed by the watermark, the cap or a drain, ready to be scored."""

    slots: list[int]
    reasons: list[str]


@dataclass(slots=True)
class Joined:
    """A scored-ready batch: served grades per closed impression, in closing order."""

    request_ids: list[str]
    ts: np.ndarray  # int64 (n,)
    label_ids: list[int]
    segment_ids: np.ndarray  # intp (n,)
    labels: list[dict[str, str]]
    grades: np.ndarray  # float64 (n, width), 0-padded
    lengths: np.ndarray  # int64 (n,)
    reasons: list[str]


class _Held:
    """Feedback waiting for its impression (a Python object: these are few and short-lived)."""

    __slots__ = ("alive", "deadline", "evid", "grade", "item", "offset", "replayed", "rid", "ts")

    def __init__(
        self,
        rid: str,
        ts: int,
        item: int,
        grade: float,
        evid: int,
        offset: int,
        replayed: bool,
        deadline: int,
    ) -> None:
        self.rid, self.ts, self.item, self.grade = rid, ts, item, grade
        self.evid, self.offset, self.replayed, self.deadline = evid, offset, replayed, deadline
        self.alive = True


class _DeadlineQueue:
    """Pop-in-deadline-order queue, O(1) for the common in-order arrivals.

    Values pushed with a deadline >= the last one go to a FIFO deque that stores only the
    value (its deadline is recomputed by ``deadline_of`` when it reaches the head, so an
    in-order pending impression costs one pointer here); earlier ones (out-of-order arrivals)
    go to a heap of (deadline, seq, value). The minimum is at the head of one of the two.
    """

    def __init__(self, deadline_of: Callable[[Any], int]) -> None:
        self.fifo: deque[Any] = deque()
        self.heap: list[tuple[int, int, Any]] = []
        self._deadline_of = deadline_of
        self._tail = -_BIG
        self._seq = 0

    def __len__(self) -> int:
        return len(self.fifo) + len(self.heap)

    def push(self, deadline: int, value: Any) -> None:
        if deadline >= self._tail:
            self.fifo.append(value)
            self._tail = deadline
        else:
            self._seq += 1
            heapq.heappush(self.heap, (deadline, self._seq, value))

    def min_deadline(self) -> int | None:
        fifo, heap = self.fifo, self.heap
        if fifo:
            head = self._deadline_of(fifo[0])
            return min(head, heap[0][0]) if heap else head
        return heap[0][0] if heap else None

    def pop(self) -> Any:
        fifo, heap = self.fifo, self.heap
        if heap and (not fifo or heap[0][0] < self._deadline_of(fifo[0])):
            return heapq.heappop(heap)[2]
        return fifo.popleft()


class JoinStore:
    """Pending impressions, attached and held feedback, and the watermark of one partition."""

    def __init__(
        self,
        partition: int,
        *,
        window: int,
        lateness: int,
        idle_timeout: int,
        max_pending: int,
        open_total: list[int],
        evict: Callable[[JoinStore], None],
        max_held: int,
        labels: LabelTable,
        stats: Stats,
        clock: Callable[[], float],
    ) -> None:
        self.partition = partition
        self.window, self.lateness, self.idle_timeout = window, lateness, idle_timeout
        self.max_pending, self.max_held = max_pending, max_held
        #: open impressions over every partition of the engine (shared, one element)
        self._open_total = open_total
        self._evict = evict
        self.labels, self.stats, self._clock = labels, stats, clock
        # watermark
        self.watermark: int | None = None
        self.max_ts: int | None = None
        self._last_event_wall = clock()  # wall time of the tick that first saw the last event
        self._wm_at_last_event: int | None = None
        self._fresh = False  # events arrived since the last tick
        self._due = _BIG  # earliest deadline in either queue (cached: checked on every event)
        # pending impressions
        self._index: dict[str, int] = {}
        self._rid: list[str | None] = []
        cap = 1024
        self._ts = np.zeros(cap, np.int64)
        self._start = np.zeros(cap, np.int64)
        self._len = np.zeros(cap, np.int32)
        self._label = np.zeros(cap, np.int32)
        self._offset = np.full(cap, _NONE, np.int64)
        self._head = np.full(cap, _NONE, np.int32)  # first attached feedback entry
        self._used = np.zeros(cap, np.bool_)
        self._free_slots: list[int] = []
        self._items = np.zeros(16 * cap, np.int64)
        self._items_end = 0
        self._items_live = 0
        self._queue = _DeadlineQueue(lambda slot: int(self._ts[slot]) + self.window)
        self._closed = Closed([], [])
        self.first_close_wall: float | None = None
        # attached feedback entries (chained per slot)
        fcap = 1024
        self._fb_item = np.zeros(fcap, np.int64)
        self._fb_grade = np.zeros(fcap, np.float64)
        self._fb_next = np.full(fcap, _NONE, np.int32)
        self._fb_evid = np.zeros(fcap, np.int64)
        self._fb_offset = np.full(fcap, _NONE, np.int64)
        self._fb_live = np.zeros(fcap, np.bool_)
        self._fb_replayed = np.zeros(fcap, np.bool_)
        self._fb_free: list[int] = []
        self._fb_top = 0
        # held (early) feedback
        self._held: dict[str, list[_Held]] = {}
        self._held_queue = _DeadlineQueue(lambda held: held.deadline)
        self.held = 0
        # restore mode: kind -> first offset not seen before the crash
        self.replay_until: dict[str, int] | None = None

    # ------------------------------------------------------------------ sizes

    def pending(self) -> int:
        """Impressions held in memory: open plus closed-but-not-yet-scored."""
        return len(self._index) + len(self._closed.slots)

    def open(self) -> int:
        return len(self._index)

    def is_replayed(self, kind: str, offset: int | None) -> bool:
        """True for an event re-fed after a restart that was seen before the crash."""
        until = self.replay_until
        if until is None or offset is None:
            return False
        return offset < until.get(kind, -1)

    # ------------------------------------------------------------------ impressions

    def add_impression(self, imp: Impression, offset: int | None, replayed: bool) -> str:
        """Join one impression; returns "accepted", "duplicate" or "skipped" (re-fed, done)."""
        ts = imp.ts
        deadline = ts + self.window
        wm = self.watermark
        if replayed and wm is not None and deadline <= wm:
            return "skipped"
        rid = imp.request_id
        index = self._index
        if rid in index:
            return "duplicate"
        if self._open_total[0] >= self.max_pending:
            self._evict(self)
        items = imp.items
        n = len(items)
        slot = self._alloc_slot(n)
        index[rid] = slot
        self._open_total[0] += 1
        self._rid[slot] = rid
        self._ts[slot] = ts
        self._label[slot] = self.labels.acquire(imp.labels)
        if offset is not None:
            self._offset[slot] = offset
        if n:
            start = self._items_end - n
            self._items[start : self._items_end] = list(map(hash, items))
        if self._held:
            held = self._held.pop(rid, None)
            if held is not None:
                self._attach_held(slot, ts, held)
        if wm is not None and deadline <= wm:
            if not replayed:
                self.stats.late_impressions += 1
            del index[rid]
            self._open_total[0] -= 1
            self._close(slot, "window")
        else:
            self._queue.push(deadline, slot)
            if deadline < self._due:
                self._due = deadline
        self._fresh = True
        if self.max_ts is None or ts > self.max_ts:
            self.max_ts = ts
            mark = ts - self.lateness
            if wm is None or mark > wm:
                self.watermark = mark
                if mark >= self._due:
                    self._close_due(mark)
        return "accepted"

    def _alloc_slot(self, n: int) -> int:
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = len(self._rid)
            self._rid.append(None)
            if slot >= len(self._ts):
                self._grow_slots()
        if self._items_end + n > len(self._items):
            self._make_room(n)
        self._start[slot] = self._items_end
        self._len[slot] = n
        self._used[slot] = True  # _head and _offset were reset when the slot was freed
        self._items_end += n
        self._items_live += n
        return slot

    def _grow_slots(self) -> None:
        cap = len(self._ts) * 2

        def grow(a: np.ndarray, fill: int) -> np.ndarray:
            out = np.full(cap, fill, a.dtype)
            out[: len(a)] = a
            return out

        self._ts, self._start = grow(self._ts, 0), grow(self._start, 0)
        self._len, self._label = grow(self._len, 0), grow(self._label, 0)
        self._offset, self._head = grow(self._offset, _NONE), grow(self._head, _NONE)
        self._used = grow(self._used, 0)

    def _make_room(self, n: int) -> None:
        """Compact the item arena if half of it is garbage, else double it."""
        cap = len(self._items)
        if (self._items_live + n) * 2 > cap:
            cap = max(cap * 2, (self._items_live + n) * 2)
        slots = np.flatnonzero(self._used)
        slots = slots[np.argsort(self._start[slots], kind="stable")]
        lens = self._len[slots].astype(np.int64)
        total = int(lens.sum())
        new_start = np.zeros(len(slots), np.int64)
        if len(slots):
            np.cumsum(lens[:-1], out=new_start[1:])
        src = np.repeat(self._start[slots] - new_start, lens) + np.arange(total)
        items = np.zeros(cap, np.int64)
        items[:total] = self._items[src]
        self._items = items
        self._start[slots] = new_start
        self._items_end = total

    def evict_oldest(self) -> None:
        """At the cap: close this partition's open impression with the earliest deadline."""
        while self._queue:
            slot = self._queue.pop()
            rid = self._rid[slot]  # type: ignore[index]
            if rid is not None and self._index.get(rid) == slot:
                del self._index[rid]
                self._open_total[0] -= 1
                self._close(slot, "cap")
                self._refresh_due()
                return

    def _close(self, slot: int, reason: str) -> None:
        if not self._closed.slots and self.first_close_wall is None:
            self.first_close_wall = self._clock()
        self._closed.slots.append(slot)
        self._closed.reasons.append(reason)

    # ------------------------------------------------------------------ feedback

    def add_feedback(self, fb: Feedback, grade: float, offset: int | None, replayed: bool) -> str:
        """Join one feedback event; returns "accepted" or "duplicate" (repeated event_id)."""
        ts = fb.ts
        evid = 0 if fb.event_id is None else hash(fb.event_id)
        off = _NONE if offset is None else offset
        slot = self._index.get(fb.request_id)
        if slot is None:
            outcome = self._hold(fb, grade, evid, off, replayed)
        else:
            outcome = self._attach(
                slot, int(self._ts[slot]), ts, hash(fb.item), grade, evid, off, replayed
            )
        self._fresh = True
        if self.max_ts is None or ts > self.max_ts:
            self.max_ts = ts
            mark = ts - self.lateness
            wm = self.watermark
            if wm is None or mark > wm:
                self.watermark = mark
                if mark >= self._due:
                    self._close_due(mark)
        return outcome

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
    ) -> str:
        if ts < imp_ts:
            if not replayed:
                self.stats.unattributed["early"] += 1
            return "accepted"
        if ts > imp_ts + self.window:
            if not replayed:
                self.stats.unattributed["late"] += 1
            return "accepted"
        head = int(self._head[slot])
        if evid:
            entry = head
            while entry != _NONE:
                if self._fb_evid[entry] == evid:
                    if not replayed:
                        self.stats.unattributed["duplicate"] += 1
                    return "duplicate"
                entry = int(self._fb_next[entry])
        if self._fb_free:
            entry = self._fb_free.pop()
        else:
            entry = self._fb_top
            self._fb_top += 1
            if entry >= len(self._fb_item):
                self._grow_feedback()
        self._fb_item[entry] = item
        self._fb_grade[entry] = grade
        self._fb_evid[entry] = evid
        self._fb_offset[entry] = off
        self._fb_live[entry] = True
        self._fb_replayed[entry] = replayed
        self._fb_next[entry] = head
        self._head[slot] = entry
        return "accepted"

    def _grow_feedback(self) -> None:
        cap = len(self._fb_item) * 2

        def grow(a: np.ndarray, fill: float) -> np.ndarray:
            out = np.full(cap, fill, a.dtype)
            out[: len(a)] = a
            return out

        self._fb_item, self._fb_grade = grow(self._fb_item, 0), grow(self._fb_grade, 0.0)
        self._fb_next, self._fb_evid = grow(self._fb_next, _NONE), grow(self._fb_evid, 0)
        self._fb_offset, self._fb_live = grow(self._fb_offset, _NONE), grow(self._fb_live, 0)
        self._fb_replayed = grow(self._fb_replayed, 0)

    def _hold(self, fb: Feedback, grade: float, evid: int, off: int, replayed: bool) -> str:
        """Feedback before its impression: keep it until fb.ts + window passes the watermark."""
        deadline = fb.ts + self.window
        wm = self.watermark
        if wm is not None and deadline <= wm:
            # no impression that could still arrive on time can claim it (docs/semantics.md)
            if not replayed:
                self.stats.unattributed["orphaned"] += 1
            return "accepted"
        rid = fb.request_id
        waiting = self._held.get(rid)
        if evid and waiting and any(h.alive and h.evid == evid for h in waiting):
            if not replayed:
                self.stats.unattributed["duplicate"] += 1
            return "duplicate"
        if self.held >= self.max_held:
            self._expire_held(None, count_one=True)
            self._refresh_due()
        entry = _Held(rid, fb.ts, hash(fb.item), grade, evid, off, replayed, deadline)
        if waiting is None:
            self._held[rid] = [entry]
        else:
            waiting.append(entry)
        self._held_queue.push(deadline, entry)
        if deadline < self._due:
            self._due = deadline
        self.held += 1
        return "accepted"

    def _attach_held(self, slot: int, imp_ts: int, held: list[_Held]) -> None:
        for entry in held:
            if entry.alive:
                entry.alive = False
                self.held -= 1
                self._attach(
                    slot,
                    imp_ts,
                    entry.ts,
                    entry.item,
                    entry.grade,
                    entry.evid,
                    entry.offset,
                    entry.replayed,
                )

    def _expire_held(self, watermark: int | None, *, count_one: bool = False) -> None:
        """Count held feedback as orphaned: all due at ``watermark``, or the oldest one."""
        queue = self._held_queue
        while queue:
            deadline = queue.min_deadline()
            assert deadline is not None
            if not count_one and (watermark is None or deadline > watermark):
                return
            entry: _Held = queue.pop()
            if not entry.alive:
                continue
            entry.alive = False
            self.held -= 1
            waiting = self._held.get(entry.rid)
            if waiting is not None:
                waiting.remove(entry)
                if not waiting:
                    del self._held[entry.rid]
            if not entry.replayed:
                self.stats.unattributed["orphaned"] += 1
            if count_one:
                return

    # ------------------------------------------------------------------ watermark

    def _refresh_due(self) -> None:
        due = self._queue.min_deadline()
        held = self._held_queue.min_deadline()
        self._due = min(_BIG if due is None else due, _BIG if held is None else held)

    def _close_due(self, mark: int) -> None:
        """Close every open impression and expire every held feedback due at ``mark``."""
        queue = self._queue
        index, rids = self._index, self._rid
        due = queue.min_deadline()
        while due is not None and due <= mark:
            slot = queue.pop()
            rid = rids[slot]  # type: ignore[index]
            if rid is not None and index.get(rid) == slot:
                del index[rid]
                self._open_total[0] -= 1
                self._close(slot, "window")  # type: ignore[arg-type]
            due = queue.min_deadline()
        due = self._held_queue.min_deadline()
        if due is not None and due <= mark:
            self._expire_held(mark)
        self._refresh_due()

    def set_watermark(self, mark: int) -> None:
        """Move the watermark forward (never back) and close everything now due."""
        if self.watermark is not None and mark <= self.watermark:
            return
        self.watermark = mark
        if mark >= self._due:
            self._close_due(mark)

    def idle(self, now: float) -> None:
        """Called on every tick. Idle fallback: once the partition has had no event for
        ``idle_timeout`` of wall time, its watermark is the watermark it had after its last
        event plus the wall time elapsed since then (docs/semantics.md). The time of an event
        is taken as the time of the first tick after it."""
        if self._fresh:
            self._fresh = False
            self._last_event_wall = now
            self._wm_at_last_event = self.watermark
            return
        base = self._wm_at_last_event
        if base is None:
            return
        quiet_ms = int((now - self._last_event_wall) * 1000)
        if quiet_ms >= self.idle_timeout:
            self.set_watermark(base + quiet_ms)

    def restore(self, watermark: int | None, consumed: dict[str, int]) -> None:
        """Start again after a crash: watermark as checkpointed, events before ``consumed`` are
        re-fed silently (see Engine.restore)."""
        if watermark is not None:
            self.set_watermark(watermark)
        self._wm_at_last_event = self.watermark
        self.replay_until = dict(consumed)
        self._last_event_wall = self._clock()
        self._fresh = False

    # ------------------------------------------------------------------ finalization

    def close_all(self) -> None:
        """Drain: close every open impression now; held feedback is orphaned."""
        queue = self._queue
        while queue:
            slot = queue.pop()
            rid = self._rid[slot]  # type: ignore[index]
            if rid is not None and self._index.get(rid) == slot:
                del self._index[rid]
                self._open_total[0] -= 1
                self._close(slot, "drain")  # type: ignore[arg-type]
        while self._held_queue:
            self._expire_held(None, count_one=True)
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
        idx = np.asarray(slots, dtype=np.intp)
        lengths = self._len[idx].astype(np.int64)
        width = max(int(lengths.max(initial=0)), 1)
        cols = np.arange(width)
        mask = cols < lengths[:, None]
        pos = np.where(mask, self._start[idx][:, None] + cols, 0)
        items = self._items[pos]
        grades = np.zeros((len(slots), width), np.float64)
        rows: list[int] = []
        entries: list[int] = []
        heads = self._head[idx].tolist()
        fb_next = self._fb_next
        for row, entry in enumerate(heads):
            while entry != _NONE:
                rows.append(row)
                entries.append(entry)
                entry = int(fb_next[entry])
        if entries:
            e = np.asarray(entries, dtype=np.intp)
            r = np.asarray(rows, dtype=np.intp)
            hit = (items[r] == self._fb_item[e][:, None]) & mask[r]
            col = hit.argmax(axis=1)  # an item served twice is credited at its first rank
            matched = hit[np.arange(len(e)), col]
            missing = ~matched & ~self._fb_replayed[e]
            self.stats.unattributed["unknown_item"] += int(missing.sum())
            np.maximum.at(grades, (r[matched], col[matched]), self._fb_grade[e][matched])
            self._fb_live[e] = False
            self._fb_free.extend(entries)
        request_ids = [self._rid[s] for s in slots]
        label_ids = self._label[idx].tolist()
        labels = [self.labels.labels[i] for i in label_ids]
        segment_ids = np.asarray([self.labels.segment[i] for i in label_ids], dtype=np.intp)
        ts = self._ts[idx].copy()
        for slot, label_id in zip(slots, label_ids, strict=True):
            self._rid[slot] = None
            self.labels.release(label_id)
        self._used[idx] = False
        self._head[idx] = _NONE
        self._offset[idx] = _NONE
        self._items_live -= int(lengths.sum())
        self._free_slots.extend(slots)
        return Joined(request_ids, ts, label_ids, segment_ids, labels, grades, lengths, reasons)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ checkpoints

    def low_offsets(self) -> dict[str, int | None]:
        """Smallest source offset per kind still needed to rebuild this partition's state."""
        imp_off = self._offset[: len(self._rid)][self._used[: len(self._rid)]]
        imp_off = imp_off[imp_off >= 0]
        top = self._fb_top
        fb_off = self._fb_offset[:top][self._fb_live[:top]]
        fb_off = fb_off[fb_off >= 0]
        held = [
            h.offset
            for waiting in self._held.values()
            for h in waiting
            if h.alive and h.offset >= 0
        ]
        low_fb = min([*([int(fb_off.min())] if len(fb_off) else []), *held], default=None)
        return {
            "impression": int(imp_off.min()) if len(imp_off) else None,
            "feedback": low_fb,
        }
