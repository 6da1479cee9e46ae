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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evald.join.item_keys import item_key
from evald.zerofeedback.rbo import rbo_ext, rbo_ext_rows

__all__ = ["EMPTY", "QUANTITIES", "RBO", "UNJUDGED", "ListMemory", "Scored"]

#: the per-list quantities, in column order
QUANTITIES = ("empty", "unjudged", "rbo")
EMPTY, UNJUDGED, RBO = range(3)

_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def pair_key(query_key: int, item: int) -> int:
    """One 64-bit key of a (query, item) pair from their stable keys."""
    return ((query_key & _MASK) * _MIX + (item & _MASK)) & _MASK


@dataclass(frozen=True, slots=True)
class Scored:
    """The lists of one batch: arrays in the batch's order."""

    queries: Sequence[str]
    arms: Sequence[str | None]  # the arm label's value per list (None: no such label)
    ts: Sequence[int]
    lengths: Sequence[int]  # items served
    keys: np.ndarray  # (n, depth) stable keys, 0-padded
    key_lengths: Sequence[int]
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
        #: query key -> (ts, keys): the query as its stable key, so no text is checkpointed
        self._references: dict[int, tuple[int, tuple[int, ...]]] = {}

    def score(self, lists: Scored) -> np.ndarray:
        """(n, 3) values per list in ``QUANTITIES`` order (NaN: not defined for it), each
        list scored against the memory the lists before it left, then remembered.

        Long because: the per-list loop is the stage's hot path, its lookups kept local and
        its values gathered in Python lists (a numpy scalar read or write per list cost more
        than the dict lookups)."""
        n = len(lists.ts)
        out = np.full((n, 3), math.nan)
        out[:, EMPTY] = np.asarray(lists.lengths) == 0
        memo = self._queries.get
        qlist = [memo(q) or self._query_key(q) for q in lists.queries]
        qkeys = np.asarray(qlist, np.int64).view(np.uint64)
        with np.errstate(over="ignore"):  # wrapping is the mix
            mixed = qkeys[:, None] * np.uint64(_MIX) + lists.keys.view(np.uint64)
        pairs = mixed.tolist()
        keys_all = lists.keys.tolist()
        # the pairs each list writes (had feedback), back to back: a slice per list in the
        # loop rather than a walk over every rank's flag
        counts = np.asarray(lists.key_lengths, np.int64)
        write = lists.judged & (np.arange(lists.keys.shape[1]) < counts[:, None])
        writes = mixed[write].tolist()
        per_list = write.sum(axis=1)
        ends = np.cumsum(per_list)
        firsts, ends = (ends - per_list).tolist(), ends.tolist()
        unjudged = [math.nan] * n
        compared: list[tuple[int, tuple[int, ...]]] = []  # (list, its reference's keys)
        judged, references, retention = self._judged, self._references, self.retention
        reference, capacity = self.reference, self.judged_capacity
        get, contains, to_end = judged.get, judged.__contains__, judged.move_to_end
        for i, (query, arm, ts, length, count) in enumerate(
            zip(lists.queries, lists.arms, lists.ts, lists.lengths, lists.key_lengths, strict=True)
        ):
            if not query or (length and not count):
                continue  # no query, or items the keys were not kept for (docs/drilldown.md)
            horizon = ts - retention
            row = pairs[i][:count]
            if count:
                fresh = 0
                for pair in row:
                    if get(pair, horizon - 1) < horizon:
                        fresh += 1
                unjudged[i] = fresh / count
            if arm == reference:
                self._remember_reference(qlist[i], ts, tuple(keys_all[i][:count]))
            elif arm is not None:
                ref = references.get(qlist[i])
                if ref is not None and ref[0] >= horizon:
                    compared.append((i, ref[1]))
            first, end = firsts[i], ends[i]
            if first != end:
                for pair in writes[first:end]:
                    if contains(pair):  # the newest write last: the least recent goes first
                        to_end(pair)
                    judged[pair] = ts
                    if len(judged) > capacity:
                        judged.popitem(last=False)
        out[:, UNJUDGED] = unjudged
        out[:, RBO] = self._rbo(lists.keys, lists.key_lengths, compared)
        return out

    def _rbo(
        self, keys: np.ndarray, counts: Sequence[int], compared: list[tuple[int, tuple[int, ...]]]
    ) -> np.ndarray:
        """Each list's RBO against the reference it was compared with (NaN: none), those of
        equal lengths together (``rbo_ext_rows``: the same bits as ``rbo_ext``, at a fraction
        of a call per list), the others one by one. The reference's keys are a tuple taken
        when the list was reached, so computing after the batch's loop changes nothing."""
        out = np.full(len(counts), math.nan)
        by_length: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        for i, ref in compared:
            if counts[i] == len(ref) and ref:
                by_length.setdefault(len(ref), []).append((i, ref))
            else:
                out[i] = rbo_ext(keys[i, : counts[i]].tolist(), ref, self.p)
        for length, group in by_length.items():
            rows = [i for i, _ in group]
            refs = np.asarray([ref for _, ref in group], np.int64)
            out[rows] = rbo_ext_rows(keys[rows, :length], refs, self.p)
        return out

    def _query_key(self, query: str) -> int:
        """The stable key of a query ("" for none), memoised: a few queries carry most lists."""
        key = self._queries.get(query)
        if key is None:
            if len(self._queries) > 4096:
                self._queries.clear()
            key = self._queries[query] = item_key(query) if query else 0
        return key

    def _remember_reference(self, query: int, ts: int, keys: tuple[int, ...]) -> None:
        refs = self._references
        refs.pop(query, None)
        refs[query] = (ts, keys)
        if len(refs) > self.reference_capacity:
            del refs[next(iter(refs))]

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
        width = 3 + max((len(keys) for _, keys in self._references.values()), default=0)
        rows = np.zeros((len(self._references), width), np.int64)
        for row, (query, (ts, keys)) in zip(rows, self._references.items(), strict=True):
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
        self._references = {row[0]: (row[1], tuple(row[3 : 3 + row[2]])) for row in rows.tolist()}


def _signed(key: int) -> int:
    return key - (1 << 64) if key >= 1 << 63 else key


def _b64(arr: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, "<i8").tobytes()).decode()


def _unb64(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text, validate=True), "<i8").copy()
