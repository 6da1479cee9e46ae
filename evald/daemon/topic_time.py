"""Event time on the input topics, for `evald produce`: how far ahead of its clock the broker
accepts a record's timestamp, and where the records already on the topics end.

Why produce needs both: it stamps each record with its simulated arrival time, which runs
``--speed`` times faster than the wall clock. Kafka refuses a timestamp more than
``message.timestamp.after.max.ms`` (a topic setting; the broker's default is one hour) ahead
of its own clock, so a run has to stay below that. And `evald run`'s watermark follows the
newest timestamps it read: a second run stamped "now", behind what the first run wrote, would
be late on arrival (scored at once, with almost no feedback), so a run goes on from where the
topics end. Where they end moves on while they are quiet: `evald run`'s idle fallback advances
its watermark with the wall clock (docs/semantics.md §3), so produce stamps each record with
the wall time it was sent (:data:`SENT_HEADER`) and the next run adds the time since.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from evald.durations import format_duration

#: Kafka's default ``log.message.timestamp.after.max.ms`` (Kafka 3.6 and later, KIP-937)
DEFAULT_AFTER_MAX_MS = 3_600_000
#: Kafka's "no limit" (Long.MAX_VALUE), and what any larger value means
NO_LIMIT = 2**63 - 1
AFTER_MAX = "message.timestamp.after.max.ms"
BEFORE_MAX = "message.timestamp.before.max.ms"
#: before Kafka 3.6 one setting bounded both directions
DIFFERENCE_MAX = "message.timestamp.difference.max.ms"
#: the record header holding the wall time (epoch ms, ASCII digits) produce sent the record at
SENT_HEADER = "evald-sent-ms"


@dataclass(frozen=True)
class TopicsEnd:
    """The newest record timestamp on the input topics, and the wall time that record was sent
    at (None: not written by produce, or by a version that did not say)."""

    time_ms: int
    sent_ms: int | None


@dataclass(frozen=True)
class TimestampLimit:
    """How far a record's timestamp may be from the broker's clock on the input topics.

    ``after_ms`` / ``before_ms``: None when unlimited. ``where`` names the topic (or the
    default) the limit comes from, for messages."""

    after_ms: int | None
    before_ms: int | None
    where: str

    def headroom_ms(self) -> int:
        """What produce keeps below ``after_ms``: a tenth of it, between 1 s and 1 min, for the
        time a record spends in the producer and a broker clock a little behind this one."""
        assert self.after_ms is not None
        return max(1_000, min(60_000, self.after_ms // 10))

    def latest_ms(self, now_ms: int) -> int | None:
        """The newest timestamp produce writes at wall time ``now_ms``; None: no bound."""
        if self.after_ms is None:
            return None
        return now_ms + self.after_ms - self.headroom_ms()

    def describe(self) -> str:
        """``message.timestamp.after.max.ms = 1h; topic evald.impressions``."""
        after = "unlimited" if self.after_ms is None else format_duration(self.after_ms)
        text = f"{AFTER_MAX} = {after}"
        if self.before_ms is not None:
            text += f", {BEFORE_MAX} = {format_duration(self.before_ms)}"
        return f"{text}; {self.where}"


def _limit(value: str | None) -> int | None:
    if value is None:
        return None
    number = int(value)
    return None if number >= NO_LIMIT or number < 0 else number


def timestamp_limit(admin: Any, topics: list[str]) -> TimestampLimit:
    """The tightest limit over ``topics`` from their effective configs; Kafka's defaults
    (one hour ahead, unlimited behind) when the broker does not say (no DescribeConfigs
    permission, an old broker)."""
    from evald.daemon.connect_check import topic_configs

    found: TimestampLimit | None = None
    for topic in topics:
        configs = topic_configs(admin, topic)
        if configs is None:
            continue
        if configs.get("message.timestamp.type") == "LogAppendTime":
            # the broker stamps records itself and never refuses one for its timestamp
            limit = TimestampLimit(None, None, f"topic {topic}, LogAppendTime")
        else:
            legacy = configs.get(DIFFERENCE_MAX)
            after = _limit(configs.get(AFTER_MAX, legacy))
            before = _limit(configs.get(BEFORE_MAX, legacy))
            limit = TimestampLimit(after, before, f"topic {topic}")
        if found is None or _tighter(limit, found):
            found = limit
    if found is None:
        return TimestampLimit(
            DEFAULT_AFTER_MAX_MS, None, "Kafka's default: the topics' settings could not be read"
        )
    return found


def _tighter(a: TimestampLimit, b: TimestampLimit) -> bool:
    return a.after_ms is not None and (b.after_ms is None or a.after_ms < b.after_ms)


def last_event_time(
    client: dict[str, Any], topics: list[str], timeout_s: float = 10.0
) -> TopicsEnd | None:
    """The newest record timestamp among the last few records of every partition of
    ``topics``, with its :data:`SENT_HEADER`; None when they hold no record. produce writes in
    timestamp order, so a partition's newest timestamp is among its last records."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(enable_auto_commit=False, group_id=None, **client)
    try:
        tps = [
            TopicPartition(topic, p)
            for topic in topics
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        if not tps:
            return None
        ends = consumer.end_offsets(tps)
        starts = consumer.beginning_offsets(tps)
        # a few records back: the last offset may be a transaction marker, which reads as nothing
        wanted = {tp: ends[tp] for tp in tps if ends[tp] > starts[tp]}
        if not wanted:
            return None
        consumer.assign(list(wanted))
        for tp, end in wanted.items():
            consumer.seek(tp, max(starts[tp], end - 8))
        newest: TopicsEnd | None = None
        deadline = time.monotonic() + timeout_s
        while wanted and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                for record in records:
                    if newest is None or record.timestamp >= newest.time_ms:
                        newest = TopicsEnd(record.timestamp, sent_at(record.headers))
            wanted = {tp: end for tp, end in wanted.items() if consumer.position(tp) < end}
        return newest
    finally:
        consumer.close()


def sent_at(headers: Any) -> int | None:
    """The wall time in a record's :data:`SENT_HEADER`, or None (absent or not digits)."""
    for key, value in headers or ():
        if key == SENT_HEADER and isinstance(value, bytes) and value.isdigit():
            return int(value)
    return None
