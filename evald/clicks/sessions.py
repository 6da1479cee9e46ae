"""Sessions: served lists with their clicks, as the click models read them.

A session is one served list cut to the model's depth: at each rank the key of its (query,
item) pair and whether the item was clicked. The models never see query or item text: a pair
is one integer key (``pair_keys`` combines a query key with item keys; offline, ``Vocabulary``
numbers the pairs exactly). ``weights`` lets one row stand for several identical sessions
(``dedupe``), which is how a big log fits in memory: a batch EM over the distinct sessions with
their counts is the batch EM over the log.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from evald.clicks.settings import MAX_DEPTH

#: odd 64-bit multiplier (the golden ratio's) that spreads a query key before it is mixed
#: with an item key; as a signed int64
_MIX = np.int64(-7046029254386353131)


@dataclass(frozen=True, slots=True)
class Sessions:
    """A batch of sessions, columnar. Ranks past ``lengths`` are padding (pair 0, no click)."""

    pairs: np.ndarray  # int64 (n, depth): the (query, item) key at each rank
    clicks: np.ndarray  # bool (n, depth)
    lengths: np.ndarray  # int64 (n,): ranks shown, at most depth
    segments: np.ndarray  # intp (n,): index of the session's segment (the caller's numbering)
    ts: np.ndarray  # int64 (n,): event time in ms (the horizon's clock)
    weights: np.ndarray  # float64 (n,): how many identical sessions the row stands for

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def depth(self) -> int:
        return int(self.pairs.shape[1])

    def shown(self) -> np.ndarray:
        """bool (n, depth): the rank was shown (within ``lengths``)."""
        return np.arange(self.depth) < self.lengths[:, None]

    def take(self, index: np.ndarray | slice) -> Sessions:
        """The sessions at ``index`` (an index array, a mask or a slice), in that order."""
        return Sessions(
            self.pairs[index],
            self.clicks[index],
            self.lengths[index],
            self.segments[index],
            self.ts[index],
            self.weights[index],
        )

    @classmethod
    def build(
        cls,
        pairs: Sequence[Sequence[int]],
        clicks: Sequence[Sequence[bool | int]],
        *,
        depth: int | None = None,
        segments: Sequence[int] | None = None,
        ts: Sequence[int] | None = None,
        weights: Sequence[float] | None = None,
    ) -> Sessions:
        """Sessions from Python lists (one list of pair keys and one of clicks per session),
        cut to ``depth`` (default: the longest list)."""
        n = len(pairs)
        if len(clicks) != n:
            raise ValueError("pairs and clicks must have one row per session")
        width = depth if depth is not None else max((len(p) for p in pairs), default=1)
        width = max(1, min(width, MAX_DEPTH))
        keys = np.zeros((n, width), np.int64)
        hits = np.zeros((n, width), bool)
        lengths = np.zeros(n, np.int64)
        for i, (row, marks) in enumerate(zip(pairs, clicks, strict=True)):
            if len(marks) != len(row):
                raise ValueError(f"session {i}: {len(row)} pairs but {len(marks)} click marks")
            m = min(len(row), width)
            keys[i, :m] = row[:m]
            hits[i, :m] = [bool(c) for c in marks[:m]]
            lengths[i] = m
        return cls(
            keys,
            hits,
            lengths,
            np.zeros(n, np.intp) if segments is None else np.asarray(segments, np.intp),
            np.zeros(n, np.int64) if ts is None else np.asarray(ts, np.int64),
            np.ones(n) if weights is None else np.asarray(weights, np.float64),
        )


def concat(parts: Sequence[Sessions]) -> Sessions:
    """One batch from several of the same depth, in order."""
    if not parts:
        raise ValueError("nothing to concatenate")
    return Sessions(
        np.concatenate([p.pairs for p in parts]),
        np.concatenate([p.clicks for p in parts]),
        np.concatenate([p.lengths for p in parts]),
        np.concatenate([p.segments for p in parts]),
        np.concatenate([p.ts for p in parts]),
        np.concatenate([p.weights for p in parts]),
    )


def dedupe(sessions: Sessions) -> Sessions:
    """Identical sessions (same segment, pairs, clicks and length) as one row whose weight is
    the sum of theirs, in order of first appearance; times keep the first one's. Every model
    here reads a session only through these fields, so its fit is unchanged."""
    n = len(sessions)
    if n == 0:
        return sessions
    rows = np.concatenate(
        [
            sessions.segments[:, None].astype(np.int64),
            sessions.lengths[:, None],
            sessions.pairs,
            sessions.clicks.astype(np.int64),
        ],
        axis=1,
    )
    _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    totals = np.bincount(inverse, weights=sessions.weights, minlength=len(first))
    order = np.argsort(first, kind="stable")
    out = sessions.take(first[order])
    return Sessions(out.pairs, out.clicks, out.lengths, out.segments, out.ts, totals[order])


def pair_keys(queries: np.ndarray, items: np.ndarray) -> np.ndarray:
    """int64 (n, depth) pair keys from query keys (n,) and item keys (n, depth): one odd
    multiply and an xor, so a query's pairs spread over the key space. Two different pairs can
    share a key with probability about pairs² / 2⁶⁴ (then they share parameters); the
    offline path numbers pairs exactly instead (``Vocabulary``)."""
    q = np.asarray(queries, np.int64)[:, None]
    with np.errstate(over="ignore"):
        return np.bitwise_xor(q * _MIX, np.asarray(items, np.int64))


class Vocabulary:
    """Exact numbering of hashable values (query and item ids, (query, item) pairs), in order
    of first appearance, starting at 1 (0 is the padding key)."""

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}
        self.values: list[Hashable] = [None]

    def __len__(self) -> int:
        return len(self.values) - 1

    def id(self, value: Hashable) -> int:
        """The value's number, given a new one the first time it is seen."""
        found = self._ids.get(value)
        if found is None:
            found = self._ids[value] = len(self.values)
            self.values.append(value)
        return found

    def get(self, value: Hashable) -> int:
        """The value's number, 0 if it was never seen."""
        return self._ids.get(value, 0)
