"""The smallest ``max.message.bytes`` the records evald writes need, topic by topic.

evald keeps its producer's batches under every output topic's limit (topics.OutputLimits), but
a single record larger than a topic accepts is refused whatever the batch: the transaction
fails, and the next session writes the same record into the same refusal, forever. Where
evald's own constants bound a topic's largest record, a limit below it is refused at start
(exit 2) and by `evald check-config --connect`, naming what to change:

- the checkpoint topic gets snapshot and statistics chunks of ``snapshots.CHUNK_BYTES`` each
  (no setting shrinks them);
- the dead-letter topic gets letters cut to fit its limit, but never below the headers-only
  letter (a detail of at most 4 KiB, a key of at most 1 KiB, the source coordinates);
- the statistics topic gets share records of up to ``shares.CELLS_PER_RECORD`` numbers
  (interleaving's ``NUMBERS_PER_RECORD`` is the same), each at its widest as JSON. Their
  labels add up to ``shares.LABEL_BYTES_PER_RECORD`` but one segment's are never cut (the input
  limits bound them), nor is one segment of many measures and bootstrap replicates: that part
  has no bound a constant gives, so the need is a floor.

Results are dead-lettered when too large (dead_letters.DeadLetters.divert_result);
repartitioned inputs have no bound a constant gives (docs/daemon.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evald.daemon.dead_letters import SLACK_BYTES, build_letter, record_size
from evald.daemon.main.snapshots import CHUNK_BYTES
from evald.daemon.settings import TopicSettings
from evald.statistics.clustered import LIST_COLUMNS
from evald.statistics.shares import CELLS_PER_RECORD, Share

__all__ = [
    "CHECKPOINT_NEED",
    "DLQ_NEED",
    "RESULT_LETTER_ROOM",
    "STATISTICS_NEED",
    "RecordNeed",
    "needs",
    "shortfall",
    "statistics_need",
]

#: the longest topic name Kafka allows, digits of the largest partition and offset
_TOPIC, _PARTITION, _OFFSET = "t" * 249, str(2**31 - 1), str(2**63 - 1)


def _checkpoint_need() -> int:
    """A full chunk under the longest key evald gives one (``<partition>.statistics``)."""
    key = f"{_PARTITION}.statistics".encode()
    return record_size(key, b"\0" * CHUNK_BYTES, []) + SLACK_BYTES


def _dlq_need() -> int:
    """The largest headers-only letter (dead_letters.DeadLetters.send's headers at their
    longest, a reason of up to 64 characters, a key cut to 1 KiB) plus the slack."""
    headers = [
        ("evald-reason", b"r" * 64),
        ("evald-detail", b"d" * 4096),
        ("evald-source-topic", _TOPIC.encode()),
        ("evald-source-partition", _PARTITION.encode()),
        ("evald-source-offset", _OFFSET.encode()),
        ("evald-kind", b"impression"),
    ]
    letter = build_letter(b"k" * 2048, b"v", headers, 0, minimal=True)
    # the original's size has 10 digits at most (a record of a few GiB), not 1
    return record_size(letter.key, letter.value, letter.headers) + 9 + SLACK_BYTES


def _statistics_need() -> int:
    """A share of ``CELLS_PER_RECORD`` sums, each the widest float JSON writes, in rows of the
    fewest columns (the most brackets), under no labels, at the widest window and partition."""
    widest = -2.2250738585072014e-308
    rows = np.full((CELLS_PER_RECORD // LIST_COLUMNS, LIST_COLUMNS), widest)
    share = Share(-(2**62), 2**62, 2**31 - 1, (((), rows),), chunk=2**31 - 1)
    return record_size(share.key, share.encode(), []) + SLACK_BYTES


def _result_letter_room() -> int:
    """What a ``result_too_large`` letter adds to its result: the headers of
    ``dead_letters.DeadLetters.divert_result`` at their longest (topic names of 249 characters,
    sizes of 10 digits), plus the slack."""
    detail = f"a result record of {_PARTITION} bytes; {_TOPIC} accepts {_PARTITION} (m)"
    headers = [
        ("evald-reason", b"result_too_large"),
        ("evald-detail", (detail + "x" * 32).encode()),
        ("evald-source-topic", _TOPIC.encode()),
        ("evald-source-partition", _PARTITION.encode()),
        ("evald-kind", b"result"),
    ]
    return record_size(None, b"", headers) - record_size(None, b"", []) + SLACK_BYTES


#: the smallest max.message.bytes of the checkpoint topic
CHECKPOINT_NEED = _checkpoint_need()
#: ... and of the dead-letter topic
DLQ_NEED = _dlq_need()
#: what the dead-letter topic needs above the results topic's limit to take a result whole
RESULT_LETTER_ROOM = _result_letter_room()
#: ... and of the statistics topic, labels left out
STATISTICS_NEED = _statistics_need()


@dataclass(frozen=True)
class RecordNeed:
    """What one topic's ``max.message.bytes`` must be at least, and why."""

    setting: str
    topic: str
    need: int
    records: str


def needs(topics: TopicSettings) -> list[RecordNeed]:
    """The topics whose largest record evald's constants bound, with that bound."""
    return [
        RecordNeed(
            "topics.checkpoints",
            topics.checkpoint_topic,
            CHECKPOINT_NEED,
            f"snapshot and statistics chunks of {CHUNK_BYTES // 1024} KiB",
        ),
        RecordNeed(
            "topics.dlq",
            topics.dlq,
            DLQ_NEED,
            "dead letters, cut to fit but never below their headers",
        ),
    ]


def statistics_need(topic: str) -> RecordNeed:
    """The statistics topic's need (``<checkpoints>.statistics``, with comparisons or
    interleaving on)."""
    return RecordNeed(
        "statistics topic",
        topic,
        STATISTICS_NEED,
        f"comparison and credit shares of up to {CELLS_PER_RECORD} numbers, plus their labels",
    )


def shortfall(need: RecordNeed, limit: int) -> str | None:
    """What is wrong when ``limit`` (the topic's max.message.bytes) is below the need, with the
    command that fixes it; None when it is not. The caller names the setting and topic."""
    if limit >= need.need:
        return None
    return (
        f"accepts records of at most {limit} bytes (max.message.bytes) but evald writes "
        f"records of up to {need.need} bytes to it ({need.records}; no evald setting shrinks "
        "them): the broker would refuse the transaction holding one, in every session. Raise "
        f"the topic's limit: kafka-configs.sh --alter --entity-type topics --entity-name "
        f"{need.topic} --add-config max.message.bytes={need.need} (or more; Kafka's default "
        "is 1048588)"
    )
