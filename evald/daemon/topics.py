"""Topic layout checks: the input topics must be co-partitioned, outputs must line up with them.

Why: the join for a request happens in the instance that owns partition *p* of both input
topics, which only works if both topics have the same partition count and producers key by
request_id. Results and checkpoints are written to the same partition number *p*, so they need
at least as many partitions as the inputs.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["TopicLayoutError", "check_layout", "missing_outputs"]


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
