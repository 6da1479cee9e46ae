"""ListMemory: what one partition remembers of past lists, to score the next ones.

Two bounded maps, both in the partition's checkpoint (``PartitionState.zero_feedback``) so a
restart scores the next lists exactly as the uninterrupted run would:

* **judged**: (query, item) pairs that had feedback with a non-zero grade in a finalized list,
  each with the newest such list's event time; at most ``judged_capacity`` pairs, the pair
  written least recently dropped first.
* **references**: per query, the newest list the reference arm served (its first ``depth``
  stable item keys and event time); at most ``reference_capacity`` queries, likewise. The
  state names the arm (``arm_label``, ``reference``): references of another arm, the settings
  changed across a restart, are dropped on load, or that arm's lists would be compared with
  their own.

An entry older than ``retention`` before the list being scored counts as absent. Lists are
scored in the order the engine finalizes them, which a restore reproduces.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evald.join.item_keys import item_key
from evald.zerofeedback import lru
from evald.zerofeedback.rbo import rbo_ext, rbo_ext_rows

__all__ = ["EMPTY", "QUANTITIES", "RBO", "UNJUDGED", "ListMemory", "Scored"]

#: the per-list quantities, in column order
QUANTITIES = ("empty", "unjudged", "rbo")
EMPTY, UNJUDGED, RBO = range(3)

_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
_ABSENT = -(1 << 63)  # the judged time of a pair not held: before every horizon


def pair_key(query_key: int, item: int) -> int:
    """One 64-bit key of a (query, item) pair from their stable keys."""
    return ((query_key & _MASK) * _MIX + (item & _MASK)) & _MASK


@dataclass(frozen=True, slots=True)
class Scored:
    """The lists of one batch: arrays in the batch's order."""

    queries: Sequence[str]
    arms: Sequence[str | None]  # the arm label's value per list (None: no such label)
    ts: np.ndarray  # int64
    lengths: np.ndarray  # int64: items served
    keys: np.ndarray  # (n, depth) stable keys, 0-padded
    key_lengths: np.ndarray  # int64
    judged: np.ndarray  # (n, depth) bool: the item at that rank had non-zero feedback


class ListMemory:
    """One partition's judged pairs and reference lists; ``score`` reads and updates them.

    The judged pairs are arrays in the order of their last write, oldest first, read and
    written a batch at a time (evald/zerofeedback/lru.py); the references a dict of query
    keys to slots in that order, their times, item keys and lengths in per-slot stores."""

    def __init__(
        self,
        *,
        p: float,
        arm_label: str,
        reference: str,
        retention: int,
        judged_capacity: int,
        reference_capacity: int,
    ) -> None:
        self.p, self.reference, self.retention = p, reference, retention
        self.arm_label = arm_label  # not read here (the caller picks the arms): for the state
        self.judged_capacity, self.reference_capacity = judged_capacity, reference_capacity
        self._queries: dict[str, int] = {}  # a memo of item_key, not state
        self._judged = np.zeros(0, np.uint64)
        self._judged_ts = np.zeros(0, np.int64)
        self._judged_order = np.zeros(0, np.intp)  # sorts _judged (lru.batch)
        #: query key -> slot, oldest first (the query as its key: no text is checkpointed);
        #: per slot the reference's time, keys (0-padded rows) and length
        self._refs: dict[int, int] = {}
        self._ref_ts: list[int] = []
        self._ref_keys = np.zeros((0, 0), np.int64)
        self._ref_lengths = np.zeros(0, np.int64)

    def score(self, lists: Scored) -> np.ndarray:
        """(n, 3) values per list in ``QUANTITIES`` order (NaN: not defined for it), each
        list scored against the memory the lists before it left, then remembered.

        The batch at once rather than list by list (a Python loop per list was the stage's
        cost): the judged pairs and the references each read and written in one ``lru.batch``
        (``_unjudged``, ``_compare``), RBO after it (``_rbo``)."""
        n = len(lists.ts)
        out = np.full((n, 3), math.nan)
        lengths = np.asarray(lists.lengths, np.int64)
        out[:, EMPTY] = lengths == 0
        if not n:
            return out
        qlist = self._query_keys(lists.queries)
        counts = np.asarray(lists.key_lengths, np.int64)
        ts = np.asarray(lists.ts, np.int64)
        # scored: a query, and the keys of its items kept (or no items; docs/drilldown.md)
        scored = np.fromiter(map(bool, lists.queries), bool, n) & ((lengths == 0) | (counts > 0))
        qkeys = np.fromiter(qlist, np.int64, n)
        # wrapping is the mix (array integer arithmetic wraps without a warning)
        pairs = qkeys.view(np.uint64)[:, None] * np.uint64(_MIX) + lists.keys.view(np.uint64)
        held = (np.arange(lists.keys.shape[1]) < counts[:, None]) & scored[:, None]
        out[:, UNJUDGED] = self._unjudged(pairs, held, held & lists.judged, ts, counts)
        compared, second, size = self._compare(qlist, lists.arms, ts, scored, lists.keys, counts)
        out[:, RBO] = self._rbo(lists.keys, counts, compared, second, size)
        return out

    def _unjudged(
        self,
        pairs: np.ndarray,
        held: np.ndarray,
        writes: np.ndarray,
        ts: np.ndarray,
        counts: np.ndarray,
    ) -> np.ndarray:
        """Each list's share of held pairs not judged within the retention (NaN: no pair):
        its pairs read after the lists before it wrote theirs (``lru.batch``)."""
        rows = np.nonzero(held)[0]  # row-major: each list's pairs in rank order
        per_list = writes.sum(axis=1)
        written_before = np.cumsum(per_list) - per_list
        written = pairs[writes]
        src, keep, self._judged_order = lru.batch(
            self._judged,
            self._judged_order,
            self.judged_capacity,
            written,
            pairs[held],
            written_before[rows],
        )
        # the times by position, then _ABSENT where a read's -1 (not held) lands
        times = np.concatenate([self._judged_ts, np.repeat(ts, per_list), [_ABSENT]])
        seen = times[src]
        self._judged = np.concatenate([self._judged, written])[keep]
        self._judged_ts = times[keep]
        fresh = np.bincount(rows, weights=seen < (ts - self.retention)[rows], minlength=len(ts))
        out = np.full(len(ts), math.nan)
        has = held[:, 0]  # a list's held pairs are a prefix: any, the first
        out[has] = fresh[has] / counts[has]
        return out

    def _compare(
        self,
        qlist: list[int],
        arms: Sequence[str | None],
        ts: np.ndarray,
        scored: np.ndarray,
        keys: np.ndarray,
        counts: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """In the lists' order: a reference arm's list becomes its query's reference (noted
        as its batch row until the end of the batch), another arm's list is compared with its
        query's reference then, if within the retention. (The lists compared, their
        references' keys (0-padded rows) and lengths.)

        A short loop of dict operations: the references' map is small and a batch writes a
        third of it, where numpy's fixed cost per call outweighs its speed."""
        refs, retention, reference = self._refs, self.retention, self.reference
        capacity, get, pop = self.reference_capacity, refs.get, refs.pop
        times, ref_ts = ts.tolist(), self._ref_ts
        pending: dict[int, int] = {}  # slot -> the batch row written to it last
        compared: list[int] = []
        source: list[int] = []  # per list compared: its reference's batch row, else -1 - slot
        for i in np.flatnonzero(scored).tolist():
            arm = arms[i]
            if arm == reference:
                query = qlist[i]
                slot = pop(query, None)
                if slot is None:
                    slot = pop(next(iter(refs))) if len(refs) >= capacity else len(refs)
                refs[query], pending[slot] = slot, i
            elif arm is not None:
                slot = get(qlist[i])
                if slot is not None:
                    row = pending.get(slot, -1)
                    if (times[row] if row >= 0 else ref_ts[slot]) >= times[i] - retention:
                        compared.append(i)
                        source.append(row if row >= 0 else -1 - slot)
        second, size = self._references_of(keys, counts, source)
        if pending:
            self._set_references(list(pending), list(pending.values()), keys, counts, times)
        return np.asarray(compared, np.intp), second, size

    def _references_of(
        self, keys: np.ndarray, counts: np.ndarray, source: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The references' keys (0-padded rows) and lengths: batch rows (>= 0) or the slots
        (-1 - slot) of earlier lists' references."""
        src = np.asarray(source, np.intp)
        width = max(keys.shape[1], self._ref_keys.shape[1])
        second = np.zeros((len(src), width), np.int64)
        size = np.zeros(len(src), np.int64)
        batch = src >= 0
        second[batch, : keys.shape[1]] = keys[src[batch]]
        size[batch] = counts[src[batch]]
        slots = -1 - src[~batch]
        second[~batch, : self._ref_keys.shape[1]] = self._ref_keys[slots]
        size[~batch] = self._ref_lengths[slots]
        return second, size

    def _set_references(
        self,
        slots: list[int],
        rows: list[int],
        keys: np.ndarray,
        counts: np.ndarray,
        times: list[int],
    ) -> None:
        """The batch's newest reference lists into their slots (the store grown as needed)."""
        held, width = self._ref_keys.shape
        need = max(held, max(slots) + 1)
        if need > held or keys.shape[1] > width:
            grown = np.zeros((need, max(width, keys.shape[1])), np.int64)
            grown[:held, :width] = self._ref_keys
            self._ref_keys = grown
            self._ref_lengths = np.concatenate([self._ref_lengths, np.zeros(need - held, np.int64)])
            self._ref_ts.extend([0] * (need - held))
        row_keys = np.zeros((len(rows), self._ref_keys.shape[1]), np.int64)
        row_keys[:, : keys.shape[1]] = keys[rows]
        self._ref_keys[slots] = row_keys
        self._ref_lengths[slots] = counts[rows]
        for slot, row in zip(slots, rows, strict=True):
            self._ref_ts[slot] = times[row]

    def _rbo(
        self,
        keys: np.ndarray,
        counts: np.ndarray,
        compared: np.ndarray,
        second: np.ndarray,
        size: np.ndarray,
    ) -> np.ndarray:
        """Each list's RBO against the reference it was compared with (NaN: none), those of
        equal lengths together (``rbo_ext_rows``: the same bits as ``rbo_ext``, at a fraction
        of a call per list), the others one by one."""
        out = np.full(len(counts), math.nan)
        if not len(compared):
            return out
        first_size = counts[compared]
        equal = (first_size == size) & (size > 0)
        for k in np.flatnonzero(~equal).tolist():
            i, count = int(compared[k]), int(first_size[k])
            out[i] = rbo_ext(keys[i, :count].tolist(), second[k, : size[k]].tolist(), self.p)
        for length in sorted(set(size[equal].tolist())):
            pick = equal & (size == length)
            out[compared[pick]] = rbo_ext_rows(
                keys[compared[pick], :length], second[pick, :length], self.p
            )
        return out

    def _query_keys(self, queries: Sequence[str]) -> list[int]:
        """The queries' stable keys ("" for none: 0), from the memo where it has them."""
        keys = list(map(self._queries.get, queries))
        if None in keys:
            for i, key in enumerate(keys):
                if key is None:
                    keys[i] = self._query_key(queries[i])
        return keys  # type: ignore[return-value]

    def _query_key(self, query: str) -> int:
        """The stable key of a query ("" for none), memoised: a few queries carry most lists."""
        key = self._queries.get(query)
        if key is None:
            if len(self._queries) > 4096:
                self._queries.clear()
            key = self._queries[query] = item_key(query) if query else 0
        return key

    def sizes(self) -> tuple[int, int]:
        """(judged pairs, reference queries) held."""
        return len(self._judged), len(self._refs)

    # ---------------------------------------------------------------- checkpoint

    def state(self) -> dict[str, Any]:
        """The memory as JSON for the checkpoint: the judged pairs as base64 int64 rows
        (key, ts), the references as base64 int64 rows (query key, ts, n, keys...), both
        oldest first, and the arm the references are of (label key and value)."""
        judged = np.stack([self._judged.view(np.int64), self._judged_ts], axis=1)
        slots = list(self._refs.values())
        lengths = self._ref_lengths[slots]
        width = 3 + int(lengths.max(initial=0))
        rows = np.zeros((len(slots), width), np.int64)
        rows[:, 0], rows[:, 2] = list(self._refs), lengths
        rows[:, 1] = [self._ref_ts[slot] for slot in slots]
        keys = self._ref_keys[slots, : width - 3]
        rows[:, 3:] = np.where(np.arange(width - 3) < lengths[:, None], keys, 0)
        return {
            "arm_label": self.arm_label,
            "reference": self.reference,
            "judged": _b64(judged),
            "references": _b64(rows),
            "width": width,
        }

    def load(self, doc: dict[str, Any]) -> tuple[str, str] | None:
        """Replace the memory by a :meth:`state`; ValueError for a malformed one. A map
        holding more than its capacity now allows keeps the entries written most recently.
        References of another arm (``arm_label`` or ``reference`` changed since) are dropped,
        the judged pairs kept (they do not depend on the arm): the (arm_label, reference) they
        were of is returned, else None. A state that names no arm (written before it did) is
        taken as of this one."""
        try:
            judged = _unb64(doc["judged"]).reshape(-1, 2)
            width = int(doc["width"])
            if width < 3:  # query key, time, length, then the keys
                raise ValueError(f"width {width} below 3")
            rows = _unb64(doc["references"]).reshape(-1, width)
            held = (doc.get("arm_label", self.arm_label), doc.get("reference", self.reference))
            if not all(isinstance(value, str) for value in held):
                raise ValueError(f"arm {held!r} is not two strings")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"zero_feedback state is malformed ({exc})") from None
        dropped = None if held == (self.arm_label, self.reference) else held
        if dropped is not None:
            rows = rows[:0]
        # a map over its capacity (the capacity lowered across a restart) keeps its newest
        at, newest = (kept[-self.judged_capacity :] for kept in _distinct(judged[:, 0]))
        self._judged, self._judged_ts = judged[at, 0].view(np.uint64), judged[newest, 1]
        self._judged_order = np.argsort(self._judged)
        at, newest = (kept[-self.reference_capacity :] for kept in _distinct(rows[:, 0]))
        keys = rows[newest, 3:]
        lengths = np.clip(rows[newest, 2], 0, keys.shape[1])
        keys[np.arange(keys.shape[1]) >= lengths[:, None]] = 0
        self._refs = dict(zip(rows[at, 0].tolist(), range(len(at)), strict=True))
        self._ref_ts = rows[newest, 1].tolist()
        self._ref_keys, self._ref_lengths = keys, lengths
        return dropped


def _distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of rows with these keys, read into a dict in order: each key's first row (where the
    dict holds it) and last row (the value it holds)."""
    _, first = np.unique(keys, return_index=True)
    _, last = np.unique(keys[::-1], return_index=True)
    order = np.argsort(first)
    return first[order], (len(keys) - 1 - last)[order]


def _b64(arr: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, "<i8").tobytes()).decode()


def _unb64(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text, validate=True), "<i8").copy()
