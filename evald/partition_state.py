"""The engine's state of one partition as one value: what a restart needs from the engine to
resume the partition exactly where a commit left it.

``Engine.state(partition, fed)`` takes it at a commit, ``Engine.resume(partition, state,
consumed)`` puts it back after a restart (the bytewax way: a snapshot out, a build from it), and
the daemon's checkpoint (daemon/main/checkpoint.py) carries it next to what only the daemon knows
(the offsets it consumed, its result ranges, its snapshot records). A later piece of
per-partition state that must survive a kill -9 is a field here, written by its component's
snapshot in ``Engine.state`` and read back in ``Engine.resume``: nothing else changes.

The JSON fields are those of checkpoint version 2, encoded exactly as before this value
existed (tests/daemon/test_checkpoint_fixture.py holds records written then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evald.join.clock import EventTimes

__all__ = ["MAX_HELD_RUNS", "PartitionState", "Runs", "from_runs", "to_runs"]

#: runs of held feedback (``held_feedback``) a state lists at most, about 100 KB of its
#: checkpoint record: past them, the feedback held at higher offsets has its outcome left
#: uncounted by a restore (undercounted, never twice), and the record stays far below a
#: topic's 1 MiB limit
MAX_HELD_RUNS = 4096

#: offsets as runs ``[start, end)``
Runs = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class PartitionState:
    """The engine's state of one partition at a commit.

    ``watermark``: the finalization watermark (ms). ``committed``: per kind, the smallest input
    offset a restart must read again (the engine's low offset, never above what was fed).
    ``event_times``: the confirmed event time and the block of event times being filled, so a
    restore moves the watermark exactly as an uninterrupted run would; None in a checkpoint
    written before it existed. Encoded as ``event_times: [confirmed, null]`` (what older
    readers expect; the second place held a candidate time before the watermark confirmed
    blocks, and is dropped when read) and the optional ``event_block`` and ``event_ahead``.
    ``evicted``: runs of impression offsets at or above ``committed`` a replay must skip (the
    pending cap closed them early, or they repeated a pending request id);
    ``evicted_feedback``: the same on the feedback topic (lists of several records).
    ``held_feedback``: runs of the feedback offsets held, undecided: a restore counts their
    outcome when they expire or are claimed, and no other re-fed one's.
    ``statistics``: the open comparison shares and final mark (``PartitionShares.state``), or
    in a checkpoint ``{"records": <SnapshotRef JSON>}`` naming records holding them; None
    without comparisons.
    ``zero_feedback``: the judged pairs and reference lists the next lists are scored against
    (``ListMemory.state``, evald/zerofeedback/memory.py); None with the signals off.
    ``counters``: every engine counter of the partition not 0, in ``Stats.counted``'s flat
    form, summed over all its lives up to this commit (records first fed, outcomes decided):
    counted once through any restart, as the commit that holds it is written once. Empty in a
    checkpoint written before it existed (the sums then start at that restore).
    ``click_model``: the partition's click model (``StreamClicks.state``: ``{"snapshot":
    <base64>}``), or in a checkpoint ``{"records": <SnapshotRef JSON>}`` naming records
    holding the snapshot's bytes; None without ``click_model`` (or before its first list).
    """

    watermark: int | None
    committed: dict[str, int]
    event_times: EventTimes | None = None
    evicted: Runs = ()
    evicted_feedback: Runs = ()
    held_feedback: Runs = ()
    statistics: dict[str, Any] | None = None
    zero_feedback: dict[str, Any] | None = None
    counters: dict[str, int] = field(default_factory=dict)
    click_model: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The state's fields of a checkpoint record (optional ones only when set)."""
        doc: dict[str, Any] = {"watermark": self.watermark, "committed": self.committed}
        times = self.event_times
        if times is not None:
            doc["event_times"] = [times.confirmed, None]
            if times.block:
                doc["event_block"] = list(times.block)
            if times.ahead:
                doc["event_ahead"] = list(times.ahead)
        if self.evicted:
            doc["evicted"] = [list(run) for run in self.evicted]
        if self.evicted_feedback:
            doc["evicted_feedback"] = [list(run) for run in self.evicted_feedback]
        if self.held_feedback:
            doc["held_feedback"] = [list(run) for run in self.held_feedback]
        if self.statistics is not None:
            doc["statistics"] = self.statistics
        if self.zero_feedback is not None:
            doc["zero_feedback"] = self.zero_feedback
        if self.counters:
            doc["counters"] = self.counters
        if self.click_model is not None:
            doc["click_model"] = self.click_model
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PartitionState:
        """The state of a checkpoint record's fields; KeyError, TypeError or ValueError on a
        malformed one."""
        return cls(
            watermark=None if doc["watermark"] is None else int(doc["watermark"]),
            committed={str(k): int(v) for k, v in doc["committed"].items()},
            event_times=_event_times(doc),
            evicted=_runs(doc.get("evicted")),
            evicted_feedback=_runs(doc.get("evicted_feedback")),
            held_feedback=_runs(doc.get("held_feedback")),
            statistics=doc.get("statistics"),
            zero_feedback=doc.get("zero_feedback"),
            counters={str(k): int(v) for k, v in (doc.get("counters") or {}).items()},
            click_model=doc.get("click_model"),
        )


def _runs(value: Any) -> Runs:
    return tuple((int(a), int(b)) for a, b in value or ())


def _event_times(doc: dict[str, Any]) -> EventTimes | None:
    """``event_times`` and its block lists; a checkpoint written before blocks has only
    ``[confirmed, candidate]``: the candidate, one unconfirmed time, is dropped."""
    value = doc.get("event_times")
    if value is None:
        return None
    confirmed, _candidate = value
    return EventTimes(
        None if confirmed is None else int(confirmed),
        tuple(int(ts) for ts in doc.get("event_block") or ()),
        tuple(int(ts) for ts in doc.get("event_ahead") or ()),
    )


def to_runs(offsets: list[int]) -> Runs:
    """Sorted distinct offsets as runs ``[start, end)``: the cap evicts the oldest impressions,
    mostly consecutive offsets, so a few runs carry thousands of them."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], offset + 1)
        else:
            runs.append((offset, offset + 1))
    return tuple(runs)


def from_runs(runs: Runs) -> list[int]:
    """The offsets of :func:`to_runs` runs."""
    return [offset for start, end in runs for offset in range(start, end)]
