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
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, cast

import numpy as np

from evald.join.item_keys import item_key
from evald.zerofeedback.rbo import rbo_ext, rbo_ext_rows

__all__ = ["EMPTY", "QUANTITIES", "RBO", "UNJUDGED", "ListMemory", "Scored"]

#: the per-list quantities, in column order
QUANTITIES = ("empty", "unjudged", "rbo")
EMPTY, UNJUDGED, RBO = range(3)

_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
#: a reference during a batch: the keys of an earlier list, or a row of the batch's keys
_Ref = tuple[int, ...] | int
_NONE = (0, ())
_ABSENT = -(1 << 63)
_BUCKET_BITS = 15  # 32,768 buckets of the judged pairs' top bits (64 KiB a partition)
_BUCKET_SHIFT = 64 - _BUCKET_BITS  # the judged time of a pair not held: before every horizon


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
    """One partition's judged pairs and reference lists; ``score`` reads and updates them."""

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
        #: ordered by last write; an OrderedDict, as popping the oldest of a plain dict that
        #: churns walks the deleted entries before it (a tenth of the stage's time measured)
        self._judged: OrderedDict[int, int] = OrderedDict()
        self._queries: dict[str, int] = {}  # a memo of item_key, not state
        #: per bucket of the judged pairs' top bits, how many it holds (derived, not state):
        #: a pair in an empty bucket is not held, so most reads skip the dict
        self._buckets = array("H", bytes(2 << _BUCKET_BITS))
        #: query key -> (ts, keys): the query as its stable key, so no text is checkpointed
        self._references: dict[int, tuple[int, _Ref]] = {}  # tuples between batches

    def score(self, lists: Scored) -> np.ndarray:
        """(n, 3) values per list in ``QUANTITIES`` order (NaN: not defined for it), each
        list scored against the memory the lists before it left, then remembered.

        The batch at once rather than list by list (a Python loop per list was the stage's
        cost): the unjudged shares from the judged pairs read in bulk and corrected for the
        batch's own writes (``_unjudged``), the references in one short loop (``_compare``),
        RBO after it (``_rbo``)."""
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
        qkeys = np.fromiter(qlist, np.int64, n).view(np.uint64)
        with np.errstate(over="ignore"):  # wrapping is the mix
            pairs = qkeys[:, None] * np.uint64(_MIX) + lists.keys.view(np.uint64)
        held = (np.arange(lists.keys.shape[1]) < counts[:, None]) & scored[:, None]
        out[:, UNJUDGED] = self._unjudged(pairs, held, held & lists.judged, ts, counts)
        compared, against, kept = self._compare(
            qlist, lists.arms, ts.tolist(), np.flatnonzero(scored).tolist()
        )
        out[:, RBO] = self._rbo(lists.keys, counts, compared, against)
        self._keep(kept, lists.keys, counts)
        return out

    def _unjudged(
        self,
        pairs: np.ndarray,
        held: np.ndarray,
        writes: np.ndarray,
        ts: np.ndarray,
        counts: np.ndarray,
    ) -> np.ndarray:
        """Each list's share of held pairs not judged within the retention (NaN: no pair).

        1. Every held pair's judged time before the batch, read at once (absent: ``_ABSENT``).
        2. The batch's writes, one by one in the lists' order as the loop did (``_write``),
           noting what each evicted.
        3. A pair that a list before it wrote or evicted within the batch takes that newest
           event's value instead (``_replay``)."""
        rows = np.nonzero(held)[0]  # row-major: each list's pairs in rank order
        read = pairs[held]
        bucket = read >> np.uint64(64 - _BUCKET_BITS)
        maybe = np.flatnonzero(np.frombuffer(self._buckets, np.uint16)[bucket])
        seen = np.full(len(read), _ABSENT, np.int64)
        get = self._judged.get
        seen[maybe] = np.fromiter(
            map(get, read[maybe].tolist(), repeat(_ABSENT)), np.int64, len(maybe)
        )
        written = pairs[writes]
        if len(written):
            by = np.nonzero(writes)[0]
            evicted = self._write(written.tolist(), ts[by].tolist())
            _replay(seen, read, bucket, rows, written, by, ts, evicted)
        fresh = np.bincount(rows, weights=seen < (ts - self.retention)[rows], minlength=len(ts))
        out = np.full(len(ts), math.nan)
        has = held[:, 0]  # a list's held pairs are a prefix: any, the first
        out[has] = fresh[has] / counts[has]
        return out

    def _write(self, pairs: list[int], times: list[int]) -> list[tuple[int, int]]:
        """Write the pairs in order (the newest write last: the least recent goes first);
        (write index, pair) of each eviction."""
        judged, capacity, buckets = self._judged, self.judged_capacity, self._buckets
        to_end, pop = judged.move_to_end, judged.popitem
        evicted = []
        for w, (pair, t) in enumerate(zip(pairs, times, strict=True)):
            if pair in judged:
                to_end(pair)
            else:
                buckets[pair >> _BUCKET_SHIFT] += 1
            judged[pair] = t
            if len(judged) > capacity:
                gone = pop(last=False)[0]
                buckets[gone >> _BUCKET_SHIFT] -= 1
                evicted.append((w, gone))
        return evicted

    def _compare(
        self, qlist: list[int], arms: Sequence[str | None], times: Sequence[int], rows: list[int]
    ) -> tuple[list[int], list[_Ref], list[int]]:
        """In the lists' order: a reference arm's list becomes its query's reference (held as
        its batch row until ``_keep``), another arm's list notes the reference it is compared
        with (a row of this batch or an earlier list's keys). (The lists compared, their
        references, the queries given one.)"""
        refs, retention, reference = self._references, self.retention, self.reference
        capacity, get, pop = self.reference_capacity, refs.get, refs.pop
        compared: list[int] = []
        against: list[_Ref] = []
        kept: list[int] = []
        for i in rows:
            arm = arms[i]
            if arm == reference:
                query = qlist[i]
                pop(query, None)
                refs[query] = (times[i], i)
                kept.append(query)
                if len(refs) > capacity:
                    del refs[next(iter(refs))]
            elif arm is not None:
                ref = get(qlist[i])
                if ref is not None and ref[0] >= times[i] - retention:
                    compared.append(i)
                    against.append(ref[1])
        return compared, against, kept

    def _keep(self, kept: list[int], keys: np.ndarray, counts: np.ndarray) -> None:
        """The references of queries ``kept`` still held as rows of this batch become tuples
        of keys, as the checkpoint and the next batches read them."""
        refs = self._references
        held = [(query, ref) for query in kept if type((ref := refs.get(query, _NONE))[1]) is int]
        if held:
            rows = [ref[1] for _, ref in held]
            for (query, (ts, _)), values, count in zip(
                held, keys[rows].tolist(), counts[rows].tolist(), strict=True
            ):
                refs[query] = (ts, tuple(values[:count]))

    def _rbo(
        self, keys: np.ndarray, counts: np.ndarray, compared: list[int], against: list[_Ref]
    ) -> np.ndarray:
        """Each list's RBO against the reference it was compared with (NaN: none), those of
        equal lengths together (``rbo_ext_rows``: the same bits as ``rbo_ext``, at a fraction
        of a call per list), the others one by one. A reference is a row of this batch's keys
        or an earlier list's tuple, both fixed when the list was reached."""
        out = np.full(len(counts), math.nan)
        if not compared:
            return out
        second, size = self._references_of(keys, counts, against)
        first_size = counts[compared]
        rows = np.asarray(compared)
        equal = (first_size == size) & (size > 0)
        for k in np.flatnonzero(~equal).tolist():
            i, count = compared[k], int(first_size[k])
            out[i] = rbo_ext(keys[i, :count].tolist(), second[k, : size[k]].tolist(), self.p)
        for length in np.unique(size[equal]).tolist():
            pick = equal & (size == length)
            out[rows[pick]] = rbo_ext_rows(keys[rows[pick], :length], second[pick, :length], self.p)
        return out

    @staticmethod
    def _references_of(
        keys: np.ndarray, counts: np.ndarray, against: list[_Ref]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The references' keys (0-padded rows) and lengths: this batch's rows gathered, the
        earlier lists' tuples of the full depth stacked, the shorter ones one by one."""
        depth = keys.shape[1]
        second = np.zeros((len(against), depth), np.int64)
        size = np.empty(len(against), np.int64)
        batch = [k for k, ref in enumerate(against) if type(ref) is int]
        if batch:
            rows = [against[k] for k in batch]
            second[batch], size[batch] = keys[rows], counts[rows]
        if len(batch) < len(against):
            full = [k for k, ref in enumerate(against) if type(ref) is tuple and len(ref) == depth]
            if full:  # one flat iterable: a list of tuples is read far more slowly
                flat = chain.from_iterable([cast("tuple[int, ...]", against[k]) for k in full])
                second[full] = np.fromiter(flat, np.int64, len(full) * depth).reshape(-1, depth)
                size[full] = depth
            for k, ref in enumerate(against):
                if type(ref) is tuple and len(ref) != depth:
                    second[k, : len(ref)], size[k] = ref, len(ref)
        return second, size

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
        return len(self._judged), len(self._references)

    # ---------------------------------------------------------------- checkpoint

    def state(self) -> dict[str, Any]:
        """The memory as JSON for the checkpoint: the judged pairs as base64 int64 rows
        (key, ts), the references as base64 int64 rows (query key, ts, n, keys...)."""
        judged = np.asarray([(_signed(k), ts) for k, ts in self._judged.items()], np.int64).reshape(
            -1, 2
        )
        refs = cast("dict[int, tuple[int, tuple[int, ...]]]", self._references)  # kept: tuples
        width = 3 + max((len(keys) for _, keys in refs.values()), default=0)
        rows = np.zeros((len(refs), width), np.int64)
        for row, (query, (ts, keys)) in zip(rows, refs.items(), strict=True):
            row[0], row[1], row[2] = _signed(query), ts, len(keys)
            row[3 : 3 + len(keys)] = keys
        return {"judged": _b64(judged), "references": _b64(rows), "width": width}

    def load(self, doc: dict[str, Any]) -> None:
        """Replace the memory by a :meth:`state`; ValueError for a malformed one."""
        try:
            judged = _unb64(doc["judged"]).reshape(-1, 2)
            rows = _unb64(doc["references"]).reshape(-1, int(doc["width"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"zero_feedback state is malformed ({exc})") from None
        self._judged = OrderedDict((k & _MASK, ts) for k, ts in judged.tolist())
        self._buckets = array("H", bytes(2 << _BUCKET_BITS))
        for key in self._judged:
            self._buckets[key >> _BUCKET_SHIFT] += 1
        self._references = {row[0]: (row[1], tuple(row[3 : 3 + row[2]])) for row in rows.tolist()}


def _replay(
    seen: np.ndarray,
    read: np.ndarray,
    bucket: np.ndarray,
    rows: np.ndarray,
    written: np.ndarray,
    by: np.ndarray,
    ts: np.ndarray,
    evicted: list[tuple[int, int]],
) -> None:
    """Correct ``seen`` (each read pair's judged time before the batch; ``rows``: the list
    that reads it) for the batch's own events: a pair a list before the reader wrote (at
    that list's time, ``written`` by lists ``by``) or evicted (after write ``evicted[k][0]``)
    takes the newest such event's value, as the list-by-list loop would have read it."""
    pair, row, value = written, by, ts[by]
    if evicted:
        at = np.asarray([w for w, _ in evicted], np.intp)
        order = np.argsort(np.concatenate([2 * np.arange(len(written)), 2 * at + 1]), kind="stable")
        pair = np.concatenate([written, np.asarray([p for _, p in evicted], np.uint64)])[order]
        row = np.concatenate([by, by[at]])[order]
        value = np.concatenate([value, np.full(len(at), _ABSENT)])[order]
    touched = np.zeros(1 << _BUCKET_BITS, bool)  # np.isin cost ten times these buckets
    touched[pair >> np.uint64(64 - _BUCKET_BITS)] = True
    hit = np.flatnonzero(touched[bucket])
    held = np.sort(pair)
    hit = hit[held[np.minimum(np.searchsorted(held, read[hit]), len(held) - 1)] == read[hit]]
    if not len(hit):
        return
    events = len(pair)
    pair = np.concatenate([pair, read[hit]])
    # a list's events sort after its own reads and before the next list's: 2j + 1 vs 2i
    order = np.lexsort((np.concatenate([2 * row + 1, 2 * rows[hit]]), pair))  # stable
    pair = pair[order]
    is_event = order < events
    last = np.maximum.accumulate(np.where(is_event, np.arange(len(order)), -1))
    reads = np.flatnonzero(~is_event)
    prior = last[reads]
    found = prior >= 0
    found[found] = pair[prior[found]] == pair[reads[found]]
    seen[hit[order[reads[found]] - events]] = value[order[prior[found]]]


def _signed(key: int) -> int:
    return key - (1 << 64) if key >= 1 << 63 else key


def _b64(arr: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, "<i8").tobytes()).decode()


def _unb64(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text, validate=True), "<i8").copy()
