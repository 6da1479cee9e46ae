"""The request-id table: open addressing with tombstones and vectorised rebuilds."""

from __future__ import annotations

import numpy as np

from evald.join.rid_table import RidTable


def test_request_id_table_survives_tombstones_and_rebuilds():
    table = RidTable(capacity=8)
    rng = np.random.default_rng(11)
    live: dict[int, int] = {}
    for step in range(20_000):
        if live and rng.random() < 0.45:
            key = list(live)[int(rng.integers(len(live)))]
            table.remove(key)
            del live[key]
        else:
            key = hash(f"r{step}")
            assert table.insert(key, step) == -1
            assert table.insert(key, -5) == step  # present: reported, not replaced
            live[key] = step
        assert len(table) == len(live)
    assert all(table.get(k) == v for k, v in live.items())
    assert table.get(hash("never")) == -1
    assert any(k < 0 for k in live) and any(k > 0 for k in live)


def test_the_reserved_keys_are_ordinary_keys_to_callers() -> None:
    """Hashes 0 and 1 are stored as 2 and 3 (so they alias those two, like any collision)."""
    table = RidTable(capacity=8)
    for key in (0, 1, 5):
        assert table.insert(key, key + 10) == -1
    assert [table.get(k) for k in (0, 1, 5)] == [10, 11, 15]
    table.remove(0)
    assert table.get(0) == -1 and table.get(1) == 11 and len(table) == 2
