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

import numpy as np

from evald.events import Feedback, Impression
from evald.segments import LabelTable
from evald.stats import Stats

_NONE = -1


def _item_hash(item: str) -> int:
    """Process-local 64-bit id of an item; 0 is reserved for padding."""
    h = hash(item)
    return h if h else 1


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

    Values pushed with a deadline >= the last one go to a FIFO deque; earlier ones (out-of-
    order arrivals) to a heap. The minimum is at the head of one of the two.
    """

    def __init__(self) -> None:
        self.fifo: deque[tuple[int, object]] = deque()
        self.heap: list[tuple[int, int, object]] = []
        self._tail = -(1 << 62)
        self._seq = 0

    def __len__(self) -> int:
        return len(self.fifo) + len(self.heap)

    def push(self, deadline: int, value: object) -> None:
        if deadline >= self._tail:
            self.fifo.append((deadline, value))
            self._tail = deadline
        else:
            self._seq += 1
            heapq.heappush(self.heap, (deadline, self._seq, value))

    def min_deadline(self) -> int | None:
        fifo, heap = self.fifo, self.heap
        if fifo:
            return min(fifo[0][0], heap[0][0]) if heap else fifo[0][0]
        return heap[0][0] if heap else None

    def pop(self) -> tuple[int, object]:
        fifo, heap = self.fifo, self.heap
        if heap and (not fifo or heap[0][0] < fifo[0][0]):
            deadline, _, value = heapq.heappop(heap)
            return deadline, value
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
        max_held: int,
        labels: LabelTable,
        stats: Stats,
        clock: Callable[[], float],
    ) -> None:
        self.partition = partition
        self.window, self.lateness, self.idle_timeout = window, lateness, idle_timeout
        self.max_pending, self.max_held = max_pending, max_held
        self.labels, self.stats, self._clock = labels, stats, clock
        # watermark
        self.watermark: int | None = None
        self.max_ts: int | None = None
        self._last_event_wall = clock()
        self._wm_at_last_event: int | None = None
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
        self._queue = _DeadlineQueue()
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
        self._held_queue = _DeadlineQueue()
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
        if rid in self._index:
            return "duplicate"
        if len(self._index) >= self.max_pending:
            self._evict_oldest()
        slot = self._alloc_slot(len(imp.items))
        self._index[rid] = slot
        self._rid[slot] = rid
        self._ts[slot] = ts
        self._label[slot] = self.labels.acquire(imp.labels)
        self._offset[slot] = _NONE if offset is None else offset
        start = self._start[slot]
        n = len(imp.items)
        if n:
            self._items[start : start + n] = [_item_hash(x) for x in imp.items]
        held = self._held.pop(rid, None)
        if held is not None:
            self._attach_held(slot, ts, held)
        if wm is not None and deadline <= wm:
            if not replayed:
                self.stats.late_impressions += 1
            del self._index[rid]
            self._close(slot, "window")
        else:
            self._queue.push(deadline, slot)
        self._advance(ts)
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
        self._head[slot] = _NONE
        self._used[slot] = True
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

    def _evict_oldest(self) -> None:
        """At the cap: close the open impression with the earliest deadline now."""
        while self._queue:
            _, slot = self._queue.pop()
            rid = self._rid[slot]  # type: ignore[index]
            if rid is not None and self._index.get(rid) == slot:
                del self._index[rid]
                self._close(slot, "cap")
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
        evid = 0 if fb.event_id is None else _item_hash(fb.event_id)
        off = _NONE if offset is None else offset
        slot = self._index.get(fb.request_id)
        if slot is None:
            outcome = self._hold(fb, grade, evid, off, replayed)
        else:
            outcome = self._attach(
                slot, int(self._ts[slot]), ts, _item_hash(fb.item), grade, evid, off, replayed
            )
        self._advance(ts)
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
        entry = _Held(rid, fb.ts, _item_hash(fb.item), grade, evid, off, replayed, deadline)
        if waiting is None:
            self._held[rid] = [entry]
        else:
            waiting.append(entry)
        self._held_queue.push(deadline, entry)
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
            _, value = queue.pop()
            entry: _Held = value  # type: ignore[assignment]
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

    def _advance(self, ts: int) -> None:
        self._last_event_wall = self._clock()
        if self.max_ts is None or ts > self.max_ts:
            self.max_ts = ts
            mark = ts - self.lateness
            if self.watermark is None or mark > self.watermark:
                self.set_watermark(mark)
        self._wm_at_last_event = self.watermark

    def set_watermark(self, mark: int) -> None:
        """Move the watermark forward (never back) and close everything now due."""
        if self.watermark is not None and mark <= self.watermark:
            return
        self.watermark = mark
        queue = self._queue
        due = queue.min_deadline()
        while due is not None and due <= mark:
            _, slot = queue.pop()
            rid = self._rid[slot]  # type: ignore[index]
            if rid is not None and self._index.get(rid) == slot:
                del self._index[rid]
                self._close(slot, "window")  # type: ignore[arg-type]
            due = queue.min_deadline()
        due = self._held_queue.min_deadline()
        if due is not None and due <= mark:
            self._expire_held(mark)

    def idle(self, now: float) -> None:
        """Idle fallback: after ``idle_timeout`` of wall time without events, advance the
        watermark by the wall time elapsed since the last event (docs/semantics.md)."""
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

    # ------------------------------------------------------------------ finalization

    def close_all(self) -> None:
        """Drain: close every open impression now; held feedback is orphaned."""
        queue = self._queue
        while queue:
            _, slot = queue.pop()
            rid = self._rid[slot]  # type: ignore[index]
            if rid is not None and self._index.get(rid) == slot:
                del self._index[rid]
                self._close(slot, "drain")  # type: ignore[arg-type]
        while self._held_queue:
            self._expire_held(None, count_one=True)

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
        items = np.where(mask, self._items[pos], 0)
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
            hit = items[r] == self._fb_item[e][:, None]
            matched = hit.any(axis=1)
            missing = ~matched & ~self._fb_replayed[e]
            self.stats.unattributed["unknown_item"] += int(missing.sum())
            hr, hc = np.nonzero(hit)
            np.maximum.at(grades, (r[hr], hc), self._fb_grade[e][hr])
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
