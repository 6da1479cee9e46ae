"""What a session did since its last commit, per partition: the results sent into the open
transaction and which partitions were fed. One :class:`Interval` per transaction, created when
the previous one commits (quix-streams' ``Checkpoint``); its owner (transaction.py) is the
only writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evald.daemon.main.checkpoint import SnapshotRef

__all__ = ["Interval", "Sent"]


@dataclass
class Sent:
    """The results of one partition in the open transaction: the futures of the first and the
    last (offsets grow within a partition: the idempotent producer keeps their order), how
    many, and the newest event time among them."""

    first: Any
    last: Any
    count: int = 1
    max_ts: int | None = None


class Interval:
    """The results sent and the partitions fed since the last commit."""

    def __init__(self) -> None:
        self._sent: dict[int, Sent] = {}
        self._fed: set[int] = set()
        #: per partition, the click-model snapshot (its checkpoint base64) whose records this
        #: interval's checkpoint names, and them (``Transaction._place_click_model``)
        self.click_records: dict[int, tuple[str, SnapshotRef]] = {}

    def result(self, partition: int, future: Any, ts: int) -> None:
        """One result of ``partition`` sent (its future)."""
        sent = self._sent.get(partition)
        if sent is None:
            self._sent[partition] = Sent(future, future, 1, ts)
        else:
            sent.last = future
            sent.count += 1
            if sent.max_ts is None or ts > sent.max_ts:
                sent.max_ts = ts
        self._fed.add(partition)

    def fed(self, partition: int) -> None:
        """Records of ``partition`` were fed to the engine."""
        self._fed.add(partition)

    def sent(self, partition: int) -> Sent | None:
        """The results of ``partition`` sent in this interval (None: none)."""
        return self._sent.get(partition)

    def changed(self, partition: int) -> bool:
        """Whether ``partition`` was fed or had a result sent in this interval."""
        return partition in self._fed

    def forget(self, partition: int) -> None:
        """``partition`` is no longer owned."""
        self._sent.pop(partition, None)
        self._fed.discard(partition)
