"""What the summaries' restore tests share (test_windows.py: the queries', test_labels.py:
the label pairs'): a summary store read as exact arrays, and one life snapshotted mid-stream
against a restore from that snapshot plus the results after it."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from evald.drilldown.windows import QueryWindows
from evald.engine import Engine, Result

#: (window width, window start, segment) -> (items, the table's bytes, the scalars)
State = dict[tuple[int, int, int], tuple[list[str], bytes, list[int]]]


def summaries(windows: QueryWindows | None) -> State:
    """Every window's summaries, merged per segment, as exact arrays."""
    assert windows is not None
    out = {}
    for width, start in windows.windows():
        for segment, summary in windows.merged(width, start).items():
            keys, table, scalars = summary.to_arrays()
            out[(width, start, segment)] = (keys, table.tobytes(), scalars)
    return out


def restored_at(
    make: Callable[[], tuple[Engine, list[Result]]],
    events: Sequence[tuple[str, int, bytes]],
    cut: int,
) -> tuple[Engine, Engine, bytes, list[dict[str, Any]]]:
    """(the engine fed every event, ticked after each, then drained; an engine that loaded
    its snapshot taken at event ``cut`` and absorbed the results after it, as JSON; that
    snapshot; those results)."""
    reference, results = make()
    snap, before = b"", 0
    for position, (kind, offset, raw) in enumerate(events):
        reference.feed(raw, kind=kind, offset=offset)
        reference.tick()
        if position == cut:
            snap, before = reference.snapshot(0), len(results)
    reference.drain()
    restored, _ = make()
    restored.load_snapshot(0, snap)
    later = [json.loads(json.dumps(r.to_json())) for r in results[before:]]
    assert restored.absorb_results(later, 0) == len(later)
    return reference, restored, snap, later
