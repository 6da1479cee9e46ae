"""When to snapshot a partition's window aggregates, and how the snapshot fits in records.

A restore reads the snapshot named by the checkpoint plus the results written after it
(docs/design.md, "Restart cost"). A snapshot is written in a commit when the results since the
last one would cost more to re-read than the snapshot itself (at least
``MIN_RESULTS_BETWEEN`` of them), or when the last one is ``MAX_AGE_MS`` old, so it never ages
out of the checkpoint topic while its checkpoint is still in use. The restore then reads at
most about twice the snapshot plus ``MIN_RESULTS_BETWEEN`` results, whatever the uptime.
"""

from __future__ import annotations

import zlib

from evald.daemon.main.checkpoint import ResultRange, SnapshotRef

__all__ = [
    "CHUNK_BYTES",
    "INLINE_STATISTICS_BYTES",
    "MAX_AGE_MS",
    "MIN_RESULTS_BETWEEN",
    "RESULT_BYTES",
    "chunks",
    "due",
    "results_in",
    "whole",
]

#: results re-read at most between snapshots, when the snapshot is small
MIN_RESULTS_BETWEEN = 2_000
#: a result record's size, roughly (the ``--results`` JSON line), to compare reading costs
RESULT_BYTES = 200
#: a snapshot older than this (wall time) is written again; the checkpoint topic's retention
#: must be longer than this plus the longest time evald may be stopped
MAX_AGE_MS = 3_600_000
#: largest record of a snapshot: well under Kafka's default max.message.bytes (1 MiB)
CHUNK_BYTES = 256 * 1024
#: a partition's open comparison shares larger than this (JSON) leave the checkpoint record
#: for records of their own, named by the checkpoint like a snapshot: a checkpoint stays small
#: whatever the number of segments
INLINE_STATISTICS_BYTES = 64 * 1024


def results_in(ranges: tuple[ResultRange, ...]) -> int:
    """Result offsets the ranges span (transaction markers included: an upper bound)."""
    return sum(r.end - r.start for r in ranges)


def due(ranges: tuple[ResultRange, ...], last: SnapshotRef | None, now_ms: int) -> bool:
    """Whether the commit whose checkpoint would list ``ranges`` (results after ``last``)
    should write a new snapshot instead."""
    since = results_in(ranges)
    if last is None:
        return since >= MIN_RESULTS_BETWEEN
    if now_ms - last.written_ms >= MAX_AGE_MS:
        return True
    return since >= max(MIN_RESULTS_BETWEEN, last.size // RESULT_BYTES)


def chunks(raw: bytes) -> list[bytes]:
    """``raw`` cut into record values of at most ``CHUNK_BYTES`` (at least one)."""
    return [raw[i : i + CHUNK_BYTES] for i in range(0, max(len(raw), 1), CHUNK_BYTES)]


def whole(parts: list[bytes], ref: SnapshotRef) -> bytes:
    """The snapshot from its chunk values; ValueError unless size and CRC-32 match ``ref``."""
    raw = b"".join(parts)
    if len(raw) != ref.size or zlib.crc32(raw) != ref.crc32:
        raise ValueError(
            f"snapshot at {list(ref.offsets)} has {len(raw)} bytes (CRC {zlib.crc32(raw)}), "
            f"the checkpoint says {ref.size} (CRC {ref.crc32})"
        )
    return raw
