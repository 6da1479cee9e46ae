"""Stable item keys: the same 64-bit key for an item id in every process.

The join matches feedback to items by Python's ``hash()``, which is salted per process; state
that outlives the process (the zero-feedback memory of judged items and reference lists, kept
in the partition's checkpoint) needs a key a restarted process computes alike. CRC-32 and
Adler-32 of the UTF-8 bytes side by side (good enough for ids not crafted to collide: a
collision only merges two items' judged state).

The arena computes them late and in bulk: a pending list keeps the UTF-8 of its first ids (one
``join`` and ``encode``, a microsecond), and ``take`` computes the keys of a whole finalized
batch with numpy (``keys_of``: the two checksums' byte loops run across all the batch's ids at
once), bit for bit ``item_key``'s; one ``zlib`` call pair per id from Python cost more than
the rest of the signals together.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Sequence

import numpy as np

__all__ = ["KeyArena", "item_key", "item_keys", "keys_of"]

_SIGN = 1 << 63
_WRAP = 1 << 64
_ADLER = 65521
_VECTOR_BYTES = 64  # longer ids (rare): zlib per id, so the byte loop stays short


def _crc_table() -> np.ndarray:
    """The reflected CRC-32 table (polynomial 0xEDB88320), zlib's."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1)
    return table.astype(np.uint32)


_CRC = _crc_table()


def item_key(item: str) -> int:
    """The stable key of one id, as a signed 64-bit integer (an ``array('q')`` cell)."""
    raw = item.encode()
    key = (zlib.crc32(raw) << 32) | zlib.adler32(raw)
    return key - _WRAP if key >= _SIGN else key


def item_keys(items: Sequence[str], depth: int) -> list[int]:
    """The keys of the first ``depth`` ids."""
    return [item_key(item) for item in items[:depth]]


def keys_of(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``item_key`` (int64) of the ids whose UTF-8 is ``raw[start : start + length]``.

    One pass per byte position over the ids still that long (sorted longest first, so the ids
    at a position are a prefix): CRC-32 by its table, Adler-32's two sums exactly in int64 and
    reduced once at the end (the sums are linear, so that is the per-byte modulo's value)."""
    n = len(starts)
    out = np.zeros(n, np.int64)
    if not n:
        return out
    lengths = np.asarray(lengths, np.int64)
    long_ids = np.flatnonzero(lengths > _VECTOR_BYTES)
    for i in long_ids.tolist():
        out[i] = item_key(raw[starts[i] : starts[i] + lengths[i]].tobytes().decode())
    order = np.argsort(-np.minimum(lengths, _VECTOR_BYTES + 1), kind="stable")
    order = order[lengths[order] <= _VECTOR_BYTES]
    lens, at = lengths[order], np.asarray(starts, np.int64)[order]
    crc = np.full(len(order), 0xFFFFFFFF, np.uint32)
    a = np.ones(len(order), np.int64)
    b = np.zeros(len(order), np.int64)
    active = np.searchsorted(-lens, -np.arange(int(lens.max(initial=0))), side="left")
    for pos, k in enumerate(active.tolist()):
        byte = raw[at[:k] + pos]
        c = crc[:k]
        crc[:k] = _CRC[(c ^ byte) & 0xFF] ^ (c >> 8)
        a[:k] += byte
        b[:k] += a[:k]
    crc ^= np.uint32(0xFFFFFFFF)
    adler = ((b % _ADLER) << 16) | (a % _ADLER)
    out[order] = ((crc.astype(np.uint64) << np.uint64(32)) | adler.astype(np.uint64)).view(np.int64)
    return out


class KeyArena:
    """The first ``depth`` ids of each pending slot as UTF-8, keyed only when taken.

    Two flat arenas, compacted together when half garbage: ``_raw`` (the ids' bytes back to
    back) and ``_sizes`` (each id's byte count); per-slot columns (``array``: a plain index is
    several times cheaper from Python than a numpy scalar's, and numpy reads them without a
    copy) give each slot's first id, id count and first byte."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._raw = bytearray()
        self._sizes = array("q")
        self._garbage = 0
        self._start = array("q")
        self._length = array("q")
        self._byte = array("q")

    def __len__(self) -> int:
        """Ids in the arena, garbage included (compaction keeps it under twice the live)."""
        return len(self._sizes)

    def set(self, slot: int, item_ids: Sequence[str]) -> None:
        """Give ``slot`` its first ids (replacing any it had)."""
        start, length = self._start, self._length
        if slot >= len(start):
            grow = max(slot + 1 - len(start), len(start), 1024)
            start.extend([0] * grow)
            length.extend([0] * grow)
            self._byte.extend([0] * grow)
        head = item_ids[: self.depth]
        raw = "".join(head).encode()
        sizes = list(map(len, head))
        if len(raw) != sum(sizes):  # not all ASCII: a character is not a byte
            sizes = [len(item.encode()) for item in head]
        self._garbage += length[slot]
        start[slot] = len(self._sizes)
        length[slot] = len(sizes)
        self._byte[slot] = len(self._raw)
        self._sizes.fromlist(sizes)
        self._raw += raw

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys 0-padded (n, depth), how many each slot has) of slots ``idx``."""
        idx = np.asarray(idx, np.intp)
        starts, lengths, bytes_at = self._columns()
        held = idx < len(lengths)
        safe = np.where(held, idx, 0)
        count = np.where(held, lengths[safe], 0)
        mask = np.arange(self.depth) < count[:, None]
        pos = np.where(mask, starts[safe][:, None] + np.arange(self.depth), 0)
        keys = np.zeros(mask.shape, np.int64)
        if mask.any():
            sizes = np.where(mask, np.frombuffer(self._sizes, np.int64)[pos], 0)
            first = bytes_at[safe][:, None] + np.cumsum(sizes, axis=1) - sizes
            raw = np.frombuffer(self._raw, np.uint8)
            keys[mask] = keys_of(raw, first[mask], sizes[mask])
            del raw
        return keys, count.copy()

    def _columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not len(self._start):
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        cols = (self._start, self._length, self._byte)
        return tuple(np.frombuffer(col, np.int64) for col in cols)  # type: ignore[return-value]

    def release(self, idx: np.ndarray, live: np.ndarray) -> None:
        """Forget slots ``idx``; compact when half garbage (``live``: the slots still held)."""
        idx = np.asarray(idx, np.intp)
        starts, lengths, bytes_at = self._columns()
        idx = idx[idx < len(lengths)]
        self._garbage += int(lengths[idx].sum())
        lengths[idx] = 0
        if self._garbage > max(len(self._sizes) // 2, 1 << 16):
            live = live[live < len(lengths)]
            sizes = np.frombuffer(self._sizes, np.int64)
            lens = lengths[live]
            src = _spans(starts[live], lens)
            total = np.concatenate([[0], np.cumsum(sizes)])
            nbytes = total[starts[live] + lens] - total[starts[live]]
            kept_sizes = sizes[src].tobytes()
            kept_raw = np.frombuffer(self._raw, np.uint8)[_spans(bytes_at[live], nbytes)].tobytes()
            starts[live] = _firsts(lens)
            bytes_at[live] = _firsts(nbytes)
            del starts, lengths, bytes_at, sizes
            self._sizes = array("q")
            self._sizes.frombytes(kept_sizes)
            self._raw = bytearray(kept_raw)
            self._garbage = 0


def _firsts(lens: np.ndarray) -> np.ndarray:
    """Where each of back-to-back spans of ``lens`` starts."""
    out = np.zeros(len(lens), np.int64)
    if len(lens):
        np.cumsum(lens[:-1], out=out[1:])
    return out


def _spans(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The indices of spans ``[start, start + len)``, back to back."""
    lens = np.asarray(lens, np.int64)
    return np.repeat(starts - _firsts(lens), lens) + np.arange(int(lens.sum()))
