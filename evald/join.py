"""JoinStore: the event-time windowed join of one input partition.

Impressions wait in a compact pending store until the partition's watermark reaches
``ts + window``; feedback is attached to them as it arrives and turned into grades only when
they close (vectorised over the closed batch). docs/semantics.md states every rule; in short:

* watermark = newest confirmed event ts - lateness (never goes back); a time more than
  ``jump`` ahead is confirmed only by a second event near it, so one outlier cannot move it;
  an idle fallback advances it with the wall clock. Each event is joined first, then the
  watermark advances and closes whatever is due, so the outcome depends only on the
  partition's event order.
* feedback counts for an impression when ``imp.ts <= fb.ts <= imp.ts + window``; feedback for
  an impression not seen yet is held until the watermark passes ``fb.ts + window``.

Memory layout: a pending impression owns no Python object. Its item ids are 64-bit hashes in
one flat ``array('q')`` arena and its request id is UTF-8 in one ``bytearray`` arena (both
compacted when half garbage); fixed-width numpy columns hold the rest; request ids map to
slots through a numpy open-addressing table keyed by the id's 64-bit hash; label dicts are
interned. Attached feedback lives in numpy columns chained per slot.
"""

from __future__ import annotations

import heapq
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evald.events import Feedback, Impression
from evald.segments import LabelTable
from evald.stats import Stats

_NONE = -1
_BIG = 1 << 62  # "no deadline"
_EMPTY, _TOMB = 0, 1  # reserved keys of the request-id table
_NO_TS = -_BIG  # "no event time yet" (below every event time)


def _rid_key(rid: str) -> int:
    """64-bit key of a request id in the table (never one of the reserved keys)."""
    h = hash(rid)
    return h + 2 if 0 <= h <= 1 else h


class _RidTable:
    """request-id key -> slot; open addressing with linear probing over two numpy arrays.

    12 bytes a bucket at most 60% full, instead of a dict entry plus a string and an int
    object per pending impression. Two ids with the same 64-bit hash would be taken for one
    (probability ~n^2 / 2^65).
    """

    def __init__(self, capacity: int = 1 << 12) -> None:
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        self.keys = np.zeros(capacity, np.int64)
        self.vals = np.zeros(capacity, np.int32)
        # memoryviews: scalar access from Python is ~2x cheaper than numpy indexing
        self._k, self._v = memoryview(self.keys), memoryview(self.vals)
        self.mask = capacity - 1
        self.live = 0
        self.used = 0  # live + tombstones

    def __len__(self) -> int:
        return self.live

    def get(self, key: int) -> int:
        """Slot of ``key`` or -1."""
        keys = self._k
        mask = self.mask
        i = key & mask
        while True:
            k = keys[i]
            if k == key:
                return self._v[i]
            if k == _EMPTY:
                return _NONE
            i = (i + 1) & mask

    def insert(self, key: int, slot: int) -> int:
        """Add ``key`` -> ``slot`` unless ``key`` is present; returns the present slot or -1.

        One probe run serves both the duplicate check and the insertion.
        """
        if (self.used + 1) * 5 > (self.mask + 1) * 3:
            self._rebuild()
        keys = self._k
        mask = self.mask
        i = key & mask
        free = -1
        while True:
            k = keys[i]
            if k == key:
                return self._v[i]
            if k == _EMPTY:
                break
            if k == _TOMB and free < 0:
                free = i
            i = (i + 1) & mask
        if free < 0:
            free = i
            self.used += 1
        keys[free] = key
        self._v[free] = slot
        self.live += 1
        return _NONE

    def clear(self) -> None:
        """Remove every key, keeping the capacity."""
        self.keys.fill(_EMPTY)
        self.live = self.used = 0

    def remove(self, key: int) -> None:
        """Remove a key known to be present (leaves a tombstone)."""
        keys = self._k
        mask = self.mask
        i = key & mask
        while keys[i] != key:
            i = (i + 1) & mask
        keys[i] = _TOMB
        self.live -= 1

    def _rebuild(self) -> None:
        """Drop tombstones, growing so the table is at most 30% full afterwards (it is
        rebuilt at 60% including tombstones: short probe runs, 12-40 bytes per live id)."""
        live = (self.keys != _EMPTY) & (self.keys != _TOMB)
        keys, vals = self.keys[live], self.vals[live]
        capacity = self.mask + 1
        while len(keys) * 10 > capacity * 3:
            capacity *= 2
        self._alloc(capacity)
        pos = keys & self.mask
        todo = np.arange(len(keys))
        while len(todo):  # vectorised linear probing, one probe step per round
            p = pos[todo]
            free = self.keys[p] == _EMPTY
            cand, where = todo[free], p[free]
            where, first = np.unique(where, return_index=True)
            won = cand[first]
            self.keys[where] = keys[won]
            self.vals[where] = vals[won]
            placed = np.zeros(len(keys), np.bool_)
            placed[won] = True
            todo = todo[~placed[todo]]
            pos[todo] = (pos[todo] + 1) & self.mask
        self.live = self.used = len(keys)


class _IntFifo:
    """FIFO of ints in an ``array('i')`` (4 bytes each), compacted as it drains."""

    def __init__(self) -> None:
        self._a = array("i")
        self._head = 0

    def __len__(self) -> int:
        return len(self._a) - self._head

    def __getitem__(self, index: int) -> int:
        return self._a[self._head + index]

    def append(self, value: int) -> None:
        self._a.append(value)

    def take_all(self) -> list[int]:
        """Remove and return every value, oldest first."""
        values = self._a[self._head :].tolist()
        self._a = array("i")
        self._head = 0
        return values

    def popleft(self) -> int:
        value = self._a[self._head]
        self._head += 1
        if self._head >= 4096 and self._head * 2 >= len(self._a):
            del self._a[: self._head]
            self._head = 0
        return value


class _OffsetLog:
    """Source offsets of live entries (pending impressions or attached feedback), so their
    minimum costs amortised O(1) per event instead of a scan of the pending state per commit.

    An entry is (offset, ref); it is live while ``stored[ref] == offset + 1`` (the store zeroes
    or overwrites a ref's column when it frees or reuses it). Offsets pushed in increasing
    order, the rule on a Kafka partition, go to a FIFO; others (held feedback attached later,
    out-of-order callers) to a heap. Dead entries are dropped when they reach the front.
    """

    def __init__(self) -> None:
        self._off = array("q")
        self._ref = array("i")
        self._head = 0
        self._last = -1
        self._heap: list[tuple[int, int]] = []

    def push(self, offset: int, ref: int) -> None:
        if offset >= self._last:
            self._off.append(offset)
            self._ref.append(ref)
            self._last = offset
        else:
            heapq.heappush(self._heap, (offset, ref))

    def push_many(self, offsets: list[int], refs: list[int]) -> None:
        if offsets and offsets[0] >= self._last and offsets == sorted(offsets):
            self._off.extend(offsets)
            self._ref.extend(refs)
            self._last = offsets[-1]
        else:
            for offset, ref in zip(offsets, refs, strict=True):
                self.push(offset, ref)

    def low(self, stored: np.ndarray) -> int | None:
        """Smallest live offset, or None."""
        off, ref, head = self._off, self._ref, self._head
        while head < len(off):  # skip dead entries, a numpy chunk at a time
            end = min(len(off), head + 4096)
            offs = np.frombuffer(off, np.int64)[head:end]
            alive = stored[np.frombuffer(ref, np.int32)[head:end]] == offs + 1
            del offs
            if alive.any():
                head += int(alive.argmax())
                break
            head = end
        if head >= 4096 and head * 2 >= len(off):
            del off[:head], ref[:head]
            head = 0
        self._head = head
        heap = self._heap
        while heap and stored[heap[0][1]] != heap[0][0] + 1:
            heapq.heappop(heap)
        first = off[head] if head < len(off) else None
        if heap and (first is None or heap[0][0] < first):
            return heap[0][0]
        return first


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

    def __init__(self, deadline_of: Callable[[Any], int], fifo: Any = None) -> None:
        self.fifo: Any = deque() if fifo is None else fifo
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

    def take_all(self, ts: np.ndarray, window: int) -> list[int]:
        """Empty a queue of slots whose deadline is ``ts[slot] + window``; returns them in
        the order repeated ``pop`` calls would (deadline, FIFO before heap on ties, heap by
        push order), sorted in one numpy pass."""
        fifo: _IntFifo = self.fifo
        in_order = fifo.take_all()
        if not self.heap:
            return in_order
        heap = sorted(self.heap)
        self.heap = []
        slots = np.asarray(in_order + [value for _, _, value in heap], dtype=np.intp)
        deadlines = ts[slots] + window
        source = np.zeros(len(slots), np.int8)
        source[len(in_order) :] = 1  # position within each source is already pop order
        order = np.lexsort((np.arange(len(slots)), source, deadlines))
        return slots[order].tolist()

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
        jump: int,
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
        self.jump = jump
        self.max_pending, self.max_held = max_pending, max_held
        #: open impressions over every partition of the engine (shared, one element)
        self._open_total = open_total
        self._evict = evict
        self.labels, self.stats, self._clock = labels, stats, clock
        # watermark
        self.watermark: int | None = None
        #: newest confirmed event time and the far-ahead candidate (_observe); _NO_TS: none
        self._confirmed = self._candidate = _NO_TS
        #: the two above came from a checkpoint, so re-fed events must not count again
        self._times_restored = False
        self._last_event_wall = clock()  # wall time of the tick that first saw the last event
        self._wm_at_last_event: int | None = None
        self._fresh = False  # events arrived since the last tick
        self._due = _BIG  # earliest deadline in either queue (cached: checked on every event)
        # pending impressions: slot columns (0 in _label / _offset / _head means "none";
        # they store id + 1), the two arenas and the request-id table
        self._table = _RidTable()
        cap = 1024
        self._ts = np.zeros(cap, np.int64)
        self._start = np.zeros(cap, np.int64)  # in _items
        self._len = np.zeros(cap, np.int32)
        self._rid_start = np.zeros(cap, np.int64)  # in _rids
        self._rid_len = np.zeros(cap, np.int32)
        self._key = np.zeros(cap, np.int64)  # request-id table key
        self._label = np.zeros(cap, np.int32)  # label id + 1; 0 = free slot
        self._offset = np.zeros(cap, np.int64)  # source offset + 1
        self._head = np.zeros(cap, np.int32)  # first attached feedback entry + 1
        self._top = 0
        self._free_slots: list[int] = []
        self._items = array("q")
        self._items_garbage = 0
        self._rids = bytearray()
        self._rids_garbage = 0
        self._queue = _DeadlineQueue(lambda slot: self._m_ts[slot] + self.window, _IntFifo())
        self._closed = Closed([], [])
        self.first_close_wall: float | None = None
        # attached feedback entries (chained per slot; 0 in _fb_next = end, else entry + 1)
        fcap = 1024
        self._fb_item = np.zeros(fcap, np.int64)
        self._fb_grade = np.zeros(fcap, np.float64)
        self._fb_next = np.zeros(fcap, np.int32)
        self._fb_evid = np.zeros(fcap, np.int64)
        self._fb_offset = np.zeros(fcap, np.int64)  # source offset + 1
        self._fb_replayed = np.zeros(fcap, np.bool_)
        self._fb_free: list[int] = []
        self._fb_top = 0
        self._bind()
        # offsets of pending impressions and attached feedback, for low_offsets
        self._imp_offsets = _OffsetLog()
        self._fb_offsets = _OffsetLog()
        # held (early) feedback
        self._held: dict[str, list[_Held]] = {}
        self._held_queue = _DeadlineQueue(lambda held: held.deadline)
        self.held = 0
        # restore mode: kind -> first offset not seen before the crash
        self.replay_until: dict[str, int] | None = None

    def _bind(self) -> None:
        """(Re)create the memoryviews the per-event code indexes: a memoryview item is about
        twice as cheap to read or write from Python as a numpy scalar index."""
        self._m_ts, self._m_start, self._m_len = (
            memoryview(self._ts),
            memoryview(self._start),
            memoryview(self._len),
        )
        self._m_rid_start, self._m_rid_len = memoryview(self._rid_start), memoryview(self._rid_len)
        self._m_key, self._m_label = memoryview(self._key), memoryview(self._label)
        self._m_offset, self._m_head = memoryview(self._offset), memoryview(self._head)
        self._m_fb_item, self._m_fb_grade = memoryview(self._fb_item), memoryview(self._fb_grade)
        self._m_fb_next, self._m_fb_evid = memoryview(self._fb_next), memoryview(self._fb_evid)
        self._m_fb_offset = memoryview(self._fb_offset)
        self._m_fb_replayed = memoryview(self._fb_replayed)

    def _slot_views(self) -> tuple[memoryview, ...]:
        """(ts, key, label, head, start, len) column views, for ``join_many``'s locals."""
        return self._m_ts, self._m_key, self._m_label, self._m_head, self._m_start, self._m_len

    def _fb_views(self) -> tuple[memoryview, ...]:
        """(item, grade, next, evid, offset) feedback column views, for ``join_many``."""
        return (
            self._m_fb_item,
            self._m_fb_grade,
            self._m_fb_next,
            self._m_fb_evid,
            self._m_fb_offset,
        )

    # ------------------------------------------------------------------ sizes

    def pending(self) -> int:
        """Impressions held in memory: open plus closed-but-not-yet-scored."""
        return len(self._table) + len(self._closed.slots)

    def open(self) -> int:
        return len(self._table)

    # ------------------------------------------------------------------ impressions

    def add_impression(self, imp: Impression, offset: int | None, replayed: bool) -> str:
        """Join one impression; returns "accepted", "duplicate" or "skipped" (re-fed, done)."""
        ts = imp.ts
        deadline = ts + self.window
        wm = self.watermark
        if replayed and wm is not None and deadline <= wm:
            return "skipped"
        rid = imp.request_id
        key = hash(rid)  # _rid_key, inlined: this runs once per event
        if 0 <= key <= 1:
            key += 2
        table = self._table
        if self._open_total[0] >= self.max_pending:
            if table.get(key) != _NONE:
                return "duplicate"
            self._evict(self)
        slot = self._free_slots.pop() if self._free_slots else self._new_slot()
        if table.insert(key, slot) != _NONE:
            self._free_slots.append(slot)
            return "duplicate"
        items = self._items
        names = imp.items
        self._m_start[slot] = len(items)
        self._m_len[slot] = len(names)
        items.fromlist(list(map(hash, names)))  # ~25% cheaper than extend(map(...))
        rids = self._rids
        raw_rid = rid.encode()
        self._m_rid_start[slot] = len(rids)
        self._m_rid_len[slot] = len(raw_rid)
        rids += raw_rid
        self._m_ts[slot] = ts
        self._m_key[slot] = key
        self._m_label[slot] = self.labels.acquire(imp.labels) + 1
        if offset is not None:
            self._m_offset[slot] = offset + 1
            self._imp_offsets.push(offset, slot)
        self._open_total[0] += 1
        if self._held:
            held = self._held.pop(rid, None)
            if held is not None:
                self._attach_held(slot, ts, held)
        if wm is not None and deadline <= wm:  # late (a replayed one was skipped above)
            self._close(slot, "late")
        else:
            queue = self._queue
            if deadline >= queue._tail:  # in order: the FIFO (queue.push, inlined)
                queue.fifo._a.append(slot)
                queue._tail = deadline
            else:
                queue.push(deadline, slot)
            if deadline < self._due:
                self._due = deadline
        self._fresh = True
        if ts > self._confirmed and not (replayed and self._times_restored):
            self._observe(ts)
        return "accepted"

    # ------------------------------------------------------------------ batches

    def join_many(
        self,
        events: Iterable[tuple[int, Impression | Feedback]],
        offsets: Sequence[int] | None,
        grades: dict[str, float],
    ) -> tuple[int, int, int, int]:
        """Join decoded (position, event) pairs in order, exactly as ``add_impression`` /
        ``add_feedback`` one by one would; returns (impressions accepted, duplicate,
        feedback accepted, duplicate), counting only events not re-fed by a restore.

        Why a second path: the per-event call chain was most of the engine's cost. Here the
        common case (not re-fed, below the cap, feedback whose impression is pending) runs
        inline with every table, column and queue bound to a local; the columns no join
        decision reads before the batch ends (request-id bytes, source offsets) are written in
        bulk once it does. Every other case calls the one-event methods, which stay the
        reference.
        ``offsets[position]`` is an event's source offset; ``grades`` maps actions to default
        grades (feedback without its own ``grade``).
        """
        window, lateness, jump = self.window, self.lateness, self.jump
        max_pending = self.max_pending
        open_total, stats = self._open_total, self.stats
        until = self.replay_until
        table = self._table
        tk, tv, mask = table._k, table._v, table.mask
        free_slots = self._free_slots
        fifo = self._queue.fifo
        queue = self._queue
        label_ids = self.labels._ids
        label_refs = self.labels._refs
        acquire = self.labels.acquire
        m_ts, m_key, m_label, m_head, m_start, m_len = self._slot_views()
        items = self._items
        m_fb_item, m_fb_grade, m_fb_next, m_fb_evid, m_fb_offset = self._fb_views()
        fb_free = self._fb_free
        fb_push = self._fb_offsets.push
        cap, fb_cap = len(self._ts), len(self._fb_item)
        imp_ok = imp_dup = fb_ok = fb_dup = 0
        fresh = False
        # deferred column writes of impressions accepted inline
        slots: list[int] = []
        rids: list[str] = []
        offs: list[int] = []

        for position, event in events:
            off = -1 if offsets is None else offsets[position]
            ts = event.ts
            if event.kind == "impression":
                replayed = until is not None and off >= 0 and off < until.get("impression", -1)
                deadline = ts + window
                if replayed or open_total[0] >= max_pending:
                    outcome = self.add_impression(event, None if off < 0 else off, replayed)  # type: ignore[arg-type]
                    tk, tv, mask = table._k, table._v, table.mask
                    m_ts, m_key, m_label, m_head, m_start, m_len = self._slot_views()
                    cap = len(self._ts)
                    if not replayed:
                        if outcome == "accepted":
                            imp_ok += 1
                        elif outcome == "duplicate":
                            imp_dup += 1
                    continue
                rid = event.request_id  # type: ignore[union-attr]
                key = hash(rid)  # _rid_key, inlined
                if 0 <= key <= 1:
                    key += 2
                # _RidTable.insert, inlined (slot assigned once the id is known to be new)
                if (table.used + 1) * 5 > (mask + 1) * 3:
                    table._rebuild()
                    tk, tv, mask = table._k, table._v, table.mask
                i = key & mask
                free = -1
                while True:
                    k = tk[i]
                    if k == key:
                        break
                    if k == _EMPTY:
                        break
                    if k == _TOMB and free < 0:
                        free = i
                    i = (i + 1) & mask
                if k == key:
                    imp_dup += 1
                    continue
                if free < 0:
                    free = i
                    table.used += 1
                if free_slots:
                    slot = free_slots.pop()
                else:
                    slot = self._top
                    if slot >= cap:
                        self._new_slot()
                        m_ts, m_key, m_label, m_head, m_start, m_len = self._slot_views()
                        cap = len(self._ts)
                    else:
                        self._top = slot + 1
                tk[free] = key
                tv[free] = slot
                table.live += 1
                m_ts[slot] = ts
                m_key[slot] = key
                labels = event.labels  # type: ignore[union-attr]
                label_key = tuple(labels.items())
                label = label_ids.get(label_key)
                if label is None:
                    label = acquire(labels)
                    label_refs = self.labels._refs
                else:
                    label_refs[label] += 1
                m_label[slot] = label + 1
                names = event.items  # type: ignore[union-attr]
                m_start[slot] = len(items)
                m_len[slot] = len(names)
                items.fromlist(list(map(hash, names)))  # hashed while still in cache
                slots.append(slot)
                rids.append(rid)
                offs.append(off)
                open_total[0] += 1
                if self._held:
                    held = self._held.pop(rid, None)
                    if held is not None:
                        self._attach_held(slot, ts, held)
                        m_fb_item, m_fb_grade, m_fb_next, m_fb_evid, m_fb_offset = self._fb_views()
                        fb_cap = len(self._fb_item)
                imp_ok += 1
                wm = self.watermark
                if wm is not None and deadline <= wm:
                    self._close(slot, "late")
                else:
                    if deadline >= queue._tail:  # in deadline order: the FIFO (push, inlined)
                        fifo._a.append(slot)
                        queue._tail = deadline
                    else:
                        queue.push(deadline, slot)
                    if deadline < self._due:
                        self._due = deadline
            else:
                replayed = until is not None and off >= 0 and off < until.get("feedback", -1)
                grade = event.grade  # type: ignore[union-attr]
                if grade is None:
                    grade = grades[event.action]  # type: ignore[union-attr]
                evid_text = event.event_id  # type: ignore[union-attr]
                evid = 0 if evid_text is None else hash(evid_text) or 1
                key = hash(event.request_id)  # _rid_key and _RidTable.get, inlined
                if 0 <= key <= 1:
                    key += 2
                i = key & mask
                while True:
                    k = tk[i]
                    if k == key:
                        slot = tv[i]
                        break
                    if k == _EMPTY:
                        slot = _NONE
                        break
                    i = (i + 1) & mask
                if slot == _NONE or replayed:
                    if slot == _NONE:
                        outcome = self._hold(event, grade, evid, off + 1, replayed)  # type: ignore[arg-type]
                    else:
                        outcome = self._attach(
                            slot,
                            m_ts[slot],
                            ts,
                            hash(event.item),
                            grade,
                            evid,
                            off + 1,
                            True,  # type: ignore[union-attr]
                        )
                    m_fb_item, m_fb_grade, m_fb_next, m_fb_evid, m_fb_offset = self._fb_views()
                    fb_cap = len(self._fb_item)
                    if not replayed:
                        if outcome == "accepted":
                            fb_ok += 1
                        else:
                            fb_dup += 1
                else:
                    # _attach, inlined for a fresh (not re-fed) event
                    imp_ts = m_ts[slot]
                    fb_ok += 1
                    if ts < imp_ts:
                        stats.unattributed["early"] += 1
                    elif ts > imp_ts + window:
                        stats.unattributed["late"] += 1
                    else:
                        head = m_head[slot]
                        link = head if evid else 0
                        while link:
                            if m_fb_evid[link - 1] == evid:
                                break
                            link = m_fb_next[link - 1]
                        if link:
                            stats.unattributed["duplicate"] += 1
                            fb_ok -= 1
                            fb_dup += 1
                        else:
                            if fb_free:
                                entry = fb_free.pop()
                            else:
                                entry = self._fb_top
                                self._fb_top = entry + 1
                                if entry >= fb_cap:
                                    self._grow_feedback()
                                    views = self._fb_views()
                                    m_fb_item, m_fb_grade, m_fb_next, m_fb_evid, m_fb_offset = views
                                    fb_cap = len(self._fb_item)
                            m_fb_item[entry] = hash(event.item)  # type: ignore[union-attr]
                            m_fb_grade[entry] = grade
                            if evid:
                                m_fb_evid[entry] = evid
                            if off >= 0:
                                m_fb_offset[entry] = off + 1
                                fb_push(off, entry)
                            m_fb_next[entry] = head
                            m_head[slot] = entry + 1
            # the watermark moves after the event is joined (add_*'s tail; _observe's common
            # case inlined: a time within the jump of the confirmed one, no candidate)
            fresh = True
            first = self._confirmed
            if ts > first and not (replayed and self._times_restored):
                if first != _NO_TS and ts <= first + jump and self._candidate == _NO_TS:
                    self._confirmed = ts
                    mark = ts - lateness
                    wm = self.watermark
                    if wm is None or mark > wm:
                        self.watermark = mark
                        if mark >= self._due:
                            self._close_due(mark)
                else:
                    self._observe(ts)
        if slots:
            self._write_columns(slots, rids, offs if offsets is not None else None)
        if fresh:
            self._fresh = True
        return imp_ok, imp_dup, fb_ok, fb_dup

    def _write_columns(self, slots: list[int], rids: list[str], offs: list[int] | None) -> None:
        """The columns ``join_many`` defers, for impressions it accepted: request-id bytes
        appended to their arena with their spans, and source offsets."""
        idx = np.asarray(slots, dtype=np.intp)
        raw = [rid.encode() for rid in rids]
        rid_lengths = np.fromiter(map(len, raw), np.int64, len(raw))
        rid_starts = np.empty(len(slots), np.int64)
        rid_starts[0] = len(self._rids)
        np.cumsum(rid_lengths[:-1], out=rid_starts[1:])
        rid_starts[1:] += rid_starts[0]
        self._rids += b"".join(raw)
        self._rid_start[idx] = rid_starts
        self._rid_len[idx] = rid_lengths
        if offs is not None:
            self._offset[idx] = np.asarray(offs, dtype=np.int64) + 1  # 0 means "no offset"
            self._imp_offsets.push_many(offs, slots)

    def _new_slot(self) -> int:
        slot = self._top
        self._top += 1
        if slot >= len(self._ts):
            cap = len(self._ts) * 2
            for name in (
                "_ts",
                "_start",
                "_len",
                "_rid_start",
                "_rid_len",
                "_key",
                "_label",
                "_offset",
                "_head",
            ):
                old = getattr(self, name)
                new = np.zeros(cap, old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)
            self._bind()
        return slot

    def _live_slots(self) -> np.ndarray:
        return np.flatnonzero(self._label[: self._top])

    def _compact_items(self) -> None:
        """Rewrite the item arena with only the live slots' items."""
        slots = self._live_slots()
        starts, lens = self._start[slots], self._len[slots].astype(np.int64)
        new_start = np.zeros(len(slots), np.int64)
        if len(slots):
            np.cumsum(lens[:-1], out=new_start[1:])
        src = np.repeat(starts - new_start, lens) + np.arange(int(lens.sum()))
        view = np.frombuffer(self._items, np.int64)
        kept = view[src].tobytes()
        del view
        self._items = array("q")
        self._items.frombytes(kept)
        self._start[slots] = new_start
        self._items_garbage = 0

    def _compact_rids(self) -> None:
        """Rewrite the request-id arena with only the live slots' ids."""
        slots = self._live_slots()
        starts, lens = self._rid_start[slots], self._rid_len[slots].astype(np.int64)
        new_start = np.zeros(len(slots), np.int64)
        if len(slots):
            np.cumsum(lens[:-1], out=new_start[1:])
        src = np.repeat(starts - new_start, lens) + np.arange(int(lens.sum()))
        view = np.frombuffer(self._rids, np.uint8)
        kept = view[src].tobytes()
        del view
        self._rids = bytearray(kept)
        self._rid_start[slots] = new_start
        self._rids_garbage = 0

    def evict_oldest(self) -> None:
        """At the cap: close this partition's open impression with the earliest deadline."""
        if self._queue:
            self._close(self._queue.pop(), "cap")
            self._refresh_due()

    def _close(self, slot: int, reason: str) -> None:
        """Take an open impression out of the join; it is scored by the next take()."""
        self._table.remove(self._m_key[slot])
        self._open_total[0] -= 1
        if not self._closed.slots and self.first_close_wall is None:
            self.first_close_wall = self._clock()
        self._closed.slots.append(slot)
        self._closed.reasons.append(reason)

    def _close_many(self, slots: list[int], reason: str) -> None:
        """``_close`` for many slots at once; when they are every open impression (a drain)
        the request-id table is cleared in one step instead of one probe run per id."""
        table = self._table
        if len(slots) == len(table):
            table.clear()
        else:
            remove, key_of = table.remove, self._m_key.__getitem__
            for slot in slots:
                remove(key_of(slot))
        self._open_total[0] -= len(slots)
        closed = self._closed
        if not closed.slots and self.first_close_wall is None:
            self.first_close_wall = self._clock()
        closed.slots.extend(slots)
        closed.reasons.extend([reason] * len(slots))

    # ------------------------------------------------------------------ feedback

    def add_feedback(self, fb: Feedback, grade: float, offset: int | None, replayed: bool) -> str:
        """Join one feedback event; returns "accepted" or "duplicate" (repeated event_id)."""
        ts = fb.ts
        evid = 0 if fb.event_id is None else hash(fb.event_id) or 1
        off = 0 if offset is None else offset + 1
        key = hash(fb.request_id)  # _rid_key, inlined
        slot = self._table.get(key + 2 if 0 <= key <= 1 else key)
        if slot == _NONE:
            outcome = self._hold(fb, grade, evid, off, replayed)
        else:
            outcome = self._attach(
                slot, self._m_ts[slot], ts, hash(fb.item), grade, evid, off, replayed
            )
        self._fresh = True
        if ts > self._confirmed and not (replayed and self._times_restored):
            self._observe(ts)
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
        head = self._m_head[slot]
        if evid:
            link = head
            while link:
                if self._m_fb_evid[link - 1] == evid:
                    if not replayed:
                        self.stats.unattributed["duplicate"] += 1
                    return "duplicate"
                link = self._m_fb_next[link - 1]
        if self._fb_free:
            entry = self._fb_free.pop()
        else:
            entry = self._fb_top
            self._fb_top += 1
            if entry >= len(self._fb_item):
                self._grow_feedback()
        self._m_fb_item[entry] = item
        self._m_fb_grade[entry] = grade
        if evid:
            self._m_fb_evid[entry] = evid
        if off:
            self._m_fb_offset[entry] = off
            self._fb_offsets.push(off - 1, entry)
        if replayed:
            self._m_fb_replayed[entry] = True
        self._m_fb_next[entry] = head
        self._m_head[slot] = entry + 1
        return "accepted"

    def _grow_feedback(self) -> None:
        cap = len(self._fb_item) * 2
        for name in ("_fb_item", "_fb_grade", "_fb_next", "_fb_evid", "_fb_offset", "_fb_replayed"):
            old = getattr(self, name)
            new = np.zeros(cap, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
        self._bind()

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

    def _observe(self, ts: int) -> None:
        """Count an event time above the newest confirmed one (docs/semantics.md section 3).

        Within ``jump`` of it, the time is confirmed at once. Further ahead (or before any
        confirmed time) it is a candidate: confirmed only when another event lands within
        ``jump`` of it; a candidate the confirmed time catches up with is confirmed too. So
        one event far ahead of the rest never moves the watermark.
        """
        confirmed, candidate, jump = self._confirmed, self._candidate, self.jump
        if confirmed != _NO_TS and ts <= confirmed + jump:
            confirmed = ts
        elif candidate != _NO_TS and -jump <= ts - candidate <= jump:
            confirmed, candidate = max(ts, candidate, confirmed), _NO_TS
        else:
            self._candidate = ts  # the newest far-ahead time replaces an older candidate
            return
        if candidate != _NO_TS and candidate <= confirmed + jump:
            confirmed, candidate = max(confirmed, candidate), _NO_TS
        self._confirmed, self._candidate = confirmed, candidate
        mark = confirmed - self.lateness
        wm = self.watermark
        if wm is None or mark > wm:
            self.watermark = mark
            if mark >= self._due:
                self._close_due(mark)

    def event_times(self) -> tuple[int | None, int | None]:
        """(newest confirmed event time, candidate) for the checkpoint; None: none."""
        first, second = self._confirmed, self._candidate
        return (None if first == _NO_TS else first, None if second == _NO_TS else second)

    def _refresh_due(self) -> None:
        due = self._queue.min_deadline()
        held = self._held_queue.min_deadline()
        self._due = min(_BIG if due is None else due, _BIG if held is None else held)

    def _close_due(self, mark: int) -> None:
        """Close every open impression and expire every held feedback due at ``mark``."""
        fifo: _IntFifo = self._queue.fifo
        heap = self._queue.heap
        ts_of = self._m_ts.__getitem__
        window = self.window
        while True:  # merge the in-order FIFO and the out-of-order heap by deadline
            a, head = fifo._a, fifo._head
            first = ts_of(a[head]) + window if head < len(a) else _BIG
            other = heap[0][0] if heap else _BIG
            if first <= other:
                if first > mark:
                    break
                self._close(fifo.popleft(), "window")
            else:
                if other > mark:
                    break
                self._close(heapq.heappop(heap)[2], "window")
        # the loop stopped at the impression queue's minimum: no second look (this runs on
        # nearly every event once the window is full)
        due = first if first <= other else other
        held = self._held_queue.min_deadline()
        if held is not None and held <= mark:
            self._expire_held(mark)
            held = self._held_queue.min_deadline()
        self._due = due if held is None or due <= held else held

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

    def restore(
        self,
        watermark: int | None,
        consumed: dict[str, int],
        event_times: tuple[int | None, int | None] | None = None,
    ) -> None:
        """Start again after a crash: watermark as checkpointed, events before ``consumed`` are
        re-fed silently (see Engine.restore). With ``event_times`` (``event_times()`` at the
        checkpoint) re-fed events are not counted again: they are in it."""
        if event_times is not None:
            first, second = event_times
            self._confirmed = _NO_TS if first is None else first
            self._candidate = _NO_TS if second is None else second
            self._times_restored = True
        if watermark is not None:
            self.set_watermark(watermark)
        self._wm_at_last_event = self.watermark
        self.replay_until = dict(consumed)
        self._last_event_wall = self._clock()
        self._fresh = False

    # ------------------------------------------------------------------ finalization

    def close_all(self) -> None:
        """Drain: close every open impression now; held feedback is orphaned."""
        slots = self._queue.take_all(self._ts, self.window)
        if slots:
            self._close_many(slots, "drain")
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
        view = np.frombuffer(self._items, np.int64) if len(self._items) else np.zeros(1, np.int64)
        items = view[pos]
        del view
        grades = np.zeros((len(slots), width), np.float64)
        r, e = self._attached(idx)
        if len(e):
            hit = (items[r] == self._fb_item[e][:, None]) & mask[r]
            col = hit.argmax(axis=1)  # an item served twice is credited at its first rank
            matched = hit[np.arange(len(e)), col]
            missing = ~matched & ~self._fb_replayed[e]
            self.stats.unattributed["unknown_item"] += int(missing.sum())
            np.maximum.at(grades, (r[matched], col[matched]), self._fb_grade[e][matched])
            self._fb_evid[e] = 0
            self._fb_offset[e] = 0
            self._fb_replayed[e] = False
            self._fb_free.extend(e.tolist())
        request_ids = self._request_ids(idx)
        label_ids = (self._label[idx] - 1).tolist()
        table = self.labels
        labels = [table.labels[i] for i in label_ids]
        segment_ids = np.asarray([table.segment[i] for i in label_ids], dtype=np.intp)
        ts = self._ts[idx].copy()
        for label_id, count in Counter(label_ids).items():
            table.release(label_id, count)
        self._items_garbage += int(lengths.sum())
        self._rids_garbage += int(self._rid_len[idx].sum())
        self._label[idx] = 0
        if self._items_garbage > max(len(self._items) // 2, 1 << 16):
            self._compact_items()
        if self._rids_garbage > max(len(self._rids) // 2, 1 << 16):
            self._compact_rids()
        self._head[idx] = 0
        self._offset[idx] = 0
        self._free_slots.extend(slots)
        return Joined(request_ids, ts, label_ids, segment_ids, labels, grades, lengths, reasons)  # type: ignore[arg-type]

    def _attached(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row in ``idx``, feedback entry) of every entry attached to slots ``idx``.

        Chains are walked one link per numpy round while many are left; the few long ones
        (a list with lots of feedback) are finished in Python so no round is nearly empty.
        """
        heads = self._head[idx]
        rows = np.flatnonzero(heads)
        links = heads[rows].astype(np.intp) - 1
        row_parts, entry_parts = [], []
        while len(links) > 16:
            row_parts.append(rows)
            entry_parts.append(links)
            nxt = self._fb_next[links]
            more = nxt != 0
            rows, links = rows[more], nxt[more].astype(np.intp) - 1
        tail_rows: list[int] = []
        tail_entries: list[int] = []
        fb_next = self._m_fb_next.__getitem__
        for row, entry in zip(rows.tolist(), links.tolist(), strict=True):
            while True:
                tail_rows.append(row)
                tail_entries.append(entry)
                link = fb_next(entry)
                if not link:
                    break
                entry = link - 1
        row_parts.append(np.asarray(tail_rows, dtype=np.intp))
        entry_parts.append(np.asarray(tail_entries, dtype=np.intp))
        return np.concatenate(row_parts), np.concatenate(entry_parts)

    def _request_ids(self, idx: np.ndarray) -> list[str]:
        """Decode the request ids of slots ``idx`` from the arena in one gather."""
        lens = self._rid_len[idx].astype(np.int64)
        total = int(lens.sum())
        if not total:
            return [""] * len(idx)
        ends = np.cumsum(lens)
        src = np.repeat(self._rid_start[idx] - (ends - lens), lens) + np.arange(total)
        view = np.frombuffer(self._rids, np.uint8)
        raw = view[src].tobytes()
        del view
        bounds = [0, *ends.tolist()]
        return [raw[bounds[i] : bounds[i + 1]].decode() for i in range(len(idx))]

    # ------------------------------------------------------------------ checkpoints

    def low_offsets(self) -> dict[str, int | None]:
        """Smallest source offset per kind still needed to rebuild this partition's state:
        pending impressions, the feedback attached to them, and held feedback."""
        attached = self._fb_offsets.low(self._fb_offset)
        held = [
            h.offset - 1
            for waiting in self._held.values()
            for h in waiting
            if h.alive and h.offset > 0
        ]
        if attached is not None:
            held.append(attached)
        return {
            "impression": self._imp_offsets.low(self._offset),
            "feedback": min(held, default=None),
        }
