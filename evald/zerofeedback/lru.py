"""A bounded map ordered by last write, read and written a batch at a time in numpy.

The zero-feedback memory's judged pairs keep the ``capacity`` keys written most recently: a
write moves its key to the newest end, a write of a key not held drops the oldest once the
map is over capacity, a read changes nothing. A batch interleaves them: each list's reads see
the writes of the lists before it. Writing them one by one from Python (an OrderedDict's
``move_to_end`` and ``popitem`` per write, about a write a list) and replaying the batch's
evictions for the reads after them was the largest part of ``ListMemory.score``; ``batch``
finds the same answers with a few dozen array operations per batch.

Why that is possible: with writes only, what such a map holds after a sequence of writes is
the ``capacity`` distinct keys whose last write is the newest (the least-recently-used
"stack" property; an evicted key written again is just a newer write). So a key whose last
write before a read was at position q (of the old keys in order, then the batch's writes) is
held at that read iff fewer than ``capacity`` distinct keys were written after q and before
the read. No eviction has to be replayed.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

__all__ = ["batch"]

#: reads x writes compared at once (bools) before the exact loop takes over (a batch that
#: writes many keys to a small map: not a setting anyone runs, but a config may say so)
_AT_ONCE = 1 << 18
_BITS = 16  # at most, buckets of the keys' top bits: most reads of a key not held stop there


def batch(
    old: np.ndarray,
    order: np.ndarray,
    capacity: int,
    writes: np.ndarray,
    reads: np.ndarray,
    read_at: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read and write a batch: (for each read, the position of its key's held write or -1;
    the positions the map holds after the batch, oldest first; their ``order``).

    Positions index ``old`` (the map's distinct keys, oldest first) followed by ``writes``
    (in order); ``order`` sorts ``old`` (``np.argsort``; kept from batch to batch by a merge,
    as sorting the whole map again cost more than the rest of a batch's reads). ``reads[k]``
    is read after the first ``read_at[k]`` writes (non-decreasing). A map over ``capacity``
    (a checkpoint of a larger one) keeps its size: one key leaves per key that comes in, as
    before it shrank."""
    n_old, n_writes, n_reads = len(old), len(writes), len(reads)
    capacity = max(capacity, n_old)
    asked = np.concatenate([reads, writes])
    at = np.full(len(asked), -1, np.int64)  # each key's position in old (-1: none)
    src, old_at = at[:n_reads], at[n_reads:]  # views: the reads', the writes'
    bits = min(max((8 * (n_old + n_writes)).bit_length(), 8), _BITS)  # 1/8 of buckets or less
    top = (asked.view(np.uint64) >> np.uint64(64 - bits)).astype(np.intp)
    ranked = old[order]
    if n_old:
        maybe = np.flatnonzero(_marks(old, bits)[top])  # a key whose bucket old has none: not held
        found = np.minimum(np.searchsorted(ranked, asked[maybe]), n_old - 1)
        at[maybe] = np.where(ranked[found] == asked[maybe], order[found], -1)
    if not n_writes:
        return src, np.arange(n_old), order
    index = np.argsort(writes, kind="stable")  # by key, then write
    ranked_writes = writes[index]
    first = np.ones(n_writes, bool)
    np.not_equal(ranked_writes[1:], ranked_writes[:-1], out=first[1:])
    # each write's previous write of its key: in this batch, else in old (-1: none)
    previous = np.empty(n_writes, np.int64)
    previous[index] = np.where(first, old_at[index], n_old + np.concatenate([[0], index[:-1]]))
    if n_reads:
        maybe = np.flatnonzero(_marks(writes, bits)[top[:n_reads]])
        if len(maybe):
            _read_writes(src, ranked_writes, first, index, n_old, reads, read_at, maybe)
        _drop_evicted(src, capacity, previous, n_old, read_at)
    live = np.ones(n_old, bool)
    live[old_at[old_at >= 0]] = False
    last = np.append(first[1:], True)
    held = np.concatenate([np.flatnonzero(live), n_old + np.sort(index[last])])[-capacity:]
    # the new order: old's and the writes' sorted positions merged (a stable sort of two
    # sorted runs is a merge), those held renumbered
    slot = np.full(n_old + n_writes, -1, np.intp)
    slot[held] = np.arange(len(held))
    runs = np.argsort(np.concatenate([ranked, ranked_writes]), kind="stable")
    merged = slot[np.concatenate([order, n_old + index])[runs]]
    return src, held, merged[merged >= 0]


def _marks(keys: np.ndarray, bits: int) -> np.ndarray:
    """Per bucket of the keys' top ``bits``, whether any key is in it."""
    marks = np.zeros(1 << bits, bool)
    marks[(keys.view(np.uint64) >> np.uint64(64 - bits)).astype(np.intp)] = True
    return marks


def _read_writes(
    src: np.ndarray,
    ranked: np.ndarray,
    first: np.ndarray,
    index: np.ndarray,
    n_old: int,
    reads: np.ndarray,
    read_at: np.ndarray,
    maybe: np.ndarray,
) -> None:
    """Point each read (of those ``maybe`` written) whose key the batch wrote before it at
    the newest such write (``ranked``: the writes' keys sorted, ``index`` their writes)."""
    keys = ranked[first]
    g = np.minimum(np.searchsorted(keys, reads[maybe]), len(keys) - 1)
    written = keys[g] == reads[maybe]
    g, maybe = g[written], maybe[written]
    if not len(g):
        return
    span = len(index) + 1
    coded = (np.cumsum(first) - 1) * span + index  # sorted: by key, then write
    k = np.searchsorted(coded, g * span + read_at[maybe]) - 1  # the last write before it
    ok = (k >= 0) & (coded[np.maximum(k, 0)] // span == g)
    src[maybe[ok]] = n_old + index[k[ok]]


def _drop_evicted(
    src: np.ndarray, capacity: int, previous: np.ndarray, n_old: int, read_at: np.ndarray
) -> None:
    """-1 for each read whose write was evicted before it: ``capacity`` distinct keys or more
    written after it (the old keys after it, all distinct, and each write whose previous
    write of its key is not after it). Only a read with that many writes after its own can
    be one, usually a few reads of the oldest keys."""
    end = n_old + read_at  # the read's position
    risk = np.flatnonzero((src >= 0) & (end - src - 1 >= capacity))
    if not len(risk):
        return
    n_writes = len(previous)
    if len(risk) * n_writes > _AT_ONCE:
        _drop_evicted_loop(src, capacity, previous, n_old, read_at, risk)
        return
    at = n_old + np.arange(n_writes)
    q = src[risk, None]
    after = (at > q) & (at < end[risk, None]) & (previous <= q)
    count = np.maximum(n_old - 1 - src[risk], 0) + after.sum(axis=1)
    src[risk[count >= capacity]] = -1


def _drop_evicted_loop(
    src: np.ndarray,
    capacity: int,
    previous: np.ndarray,
    n_old: int,
    read_at: np.ndarray,
    risk: np.ndarray,
) -> None:
    """``_drop_evicted`` for a batch of many writes to a small map: the map replayed write by
    write (positions for keys: ``previous`` links a write to its key's last one)."""
    held: OrderedDict[int, None] = OrderedDict.fromkeys(range(n_old))
    evicted = set()
    done = 0
    for k, until in zip(risk.tolist(), read_at[risk].tolist(), strict=True):
        for w in range(done, until):
            before = int(previous[w])
            if before in held:
                del held[before]
            held[n_old + w] = None
            if len(held) > capacity:
                evicted.add(held.popitem(last=False)[0])
        done = max(done, until)
        if src[k] in evicted:
            src[k] = -1
