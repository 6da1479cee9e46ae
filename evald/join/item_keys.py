"""Stable item keys: the same 64-bit key for an item id in every process.

The join matches feedback to items by Python's ``hash()``, which is salted per process; state
that outlives the process (the zero-feedback memory of judged items and reference lists, kept
in the partition's checkpoint) needs a key a restarted process computes alike. CRC-32 and
Adler-32 of the UTF-8 bytes side by side (good enough for ids not crafted to collide: a
collision only merges two items' judged state).

The arena computes them late and in bulk: a pending list keeps its first ids joined into one
string (one ``join``), and ``take`` encodes and keys a whole finalized batch with numpy
(``keys_of``: the two checksums' byte loops run across all the batch's ids at once), bit for
bit ``item_key``'s; one ``zlib`` call pair per id from Python cost more than the rest of the
signals together.
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Sequence
from typing import cast

import numpy as np

__all__ = ["KeyArena", "item_key", "item_keys", "keys_of"]

_SIGN = 1 << 63
_WRAP = 1 << 64
_ADLER = 65521
_VECTOR_BYTES = 64  # longer ids (rare): zlib per id, so the byte loop stays short
_LITTLE = sys.byteorder == "little"  # where a uint32's low byte is


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
    # int8 keys: numpy's stable sort is a radix sort for them (a merge sort for int64)
    order = np.argsort(-np.minimum(lengths, _VECTOR_BYTES + 1).astype(np.int8), kind="stable")
    order = order[lengths[order] <= _VECTOR_BYTES]
    lens, at = lengths[order], np.asarray(starts, np.int64)[order]
    crc = np.full(len(order), 0xFFFFFFFF, np.uint32)
    low = crc.view(np.uint8)[::4] if _LITTLE else crc.view(np.uint8)[3::4]  # its low byte
    a = np.ones(len(order), np.int64)
    b = np.zeros(len(order), np.int64)
    active = np.searchsorted(-lens, -np.arange(int(lens.max(initial=0))), side="left")
    for pos, k in enumerate(active.tolist()):
        byte = raw[at[:k] + pos]
        crc[:k] = _CRC[low[:k] ^ byte] ^ (crc[:k] >> 8)  # no mask, no widening of the bytes
        a[:k] += byte
        b[:k] += a[:k]
    crc ^= np.uint32(0xFFFFFFFF)
    adler = ((b % _ADLER) << 16) | (a % _ADLER)
    out[order] = ((crc.astype(np.uint64) << np.uint64(32)) | adler.astype(np.uint64)).view(np.int64)
    return out


class KeyArena:
    """The first ``depth`` ids of each pending slot, keyed only when taken.

    A slot holds its first ids joined by NUL into one str and their count (a slice and a
    ``join`` per list, nothing per id: encoding each list and counting its ids' bytes while it
    was pending cost a fifth of the signals' time). ``take`` joins a whole batch's strings,
    encodes them once, splits the bytes at the NULs (UTF-8 has a NUL byte only for U+0000)
    and keys every id with ``keys_of``. An id holding a U+0000 itself (JSON allows
    ``"\\u0000"``) would split wrongly: such a slot keeps its ids as a tuple instead, keyed one
    by one with ``item_key``. ``set`` is paid per impression, so it does only that: the
    columns grow when a slot past them comes, and an empty list takes the rare branch too."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._heads: list[str | None] = []  # None: no ids, or the slot's ids are in _odd
        self._count = array("q")  # per slot: a plain index is cheaper than a numpy scalar's
        self._odd: dict[int, tuple[str, ...]] = {}  # slots with an id holding a U+0000

    def __len__(self) -> int:
        """Ids held."""
        return int(np.frombuffer(self._count, np.int64).sum()) if self._count else 0

    def set(self, slot: int, item_ids: Sequence[str]) -> None:
        """Give ``slot`` its first ids (replacing any it had)."""
        head = item_ids[: self.depth]
        text = "\0".join(head)
        n = len(head)
        try:
            self._count[slot] = n
        except IndexError:
            self._grow(slot)
            self._count[slot] = n
        if text.count("\0") + 1 == n:  # no id holds a NUL (and the list has ids)
            self._heads[slot] = text
            if self._odd:  # the slot's former ids may have held one
                self._odd.pop(slot, None)
        else:
            self._heads[slot] = None
            if n:
                self._odd[slot] = tuple(head)
            else:
                self._odd.pop(slot, None)

    def _grow(self, slot: int) -> None:
        grow = max(slot + 1 - len(self._heads), len(self._heads), 1024)
        self._heads.extend([None] * grow)
        self._count.extend([0] * grow)

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys 0-padded (n, depth), how many each slot has) of slots ``idx``."""
        idx = np.asarray(idx, np.intp)
        count = np.zeros(len(idx), np.int64)
        held = idx < len(self._count)
        count[held] = np.frombuffer(self._count, np.int64)[idx[held]] if self._count else 0
        keys = np.zeros((len(idx), self.depth), np.int64)
        heads = self._heads
        rows = np.flatnonzero(count)
        texts = list(map(heads.__getitem__, idx[rows].tolist()))
        cells = np.arange(self.depth) < count[:, None]  # row-major: the ids' order
        if self._odd and None in texts:
            plain = [text is not None for text in texts]
            odd = self._odd
            for row in rows[np.logical_not(plain)].tolist():
                keys[row, : count[row]] = [item_key(item) for item in odd[int(idx[row])]]
                cells[row] = False
            texts = [text for text in texts if text is not None]
        if texts:
            raw = np.frombuffer("\0".join(cast("list[str]", texts)).encode(), np.uint8)
            ends = np.append(np.flatnonzero(raw == 0), len(raw))
            starts = np.concatenate([[0], ends[:-1] + 1])
            keys[cells] = keys_of(raw, starts, ends - starts)
        return keys, count

    def release(self, idx: np.ndarray) -> None:
        """Forget slots ``idx``."""
        idx = np.asarray(idx, np.intp)
        idx = idx[idx < len(self._count)]
        np.frombuffer(self._count, np.int64)[idx] = 0
        heads, odd = self._heads, self._odd
        slots = idx.tolist()
        for slot in slots:
            heads[slot] = None
        if odd:
            for slot in slots:
                odd.pop(slot, None)
