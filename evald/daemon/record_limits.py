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
  (interleaving's ``NUMBERS_PER_RECORD`` is the same), each at its widest as JSON, in the
  most segments (credit cells) the settings' measures and bootstrap replicates let a record
  hold, plus their labels: up to ``shares.LABEL_BYTES_PER_RECORD``, or one segment's at their
  widest where that is more (a heavier segment goes alone; the settings bound it:
  ``label_keys``, ``limits.max_string_length``, each character escaped as JSON's longest).
  One segment's row is never cut: the engine settings refuse one larger than a record's
  numbers (evald.config), so this is a bound of the settings (``statistics_bytes``).

Results are dead-lettered when too large (dead_letters.DeadLetters.divert_result);
repartitioned inputs have no bound a constant gives (docs/daemon.md).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np

from evald.config import EngineConfig
from evald.daemon.dead_letters import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SLACK_BYTES,
    build_letter,
    record_size,
)
from evald.daemon.main.snapshots import CHUNK_BYTES
from evald.daemon.settings import TopicSettings
from evald.interleaving.shares import COUNTS, NUMBERS_PER_RECORD, CreditShare
from evald.interleaving.sums import PairSums
from evald.segments import NONE, OTHER
from evald.statistics.clustered import row_width
from evald.statistics.shares import CELLS_PER_RECORD, LABEL_BYTES_PER_RECORD, Share

__all__ = [
    "CHECKPOINT_NEED",
    "DLQ_NEED",
    "RESULT_LETTER_ROOM",
    "RecordNeed",
    "needs",
    "shortfall",
    "statistics_bytes",
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


#: the widest float JSON writes (24 characters), and the widest a string's character is
#: (a code point past U+FFFF, escaped as two surrogates: ``\\udbff\\udfff``)
_WIDEST_FLOAT, _WIDEST_CHAR = -2.2250738585072014e-308, 12
#: the widest window start, width, partition and chunk of a share record
_START, _WIDTH, _NUMBER = -(2**62), 2**62, 2**31 - 1


def _list_bytes(items: list[int]) -> int:
    """Bytes of a JSON list (no spaces) of items of these sizes."""
    return 2 + sum(items) + max(len(items) - 1, 0)


def _share_bytes(measures: int, replicates: int) -> int:
    """A comparison share record of the most segments a record holds, each of ``measures``
    rows of widest floats, under empty labels (the labels are added by the caller)."""
    columns = row_width(replicates)
    step = max(1, CELLS_PER_RECORD // (columns * measures))
    rows = np.full((measures, columns), _WIDEST_FLOAT)
    share = Share(_START, _WIDTH, _NUMBER, (((), rows),) * step, chunk=_NUMBER)
    return record_size(share.key, share.encode(), [])


def _credit_bytes(replicates: int) -> int:
    """A credit share record of the most cells a record holds, counts of 20 digits and
    replicate sums of widest floats, under empty names (added by the caller)."""
    step = max(1, NUMBERS_PER_RECORD // (len(COUNTS) + 2 * replicates))
    reps = np.full(replicates, _WIDEST_FLOAT) if replicates else None
    count = -(2**63)  # far past any count of lists, the widest a machine integer writes
    sums = PairSums(count, count, count, count, count, count, reps, reps)
    share = CreditShare(_START, _WIDTH, _NUMBER, ((((), "", ""), sums),) * step, _NUMBER)
    return record_size(share.key, share.encode(), [])


def _label_allowance(keys: tuple[str, ...], longest: int, credit: bool) -> int:
    """What labels add to a record: up to ``LABEL_BYTES_PER_RECORD``, or one segment's (a
    credit cell's) at their widest when that is more, as it then goes alone (shares.pieces).
    A value is at most ``longest`` characters (or an overflow value), each at its widest."""
    value = max(2 + _WIDEST_CHAR * longest, len(json.dumps(OTHER)), len(json.dumps(NONE)))
    if credit:  # [[values...],"team a","team b"]: team names are input strings too
        one = _list_bytes([_list_bytes([value] * len(keys)), value, value])
    else:  # [["key","value"],...]
        one = _list_bytes([_list_bytes([len(json.dumps(key)), value]) for key in keys])
    return max(LABEL_BYTES_PER_RECORD, one)


@functools.lru_cache(maxsize=32)
def _statistics_bytes(
    measures: int, replicates: int, keys: tuple[str, ...], longest: int, kinds: tuple[str, ...]
) -> int:
    out = 0
    if "share" in kinds:
        out = _share_bytes(measures, replicates) + _label_allowance(keys, longest, False)
    if "credit" in kinds:
        credit = _credit_bytes(replicates) + _label_allowance(keys, longest, True)
        out = max(out, credit)
    return out + SLACK_BYTES


def statistics_bytes(engine: EngineConfig) -> int:
    """The largest statistics record ``engine``'s settings let evald write, with its key:
    the comparison shares' (with comparisons) and the credit shares' (with interleaving
    teams; both when neither is set)."""
    kinds = ("share",) * bool(engine.statistics.comparisons) + ("credit",) * bool(
        engine.interleaving.teams
    )
    return _statistics_bytes(
        len(engine.measures),
        engine.statistics.bootstrap_replicates,
        tuple(engine.label_keys),
        engine.limits.max_string_length,
        kinds or ("share", "credit"),
    )


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
            f"snapshot and statistics chunks of {CHUNK_BYTES // 1024} KiB; no evald setting "
            "shrinks them",
        ),
        RecordNeed(
            "topics.dlq",
            topics.dlq,
            DLQ_NEED,
            "dead letters, cut to fit but never below their headers; no evald setting shrinks them",
        ),
    ]


def statistics_need(topic: str, engine: EngineConfig) -> RecordNeed:
    """The statistics topic's need (``<checkpoints>.statistics``, with comparisons or
    interleaving on) under ``engine``'s settings (``statistics_bytes``)."""
    return RecordNeed(
        "statistics topic",
        topic,
        statistics_bytes(engine),
        f"comparison and credit shares of up to {CELLS_PER_RECORD} numbers, plus their labels "
        f"({LABEL_BYTES_PER_RECORD // 1024} KiB, or one segment's at engine.label_keys and "
        "limits.max_string_length)",
    )


def shortfall(need: RecordNeed, limit: int) -> str | None:
    """What is wrong when ``limit`` (the topic's max.message.bytes) is below the need, with the
    command that fixes it; None when it is not. The caller names the setting and topic."""
    if limit >= need.need:
        return None
    return (
        f"accepts records of at most {limit} bytes (max.message.bytes) but evald writes "
        f"records of up to {need.need} bytes to it ({need.records}): the broker would refuse "
        "the transaction holding one, in every session. Raise the topic's limit: "
        "kafka-configs.sh --alter --entity-type topics --entity-name "
        f"{need.topic} --add-config max.message.bytes={need.need} (or more; Kafka's default "
        f"is {DEFAULT_MAX_MESSAGE_BYTES})"
    )
