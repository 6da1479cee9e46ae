"""ListMemory: what one partition remembers of past lists, to score the next ones.

Two bounded maps, both in the partition's checkpoint (``PartitionState.zero_feedback``) so a
restart scores the next lists exactly as the uninterrupted run would:

* **judged**: (query, item) pairs that had feedback with a non-zero grade in a finalized list,
  each with the newest such list's event time; at most ``judged_capacity`` pairs, the pair
  written least recently dropped first.
* **references**: per query, the newest list the reference arm served (its first ``depth``
  stable item keys and event time); at most ``reference_capacity`` queries, likewise.

An entry older than ``retention`` before the list being scored counts as absent. Lists are
scored in the order the engine finalizes them, which a restore reproduces.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
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

    Both maps are arrays in the order of their last write, oldest first, read and written a
    batch at a time (evald/zerofeedback/lru.py): the judged pairs' keys and times, the
    references' query keys, times, item keys (0-padded rows) and lengths."""

    def __init__(
        self,
        *,
        p: float,
        reference: str,
        retention: int,
        judged_capacity: int,
        reference_capacity: int,
    ) -> None:
        self.p, self.reference, self.retention = p, reference, retention
        self.judged_capacity, self.reference_capacity = judged_capacity, reference_capacity
        self._queries: dict[str, int] = {}  # a memo of item_key, not state
        self._judged = np.zeros(0, np.uint64)
        self._judged_ts = np.zeros(0, np.int64)
        self._judged_order = np.zeros(0, np.intp)  # sorts _judged (lru.batch)
        self._refs = np.zeros(0, np.int64)  # query keys: no text is checkpointed
        self._refs_order = np.zeros(0, np.intp)
        self._ref_ts = np.zeros(0, np.int64)
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
        with np.errstate(over="ignore"):  # wrapping is the mix
            pairs = qkeys.view(np.uint64)[:, None] * np.uint64(_MIX) + lists.keys.view(np.uint64)
        held = (np.arange(lists.keys.shape[1]) < counts[:, None]) & scored[:, None]
        out[:, UNJUDGED] = self._unjudged(pairs, held, held & lists.judged, ts, counts)
        compared, second, size = self._compare(qkeys, lists.arms, ts, scored, lists.keys, counts)
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
        src, keep, self._judged_order = lru.batch(
            self._judged,
            self._judged_order,
            self.judged_capacity,
            pairs[writes],
            pairs[held],
            written_before[rows],
        )
        # the times by position, then _ABSENT where a read's -1 (not held) lands
        times = np.concatenate([self._judged_ts, np.repeat(ts, per_list), [_ABSENT]])
        seen = times[src]
        self._judged = np.concatenate([self._judged, pairs[writes]])[keep]
        self._judged_ts = times[keep]
        fresh = np.bincount(rows, weights=seen < (ts - self.retention)[rows], minlength=len(ts))
        out = np.full(len(ts), math.nan)
        has = held[:, 0]  # a list's held pairs are a prefix: any, the first
        out[has] = fresh[has] / counts[has]
        return out

    def _compare(
        self,
        qkeys: np.ndarray,
        arms: Sequence[str | None],
        ts: np.ndarray,
        scored: np.ndarray,
        keys: np.ndarray,
        counts: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A reference arm's list becomes its query's reference, another arm's list is
        compared with its query's reference then (the newest one within the retention).
        (The lists compared, their references' keys (0-padded rows) and lengths.)"""
        n = len(ts)
        kind = np.fromiter(map({self.reference: 1, None: 0}.get, arms, repeat(2)), np.int8, n)
        writes, reads = (kind == 1) & scored, (kind == 2) & scored
        wrote, read = np.flatnonzero(writes), np.flatnonzero(reads)
        src, keep, self._refs_order = lru.batch(
            self._refs,
            self._refs_order,
            self.reference_capacity,
            qkeys[wrote],
            qkeys[read],
            np.cumsum(writes)[read],
        )
        width = max(keys.shape[1], self._ref_keys.shape[1])
        both = np.zeros((len(self._refs) + len(wrote), width), np.int64)
        times = np.concatenate([self._ref_ts, ts[wrote]])
        lengths = np.concatenate([self._ref_lengths, counts[wrote]])
        both[: len(self._refs), : self._ref_keys.shape[1]] = self._ref_keys
        both[len(self._refs) :, : keys.shape[1]] = keys[wrote]
        self._refs = np.concatenate([self._refs, qkeys[wrote]])[keep]
        self._ref_ts, self._ref_lengths, self._ref_keys = times[keep], lengths[keep], both[keep]
        found = src >= 0
        found[found] = times[src[found]] >= ts[read[found]] - self.retention
        return read[found], both[src[found]], lengths[src[found]]

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
        oldest first."""
        judged = np.stack([self._judged.view(np.int64), self._judged_ts], axis=1)
        width = 3 + int(self._ref_lengths.max(initial=0))
        rows = np.zeros((len(self._refs), width), np.int64)
        rows[:, 0], rows[:, 1], rows[:, 2] = self._refs, self._ref_ts, self._ref_lengths
        rows[:, 3:] = self._ref_keys[:, : width - 3]
        return {"judged": _b64(judged), "references": _b64(rows), "width": width}

    def load(self, doc: dict[str, Any]) -> None:
        """Replace the memory by a :meth:`state`; ValueError for a malformed one."""
        try:
            judged = _unb64(doc["judged"]).reshape(-1, 2)
            rows = _unb64(doc["references"]).reshape(-1, int(doc["width"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"zero_feedback state is malformed ({exc})") from None
        at, newest = _distinct(judged[:, 0])
        self._judged, self._judged_ts = judged[at, 0].view(np.uint64), judged[newest, 1]
        self._judged_order = np.argsort(self._judged)
        at, newest = _distinct(rows[:, 0])
        keys = rows[newest, 3:]
        lengths = np.clip(rows[newest, 2], 0, keys.shape[1])
        keys[np.arange(keys.shape[1]) >= lengths[:, None]] = 0
        self._refs, self._ref_ts = rows[at, 0], rows[newest, 1]
        self._refs_order = np.argsort(self._refs)
        self._ref_keys, self._ref_lengths = keys, lengths


def _distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of rows with these keys, read into a dict in order: each key's first row (where the
    dict holds it) and last row (the value it holds)."""
    _, first = np.unique(keys, return_index=True)
    _, last = np.unique(keys[::-1], return_index=True)
    order = np.argsort(first)
    return first[order], (len(keys) - 1 - last)[order]


def _signed(key: int) -> int:
    return key - (1 << 64) if key >= 1 << 63 else key


def _b64(arr: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, "<i8").tobytes()).decode()


def _unb64(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text, validate=True), "<i8").copy()
