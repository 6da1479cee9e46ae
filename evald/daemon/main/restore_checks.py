"""What a restore refuses: saved state that is gone, damaged or not believable.

A partition is resumed from the checkpoint record just before the group's committed offset on
the checkpoint topic (checkpoint.py). When that state is missing or wrong, no retry can help
and no automatic answer is right: starting over writes every result again, resuming from a
wrong checkpoint writes wrong or missing results (a checkpoint watermark in year 9999). So each
case is refused with a
:class:`Refusal` whose message says what happened and what the operator can do; `evald run`
exits 2 with it (docs/design.md, "Saved state that cannot be used"). Pure functions: the
restore (restore.py) gathers the offsets, log bounds and records they judge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evald.config import ComparisonConfig
from evald.daemon.main.checkpoint import Checkpoint, SnapshotRef
from evald.daemon.main.merge import KINDS
from evald.input_rule import time_in_words

__all__ = [
    "RECORD_LEAD_MS",
    "Bounds",
    "Refusal",
    "Where",
    "check_checkpoint",
    "checkpoint_offset",
    "credit_lost",
    "lost_comparisons",
    "offsets_lost",
    "resume_earlier",
    "start_over",
    "statistics_lost",
    "ways_out",
]

#: how far a Kafka record's timestamp may lead the broker's clock by default
#: (``log.message.timestamp.after.max.ms``, one hour since Kafka 4.0); it also covers the clock
#: difference between this machine and the instance that wrote the checkpoint
RECORD_LEAD_MS = 3_600_000


class Refusal(ValueError):
    """A partition's saved state cannot be used; the message says what and what to do."""


@dataclass(frozen=True)
class Where:
    """The names a refusal's advice needs."""

    group: str
    checkpoint_topic: str
    #: input kind -> topic name
    inputs: Mapping[str, str]


@dataclass(frozen=True)
class Bounds:
    """What a restored checkpoint's values must lie within.

    ``latest_ms``: no event time can be later (the wall clock + ``max_event_lead`` +
    ``RECORD_LEAD_MS``; None with ``max_event_lead: null``, where the engine accepts any lead);
    ``earliest_ms``: ``min_event_time``; ``lateness``: the watermark trails event times by it;
    the end of the partition's inputs where a fetch confirmed it (by kind: a kind left out is
    not in doubt), the log start of its checkpoint partition and the offset of the checkpoint
    record itself.
    """

    latest_ms: int | None
    earliest_ms: int
    lateness: int
    inputs_end: Mapping[str, int]
    checkpoint_start: int
    checkpoint_at: int


def start_over(where: Where) -> str:
    """The way out that always works, and what it costs."""
    return (
        "to start over, stop every instance and start evald with a new daemon.group_id (not "
        f"{where.group}) and new results and checkpoint topics: the inputs are read again from "
        "their oldest retained record"
    )


def ways_out(where: Where, p: int) -> str:
    """Both ways out of a damaged checkpoint of ``p``."""
    return f"{resume_earlier(where, p)}; or, {start_over(where)}"


def resume_earlier(where: Where, p: int) -> str:
    """Resuming from an older checkpoint of ``p``: exact up to it, results after it written
    again (a read_committed reader de-duplicates them by request_id)."""
    return (
        f"resume from an earlier checkpoint of partition {p}: with every instance stopped, "
        f"kafka-consumer-groups.sh --reset-offsets --group {where.group} --topic "
        f"{where.checkpoint_topic}:{p} --to-offset <offset of an earlier record keyed "
        f'"{p}" + 1> --execute (the results written since that checkpoint are written again)'
    )


def checkpoint_offset(
    p: int,
    committed: int | None,
    inputs: Mapping[str, int | None],
    checkpoint_start: int,
    where: Where,
) -> int | None:
    """The offset of ``p``'s committed checkpoint record: the group's offset on the checkpoint
    topic (``committed``) minus one; None when the group never committed anything for ``p``
    (a fresh start from both inputs' beginning).

    Refused: offsets on the inputs but none on the checkpoint topic (Kafka drops a group's
    offsets of a deleted topic: the checkpoint topic was deleted, or the group's offsets on it
    reset), and a checkpoint below the partition's log start (deleted by retention or
    DeleteRecords while evald was stopped).
    """
    if committed is None or committed <= 0:
        held = {kind: offset for kind, offset in inputs.items() if offset is not None}
        if not held:
            return None
        shown = ", ".join(f"{where.inputs[kind]}:{p}@{offset}" for kind, offset in held.items())
        raise Refusal(
            f"the group {where.group} committed offsets on the inputs of partition {p} "
            f"({shown}) but none on the checkpoint topic {where.checkpoint_topic}: the "
            "checkpoint topic was deleted (Kafka drops a group's offsets with the topic) or "
            "the group's offset on it was reset, so where partition "
            f"{p}'s pending joins, window aggregates and results stand is lost; starting from "
            "the inputs' beginning would write every result again. If the checkpoint topic "
            f"still exists, {resume_earlier(where, p)}; otherwise, {start_over(where)}"
        )
    if committed - 1 < checkpoint_start:
        raise Refusal(
            f"the committed checkpoint of partition {p} at {where.checkpoint_topic}:{p}@"
            f"{committed - 1} is gone: the partition's log starts at {checkpoint_start} "
            "(deleted by retention while evald was stopped, or by DeleteRecords). Keep the "
            "checkpoint topic's retention.ms well above an hour plus the longest time evald "
            f'may be stopped (docs/design.md, "Restart cost"); {start_over(where)}'
        )
    return committed - 1


def offsets_lost(p: int, found_at: int, where: Where) -> Refusal:
    """The group has no offset at all for ``p`` although the checkpoint topic holds a
    committed checkpoint of ``p`` (at ``found_at``): its offsets expired or were deleted."""
    return Refusal(
        f"the group {where.group} has no committed offset for partition {p}, but "
        f"{where.checkpoint_topic}:{p} holds committed checkpoints of it (the first at offset "
        f"{found_at}): the group's offsets expired (the broker's offsets.retention.minutes, 7 "
        "days by default, counts from when the last member left) or the group was deleted. "
        "Starting from the inputs' beginning would write every result again. To resume where "
        "evald stopped, with every instance stopped, set the group's offset on "
        f"{where.checkpoint_topic}:{p} to one past the last committed record keyed "
        f'"{p}" (kafka-console-consumer.sh --isolation-level read_committed --partition {p} '
        "--property print.offset=true shows it; kafka-consumer-groups.sh --reset-offsets "
        f"--group {where.group} --topic {where.checkpoint_topic}:{p} --to-offset <it + 1> "
        f"--execute); or, {start_over(where)} (or delete the checkpoint topic to start over "
        "with the same names)"
    )


def check_checkpoint(p: int, checkpoint: Checkpoint, bounds: Bounds, where: Where) -> None:
    """Refuse a checkpoint record of partition ``p`` whose values cannot be right: another
    partition's, offsets that do not fit its topics, a watermark or event times that no event
    the engine accepts could give, references to records that cannot be its own."""
    at = f"{where.checkpoint_topic}:{p}@{bounds.checkpoint_at}"
    problem = (
        _partition_problem(p, checkpoint)
        or _offset_problem(checkpoint, bounds, where)
        or _time_problem(checkpoint, bounds)
        or _reference_problem(checkpoint, bounds)
    )
    if problem is not None:
        raise Refusal(
            f"the committed checkpoint of partition {p} at {at} cannot be right: {problem}. "
            "Find what else writes to that topic (or which instance's clock was wrong), then "
            f"{ways_out(where, p)}"
        )


def _partition_problem(p: int, checkpoint: Checkpoint) -> str | None:
    if checkpoint.partition != p:
        return f"it is the checkpoint of partition {checkpoint.partition}"
    for name, offsets in (("committed", checkpoint.committed), ("consumed", checkpoint.consumed)):
        if sorted(offsets) != sorted(KINDS):
            return f"its {name} offsets name {sorted(offsets)}, not {sorted(KINDS)}"
    return None


def _offset_problem(checkpoint: Checkpoint, bounds: Bounds, where: Where) -> str | None:
    for kind in KINDS:
        committed, consumed = checkpoint.committed[kind], checkpoint.consumed[kind]
        topic = where.inputs[kind]
        if not 0 <= committed <= consumed:
            return f"{topic}: committed offset {committed} and consumed offset {consumed}"
        end = bounds.inputs_end.get(kind)
        if end is not None and consumed > end:
            return (
                f"it consumed {topic}:{checkpoint.partition} up to offset {consumed}, but "
                f"that partition ends at {end}"
            )
    last = 0
    for r in checkpoint.results:
        if not last <= r.start <= r.end:
            return f"its result ranges {[(x.start, x.end) for x in checkpoint.results]} overlap"
        last = r.end
    for name, runs in (
        ("evicted", checkpoint.evicted),
        ("evicted_feedback", checkpoint.evicted_feedback),
        ("held_feedback", checkpoint.held_feedback),
    ):
        if any(not 0 <= a < b for a, b in runs):
            return f"its {name} offsets {list(runs)[:5]} are not runs"
    fb = checkpoint.committed["feedback"], checkpoint.consumed["feedback"]
    if any(a < fb[0] or b > fb[1] for a, b in checkpoint.held_feedback):
        return f"its held feedback {list(checkpoint.held_feedback)[:5]} lies outside {list(fb)}"
    return None


def _time_problem(checkpoint: Checkpoint, bounds: Bounds) -> str | None:
    """Event times later than any the engine accepts, or earlier than its earliest."""
    times = [("watermark", checkpoint.watermark, bounds.lateness)]
    confirmed = checkpoint.event_times.confirmed if checkpoint.event_times else None
    times.append(("newest confirmed event time", confirmed, 0))
    for name, value, lateness in times:
        if value is None:
            continue
        if bounds.latest_ms is not None and value + lateness > bounds.latest_ms:
            return (
                f"its {name} is {time_in_words(value)}, later than any event time the engine "
                f"accepts now (the wall clock + max_event_lead + {RECORD_LEAD_MS // 60_000} "
                f"min: {time_in_words(bounds.latest_ms)})"
            )
        if value + lateness < bounds.earliest_ms:
            return (
                f"its {name} is {time_in_words(value)}, before engine.min_event_time "
                f"({time_in_words(bounds.earliest_ms)})"
            )
    return None


def _reference_problem(checkpoint: Checkpoint, bounds: Bounds) -> str | None:
    """The snapshot and open-shares records it names sit before it in its own partition."""
    refs: list[tuple[str, SnapshotRef]] = []
    if checkpoint.snapshot is not None:
        refs.append(("snapshot", checkpoint.snapshot))
    placed = (
        ("open comparison shares", "name", checkpoint.statistics),
        ("click model", "names", checkpoint.state.click_model),
    )
    for what, verb, field in placed:  # state too large to ride inline: records it names
        if isinstance(field, dict) and "records" in field:
            try:
                ref = SnapshotRef.from_json(field["records"])
            except (KeyError, TypeError, ValueError) as exc:
                return f"its {what} {verb} no records: {exc}"
            if ref is not None:
                refs.append((what, ref))
    for name, ref in refs:
        if ref.offsets[-1] >= bounds.checkpoint_at:
            return f"its {name} records {list(ref.offsets)} do not precede it"
        if ref.offsets[0] < bounds.checkpoint_start:
            return (
                f"its {name} records {list(ref.offsets)} were deleted (the partition's log "
                f"starts at {bounds.checkpoint_start}: the topic's retention.ms must be well "
                "above an hour, the snapshot's renewal age, plus the longest stop)"
            )
    return None


def lost_comparisons(
    comparisons: Sequence[ComparisonConfig], width: int, final: int | None
) -> list[str]:
    """The comparisons that fold a window ending at or before ``final`` (a partition's final
    mark): the windows whose shares that partition published before the statistics topic lost
    them. A comparison skips windows starting before its ``start``."""
    if final is None:
        return []
    return [c.name for c in comparisons if _needs(int(c.start), width, final)]


def _needs(start: int, width: int, final: int) -> bool:
    """Whether a fold that skips windows starting before ``start`` folds a window ending at
    or before ``final``."""
    first = -(-start // width) * width  # the first window it folds
    return first + width <= final


def statistics_lost(
    topic: str, marks: Mapping[int, int], comparisons: Sequence[ComparisonConfig], width: int
) -> str:
    """The statistics topic is not the one the checkpoints of the partitions in ``marks``
    (partition -> final mark) were written against: the shares they published up to their
    marks are gone. Refused when a configured comparison folds one of those windows (it would
    silently miss their lists); otherwise the warning to log."""
    latest = max(marks.values())
    shown = ", ".join(f"{p} up to {time_in_words(m)}" for p, m in sorted(marks.items()))
    lost = lost_comparisons(comparisons, width, latest)
    if not lost:
        return (
            f"statistics topic {topic} was created again after partitions published their "
            f"comparison shares ({shown}); no configured comparison folds those windows"
        )
    raise Refusal(
        f"the statistics topic {topic} was deleted and created again since partitions "
        f"published their comparison shares of every window ending up to their final mark "
        f"({shown}): those shares are gone, and the results topic cannot give them back (it "
        f"does not say which impressions were late), so the comparisons {lost} would silently "
        "miss those windows' lists. Restore the topic from a "
        "copy if there is one; or start those comparisons over: set their start to "
        f"{time_in_words(latest)} or later (statistics.comparisons[].start) and start evald "
        "again (with several instances, each checks the partitions it restores)"
    )


def credit_lost(topic: str, marks: Mapping[int, int], start: int, width: int) -> str:
    """The interleaving credit's ``statistics_lost``: the statistics topic is not the one the
    checkpoints of the partitions in ``marks`` (partition -> credit mark) were written against,
    so the credit shares they published up to their marks are gone. Refused when the test
    folds one of those windows (``interleaving.start``, width ``interleaving.window``);
    otherwise the warning to log."""
    latest = max(marks.values())
    shown = ", ".join(f"{p} up to {time_in_words(m)}" for p, m in sorted(marks.items()))
    if not _needs(start, width, latest):
        return (
            f"statistics topic {topic} was created again after partitions published their "
            f"interleaving credit shares ({shown}); the interleaving test starts after those "
            "windows (interleaving.start)"
        )
    raise Refusal(
        f"the statistics topic {topic} was deleted and created again since partitions "
        f"published their interleaving credit shares of every window ending up to their credit "
        f"mark ({shown}): those shares are gone, and the results topic cannot give them back "
        "(it does not say which impressions were late), so the interleaving test would "
        "silently miss those windows' lists. Restore the topic from a copy if there is one; or "
        f"start the interleaving test over: set interleaving.start to {time_in_words(latest)} "
        "or later and start evald again (with several instances, each checks the partitions "
        "it restores)"
    )
