"""Work-arounds for kafka-python 3.0.x behaviour the daemon depends on.

Why this exists: in kafka-python 3.0.12, records parked for a paused partition are handed back
after ``resume()`` only when the fetcher's in-line slot is ``None``; once a partition's records
have been drained, the slot keeps the drained (falsy) object instead, so a resumed partition
stays parked for good and is never fetched again (reproduced against tansu: pause, poll,
resume, and the partition's position never moves). The daemon pauses partitions for
backpressure, so it clears a drained slot before each poll. Remove once fixed upstream.
"""

from __future__ import annotations

from typing import Any

__all__ = ["unpark_resumed"]


def unpark_resumed(consumer: Any) -> bool:
    """Let records parked for resumed partitions flow again; True if a slot was cleared."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or not getattr(fetcher, "_paused_partition_records", None):
        return False
    current = getattr(fetcher, "_next_partition_records", None)
    if current is not None and not current:
        # drained: holds no records, only blocks the hand-back of parked ones
        fetcher._next_partition_records = None
        return True
    return False
