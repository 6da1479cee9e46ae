"""OffsetLog: the smallest live offset, against a scan of the live entries."""

from __future__ import annotations

import numpy as np

from evald.join.offset_log import OffsetLog


def test_low_is_the_smallest_live_offset_in_or_out_of_order() -> None:
    rng = np.random.default_rng(4)
    log = OffsetLog()
    stored = np.zeros(64, np.int64)  # ref -> offset + 1 while live
    offset = 100  # pushes reach back at most 49: every offset stays >= 0
    for _ in range(20_000):
        ref = int(rng.integers(0, 64))
        if rng.random() < 0.5:
            stored[ref] = 0  # freed
        else:
            offset += int(rng.integers(1, 4))
            pushed = offset if rng.random() < 0.9 else offset - int(rng.integers(1, 50))
            stored[ref] = pushed + 1  # reused: any older entry of ref is dead
            if rng.random() < 0.5:
                log.push(pushed, ref)
            else:
                log.push_many([pushed], [ref])
        live = stored[stored > 0] - 1
        assert log.low(stored) == (int(live.min()) if len(live) else None)
