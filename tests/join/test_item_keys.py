"""Stable item keys and the arena that keeps a pending list's first ones."""

from __future__ import annotations

import subprocess
import sys
import zlib

import numpy as np

from evald.join.item_keys import KeyArena, item_key, keys_of


def test_a_key_is_the_same_in_another_process() -> None:
    """Unlike hash(), which is salted per process: what makes a checkpoint of them usable."""
    code = "from evald.join.item_keys import item_key; print(item_key('sku-123'), hash('sku-123'))"
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    keys = [r.stdout.split()[0] for r in runs]
    assert keys[0] == keys[1] == str(item_key("sku-123"))
    raw = b"sku-123"
    assert item_key("sku-123") == (zlib.crc32(raw) << 32) | zlib.adler32(raw)  # below 2**63


def test_the_arena_hands_out_each_slot_s_first_keys_through_releases() -> None:
    arena = KeyArena(3)
    rng = np.random.default_rng(1)
    live: dict[int, list[str]] = {}
    for _ in range(12):  # each round frees two thirds of the slots and fills them again
        freed = [slot for slot in live if rng.random() < 0.67]
        for slot in freed:
            del live[slot]
        arena.release(np.asarray(freed, np.intp))
        for slot in range(5_000):
            if slot not in live:
                items = [f"i{x}" for x in rng.integers(0, 50, size=int(rng.integers(0, 6)))]
                arena.set(slot, items)
                live[slot] = items
    assert len(arena) == sum(min(len(items), 3) for items in live.values())  # released ones gone
    slots = np.asarray(sorted(live))
    keys, counts = arena.take(slots)
    for row, count, slot in zip(keys.tolist(), counts.tolist(), slots.tolist(), strict=True):
        want = [item_key(i) for i in live[slot][:3]]
        assert count == len(want) and row[:count] == want and not any(row[count:])


def test_the_batch_keys_are_item_key_s_bits_for_any_id() -> None:
    """Empty, multi-byte, exactly the vector limit and past it (zlib's path), and ids whose
    CRC sets the top bit (a negative int64)."""
    ids = ["", "a", "sku-123", "é漢字🙂x", "x" * 64, "y" * 65, "z" * 300]
    ids += [f"item-{i}" for i in range(2_000)]
    raw = b"".join(i.encode() for i in ids)
    sizes = np.asarray([len(i.encode()) for i in ids])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    got = keys_of(np.frombuffer(raw, np.uint8), starts, sizes).tolist()
    assert got == [item_key(i) for i in ids]
    assert min(got) < 0 < max(got)


def test_the_arena_keeps_non_ascii_ids_apart() -> None:
    """A character is not a byte: the ids' byte counts, not their lengths, split the bytes."""
    arena = KeyArena(4)
    arena.set(0, ["é", "漢字", "x", "🙂"])
    arena.set(1, ["ab", "c"])
    keys, counts = arena.take(np.asarray([0, 1, 7]))
    assert counts.tolist() == [4, 2, 0]
    assert keys[0].tolist() == [item_key(i) for i in ["é", "漢字", "x", "🙂"]]
    assert keys[1].tolist() == [item_key("ab"), item_key("c"), 0, 0]


def test_an_id_holding_a_nul_is_keyed_whole() -> None:
    """The arena splits a batch's ids at NUL bytes; an id that holds a U+0000 (JSON allows
    it) must still get its own key, and the slots around it theirs."""
    arena = KeyArena(3)
    arena.set(0, ["a\x00b", "c", "d", "e"])
    arena.set(1, ["x", "\x00", ""])
    arena.set(2, ["", "y"])
    keys, counts = arena.take(np.asarray([2, 0, 1]))
    assert counts.tolist() == [2, 3, 3]
    assert keys[0].tolist() == [item_key(""), item_key("y"), 0]
    assert keys[1].tolist() == [item_key(i) for i in ["a\x00b", "c", "d"]]
    assert keys[2].tolist() == [item_key(i) for i in ["x", "\x00", ""]]
    arena.set(0, ["p", "q"])  # a slot reused after holding such an id: plain again
    arena.release(np.asarray([1]))
    keys, counts = arena.take(np.asarray([0, 1]))
    assert counts.tolist() == [2, 0] and keys[0].tolist() == [item_key("p"), item_key("q"), 0]
    assert len(arena) == 4  # slots 0 and 2
