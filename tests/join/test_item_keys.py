"""Stable item keys and the arena that keeps a pending list's first ones."""

from __future__ import annotations

import subprocess
import sys
import zlib

import numpy as np

from evald.join.item_keys import KeyArena, item_key


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


def test_the_arena_hands_out_each_slot_s_first_keys_through_compactions() -> None:
    arena = KeyArena(3)
    rng = np.random.default_rng(1)
    live: dict[int, list[str]] = {}
    for _ in range(12):  # each round frees two thirds of the slots and fills them again
        freed = [slot for slot in live if rng.random() < 0.67]
        for slot in freed:
            del live[slot]
        arena.release(np.asarray(freed, np.intp), np.asarray(sorted(live), np.intp))
        for slot in range(5_000):
            if slot not in live:
                items = [f"i{x}" for x in rng.integers(0, 50, size=int(rng.integers(0, 6)))]
                arena.set(slot, items)
                live[slot] = items
    assert len(arena) < 2 * 3 * 5_000  # compacted (not the 12 rounds' whole history)
    slots = np.asarray(sorted(live))
    keys, counts = arena.take(slots)
    for row, count, slot in zip(keys.tolist(), counts.tolist(), slots.tolist(), strict=True):
        want = [item_key(i) for i in live[slot][:3]]
        assert count == len(want) and row[:count] == want and not any(row[count:])
