"""ZeroFeedback: the engine's zero-feedback stage, between scoring and the window sums.

For each finalized list (``score``): whether it is empty, the share of its first ``depth``
items never judged for its query, and its RBO against the reference arm's newest list for the
same query (evald/zerofeedback/memory.py), all before any feedback is needed. The values go
into the result record (``"zero_feedback"``) and the window sums (``ZeroWindows``, held by the
aggregates so they are snapshotted with them); the per-partition memory goes into the
partition's checkpoint (``PartitionState.zero_feedback``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from evald.config import ZeroFeedbackConfig
from evald.join import Joined
from evald.zerofeedback.memory import QUANTITIES, ListMemory, Scored

__all__ = ["ZeroFeedback", "result_field", "result_fields"]

log = logging.getLogger(__name__)


def result_field(row: list[float]) -> dict[str, float | None]:
    """A list's values as its result's ``"zero_feedback"`` (null: not defined for it)."""
    return {name: (None if math.isnan(v) else v) for name, v in zip(QUANTITIES, row, strict=True)}


def result_fields(values: np.ndarray) -> list[dict[str, float | None]]:
    """``result_field`` of each row of ``values`` (n, 3): one dict display per row, NaN (the
    one value unequal to itself) made None, twice as fast as a dict of a zip per row."""
    empty, unjudged, rbo = QUANTITIES
    return [
        {empty: e, unjudged: None if u != u else u, rbo: None if r != r else r}
        for e, u, r in values.tolist()
    ]


def parse_field(field: Any) -> list[float]:
    """The values of a result's ``"zero_feedback"`` (missing: NaN); ValueError otherwise."""
    if not isinstance(field, dict):
        raise ValueError("zero_feedback must be an object")
    out = []
    for name in QUANTITIES:
        value = field.get(name)
        if value is None:
            out.append(math.nan)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(float(value))
        else:
            raise ValueError(f"zero_feedback.{name} must be a number or null")
    return out


class ZeroFeedback:
    """One ``ListMemory`` per partition; ``depth`` 0: off (``enabled`` False)."""

    def __init__(self, config: ZeroFeedbackConfig, retention: int) -> None:
        self.config = config
        self.retention = retention
        self.enabled = config.depth > 0
        self._memories: dict[int, ListMemory] = {}

    def _memory(self, partition: int) -> ListMemory:
        memory = self._memories.get(partition)
        if memory is None:
            cfg = self.config
            memory = self._memories[partition] = ListMemory(
                p=cfg.p,
                arm_label=cfg.arm_label,
                reference=cfg.reference,
                retention=self.retention,
                judged_capacity=cfg.judged_capacity,
                reference_capacity=cfg.reference_capacity,
            )
        return memory

    def score(self, partition: int, joined: Joined) -> np.ndarray:
        """(n, 3) values of the batch's lists, in the batch's order."""
        keys, counts = joined.item_keys, joined.key_lengths
        assert keys is not None and counts is not None, "the join keeps no item keys"
        depth = keys.shape[1]
        grades = joined.grades
        judged = np.zeros((len(joined.request_ids), depth), bool)
        cut = min(depth, grades.shape[1])
        judged[:, :cut] = grades[:, :cut] != 0
        arm = self.config.arm_label
        lists = Scored(
            joined.queries,
            [labels.get(arm) for labels in joined.labels],
            np.asarray(joined.ts, np.int64),
            np.asarray(joined.lengths, np.int64),
            keys,
            np.asarray(counts, np.int64),
            judged,
        )
        return self._memory(partition).score(lists)

    def state(self, partition: int) -> dict[str, Any] | None:
        """The partition's memory for its checkpoint; None when off."""
        if not self.enabled:
            return None
        return self._memory(partition).state()

    def load(self, partition: int, doc: dict[str, Any] | None) -> None:
        """Put back a :meth:`state` (None: a checkpoint without one, an empty memory); its
        references dropped, with a warning, when they are of another arm than the settings'
        (``ListMemory.load``)."""
        if not self.enabled:
            return
        self._memories.pop(partition, None)
        if doc is None:
            return
        dropped = self._memory(partition).load(doc)
        if dropped is not None:
            log.warning(
                "partition %d: its checkpointed zero-feedback references are of another arm "
                "(zero_feedback.arm_label %r -> %r, zero_feedback.reference %r -> %r): dropped, "
                "the RBO of each query waits for the new reference arm's next list",
                partition,
                dropped[0],
                self.config.arm_label,
                dropped[1],
                self.config.reference,
            )

    def drop(self, partition: int) -> None:
        self._memories.pop(partition, None)
