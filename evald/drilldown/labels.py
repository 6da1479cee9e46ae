"""The labels of the lists that are not segment keys, for the drop attribution.

The segments name only the configured ``label_keys``; a drop can be carried by any other label
of the impressions (``device=android`` while the segments are arm and surface). Each list's
other labels become (key, value) pairs, summarised per segment and base window by the same
heavy-hitter ``Summary`` as the queries (``QueryWindows``, one item per pair), so:

* at most ``max_keys`` keys of a list are taken (its non-segment keys in code-point order, the
  first ``max_keys``); the key ``query`` is left out (the attribution's query dimension);
* a summary holds at most ``2 x capacity`` pairs, whatever the number of distinct keys and
  values, and misses no pair with more than ``1 / (capacity + 1)`` of its pairs: hostile
  values cost bounded memory;
* a pair is one string, ``"<len(key)>:<key><value>"``, which splits back without ambiguity
  whatever characters the key holds.

Fed by the same calls as the query summaries (the scored lists, and the results a restore
absorbs: a result record carries every label of its impression), so they are exact through a
restart like them (docs/drilldown.md, "Drop attribution").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from itertools import repeat
from operator import add, itemgetter

import numpy as np

__all__ = ["LabelPairs", "pair", "split"]

#: the attribution's dimension of the queries: a label key so named is not summarised
QUERY = "query"


def pair(key: str, value: str) -> str:
    """One label pair as one summary item."""
    return f"{len(key)}:{key}{value}"


def split(item: str) -> tuple[str, str]:
    """The (key, value) of a :func:`pair`."""
    colon = item.index(":")
    n = int(item[:colon])
    rest = item[colon + 1 :]
    return rest[:n], rest[n:]


class LabelPairs:
    """Each list's non-segment label pairs. The keys taken are cached per key set (a stream
    has a handful), with each key's ``"<len>:<key>"`` prefix: a pair is then one string
    concatenation, whatever the values (a value new on every list misses no cache)."""

    #: key sets cached before the cache is emptied (as the query normaliser's)
    CACHE = 4096

    def __init__(self, segment_keys: Collection[str], max_keys: int) -> None:
        self._skip = frozenset(segment_keys) | {QUERY}
        self.max_keys = max_keys
        self._kept: dict[tuple[str, ...], list[tuple[str, str]]] = {}

    def pairs(self, labels: Mapping[str, str]) -> list[str]:
        """The list's pairs: its non-segment keys in code-point order, the first ``max_keys``."""
        return [prefix + labels[k] for k, prefix in self._taken(labels)]

    def _taken(self, labels: Mapping[str, str]) -> list[tuple[str, str]]:
        """(key, its pair prefix) of the keys taken from a list with ``labels``' keys."""
        keys = tuple(labels)
        kept = self._kept.get(keys)
        if kept is None:
            if len(self._kept) >= self.CACHE:
                self._kept.clear()
            taken = sorted(k for k in keys if k not in self._skip)[: self.max_keys]
            kept = self._kept[keys] = [(k, pair(k, "")) for k in taken]
        return kept

    def expand(self, labels: Sequence[Mapping[str, str]]) -> tuple[np.ndarray, list[str]]:
        """(row of each pair, the pairs): every list's pairs in list order (the hot path)."""
        shapes = list(map(tuple, labels))
        if shapes and shapes.count(shapes[0]) == len(shapes):
            return self._columns(labels)
        rows: list[int] = []
        items: list[str] = []
        cached, taken = self._kept.get, self._taken
        for i, (one, keys) in enumerate(zip(labels, shapes, strict=True)):
            kept = cached(keys)
            for k, prefix in taken(one) if kept is None else kept:
                rows.append(i)
                items.append(prefix + one[k])
        return np.asarray(rows, np.intp), items

    def _columns(self, labels: Sequence[Mapping[str, str]]) -> tuple[np.ndarray, list[str]]:
        """``expand`` of lists that share one key set (a batch's usual case, whatever the
        values): each key's pairs made for every list at once by C-level ``map``, interleaved
        by slice assignment into the same order as list by list."""
        n, kept = len(labels), self._taken(labels[0])
        m = len(kept)
        items = [""] * (n * m)
        for j, (k, prefix) in enumerate(kept):
            items[j::m] = list(map(add, repeat(prefix, n), map(itemgetter(k), labels)))
        return np.repeat(np.arange(n, dtype=np.intp), m), items
