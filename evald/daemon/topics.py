"""Topic layout checks: the input topics must be co-partitioned, outputs must line up with them.

Why: the join for a request happens in the instance that owns partition *p* of both input
topics, which only works if both topics have the same partition count and producers key by
request_id. Results and checkpoints are written to the same partition number *p*, so they need
at least as many partitions as the inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "TopicLayoutError",
    "TopicShape",
    "check_checkpoint_ids",
    "check_layout",
    "check_unchanged",
    "missing_outputs",
]


class TopicLayoutError(RuntimeError):
    """The topics cannot be used as configured; the message says which and how to fix it."""


def check_layout(
    counts: Mapping[str, int | None],
    *,
    impressions: str,
    feedback: str,
    outputs: tuple[str, ...] = (),
) -> int:
    """Return the shared partition count of the input topics, or raise TopicLayoutError.

    ``counts`` maps topic name -> partition count (None: the topic does not exist). Output
    topics that exist must have at least that many partitions.
    """
    imp, fb = counts.get(impressions), counts.get(feedback)
    missing = [name for name, count in ((impressions, imp), (feedback, fb)) if not count]
    if missing:
        raise TopicLayoutError(
            f"input topic(s) {', '.join(missing)} do not exist; create them with the same "
            "partition count and have producers key both by request_id"
        )
    assert imp is not None and fb is not None
    if imp != fb:
        raise TopicLayoutError(
            f"topics are not co-partitioned: {impressions} has {imp} partitions, {feedback} has "
            f"{fb}; an impression and its feedback must land on the same partition number, so "
            "both topics need the same partition count (and producers must key by request_id)"
        )
    for name in outputs:
        count = counts.get(name)
        if count is not None and count < imp:
            raise TopicLayoutError(
                f"output topic {name} has {count} partitions but the inputs have {imp}; results "
                f"and checkpoints of input partition p go to partition p, so {name} needs at "
                f"least {imp}"
            )
    return imp


def missing_outputs(counts: Mapping[str, int | None], outputs: tuple[str, ...]) -> list[str]:
    """The output topics that do not exist yet (evald creates them)."""
    return [name for name in outputs if counts.get(name) is None]


@dataclass(frozen=True)
class TopicShape:
    """What identifies an input topic to a running daemon: its id (None when the broker does
    not report one) and its partition count."""

    topic_id: str | None
    partitions: int


def check_unchanged(before: Mapping[str, TopicShape], now: Mapping[str, TopicShape | None]) -> None:
    """Raise TopicLayoutError when an input topic seen ``before`` is gone, was recreated (other
    topic id) or has another partition count ``now``.

    Why each is fatal: committed offsets and checkpoints name a topic by name and partition
    number; a recreated topic restarts its offsets, and a changed partition count moves keys to
    other partitions, so an impression and its feedback no longer meet in one instance.
    """
    for name, old in before.items():
        new = now.get(name)
        if new is None:
            raise TopicLayoutError(
                f"input topic {name} no longer exists (deleted, or the broker lost its data); "
                "evald never creates input topics. Recreate it with "
                f"{old.partitions} partitions, then start evald with a new daemon.group_id and "
                "new results/checkpoint topics (the committed offsets and checkpoints refer to "
                "the old topic)"
            )
        if new.partitions != old.partitions:
            raise TopicLayoutError(
                f"input topic {name} changed from {old.partitions} to {new.partitions} "
                "partitions while evald ran; keys now map to other partition numbers, so "
                "impressions and their feedback no longer meet (and checkpoints no longer line "
                "up). Give both input topics the same partition count, then start evald with a "
                "new daemon.group_id and new results/checkpoint topics"
            )
        if old.topic_id and new.topic_id and old.topic_id != new.topic_id:
            raise TopicLayoutError(
                f"input topic {name} was deleted and recreated (topic id {old.topic_id} -> "
                f"{new.topic_id}); the committed offsets and checkpoints refer to the old topic. "
                "To consume the new one, start evald with a new daemon.group_id and new "
                "results/checkpoint topics (or delete the group and its checkpoint topic)"
            )


def check_checkpoint_ids(
    saved: Mapping[str, str], now: Mapping[str, TopicShape], partition: int
) -> None:
    """Raise TopicLayoutError when an input topic's id differs from the one partition
    ``partition``'s checkpoint was written against: the topic was recreated while no evald ran
    (``check_unchanged`` sees only changes during this process's life)."""
    for name, shape in now.items():
        old = saved.get(name)
        if old and shape.topic_id and old != shape.topic_id:
            raise TopicLayoutError(
                f"input topic {name} was deleted and recreated since the checkpoint of "
                f"partition {partition} was written (topic id {old} -> {shape.topic_id}); the "
                "committed offsets and checkpoints refer to the old topic. To consume the new "
                "one, start evald with a new daemon.group_id and new results/checkpoint topics "
                "(or delete the group and its checkpoint topic)"
            )
