"""Topic layout checks: the input topics must be co-partitioned, outputs must line up with them.

Why: the join for a request happens in the instance that owns partition *p* of both input
topics, which only works if both topics have the same partition count and producers key by
request_id. Results and checkpoints are written to the same partition number *p*, so they need
at least as many partitions as the inputs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from evald.daemon.dead_letters import max_message_bytes
from evald.daemon.fatal import Fatal
from evald.daemon.settings import TopicSettings

__all__ = [
    "TOPIC_CHECK_INTERVAL_S",
    "TopicGuard",
    "TopicLayoutError",
    "TopicShape",
    "check_checkpoint_ids",
    "check_layout",
    "check_unchanged",
    "describe",
    "ensure_statistics_topic",
    "missing_outputs",
    "statistics_policy_problem",
    "topic_configs",
]

log = logging.getLogger("evald.daemon")

#: how often the input topics' ids and partition counts are compared with those seen at start
TOPIC_CHECK_INTERVAL_S = 10.0
#: describes of a just-created statistics topic before going on without its id
STATISTICS_ID_TRIES = 30
#: the id a broker reports for a topic when it has none (Kafka's Uuid.ZERO)
NO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"


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


def describe(admin: KafkaAdminClient, names: tuple[str, ...]) -> dict[str, TopicShape | None]:
    """Each topic's id and partition count (None: it does not exist)."""
    existing = set(admin.list_topics())
    shapes: dict[str, TopicShape | None] = dict.fromkeys(names)
    present = [name for name in names if name in existing]
    for desc in admin.describe_topics(present) if present else []:
        name = desc.get("name") or desc.get("topic")
        if desc.get("error_code") or name not in shapes:
            continue  # deleted between the two requests: missing
        topic_id = desc.get("topic_id")
        shapes[name] = TopicShape(
            None if not topic_id or topic_id == NO_TOPIC_ID else str(topic_id),
            len(desc["partitions"]),
        )
    return shapes


class TopicGuard:
    """The topic checks of one daemon: at the start of every session and every
    ``TOPIC_CHECK_INTERVAL_S`` while it runs. Each failure is a :class:`Fatal` (exit 2)."""

    def __init__(
        self, topics: TopicSettings, clock: Callable[[], float], statistics: str | None = None
    ) -> None:
        """``statistics``: the statistics topic, when comparisons are configured."""
        self._topics = topics
        self._clock = clock
        #: the input topics as first seen by this process; kept across sessions, so a topic
        #: recreated during an outage is noticed when the next session starts
        self.inputs: dict[str, TopicShape] = {}
        self._last_check = 0.0
        self.statistics_name = statistics
        #: the statistics topic's id as this session found (or created) it
        self.statistics_id: str | None = None

    def topic_ids(self) -> dict[str, str]:
        """The input topics' ids (those the broker reports), and the statistics topic's, as
        written into checkpoints: a restore compares them with today's."""
        ids = {name: shape.topic_id for name, shape in self.inputs.items() if shape.topic_id}
        if self.statistics_name and self.statistics_id:
            ids[self.statistics_name] = self.statistics_id
        return ids

    def start(self, admin: KafkaAdminClient) -> int:
        """Refuse input topics that are missing, not co-partitioned or not those this process
        consumed before; create missing output topics. Returns the DLQ topic's
        ``max.message.bytes``."""
        topics = self._topics
        inputs = (topics.impressions, topics.feedback)
        outputs = (topics.results, topics.checkpoint_topic, topics.dlq)
        shapes = describe(admin, (*inputs, *outputs))
        counts = {
            name: None if shape is None else shape.partitions for name, shape in shapes.items()
        }
        try:
            # first: a topic this process consumed before and that is gone now gets the message
            # that says what to do about the old offsets, not the one for a first start
            check_unchanged(self.inputs, shapes)
            partitions = check_layout(
                counts, impressions=topics.impressions, feedback=topics.feedback, outputs=outputs
            )
        except TopicLayoutError as exc:
            raise Fatal(2, f"evald run: refusing to start: {exc}") from None
        # check_layout passed: both inputs exist
        self.inputs = {name: shape for name in inputs if (shape := shapes[name]) is not None}
        self._last_check = self._clock()
        limit = max_message_bytes(admin, topics.dlq)
        create = missing_outputs(counts, outputs)
        if create:
            log.info("creating output topics %s with %d partitions", create, partitions)
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics([NewTopic(name, partitions, -1) for name in create])
        if self.statistics_name is not None:
            self.statistics_id = self._statistics(admin, self.statistics_name)
        return limit

    def _statistics(self, admin: KafkaAdminClient, name: str) -> str | None:
        """Create the statistics topic when it is missing; refuse one that is not compacted
        (a client's metadata request re-creates a deleted topic with the broker's defaults
        where the broker allows it). Returns its id."""
        ensure_statistics_topic(admin, name)
        problem = statistics_policy_problem(name, topic_configs(admin, name))
        if problem is not None:
            raise Fatal(2, f"evald run: refusing to start: statistics topic {name}: {problem}")
        for _ in range(STATISTICS_ID_TRIES):  # a topic just created may not be described yet
            shape = describe(admin, (name,)).get(name)
            if shape is not None:
                return shape.topic_id
            time.sleep(0.1)
        return None

    def recheck(self, admin: KafkaAdminClient, now: float) -> None:
        """Every ``TOPIC_CHECK_INTERVAL_S``: stop (exit 2) when an input topic was deleted,
        recreated or repartitioned, or the statistics topic deleted or recreated."""
        if now - self._last_check < TOPIC_CHECK_INTERVAL_S:
            return
        self._last_check = self._clock()
        try:
            self.verify(admin)
        except KafkaError as exc:
            log.debug("topic check skipped: %s", exc)  # the lag probe reports the broker

    def verify(self, admin: KafkaAdminClient) -> None:
        """Stop (exit 2) when a topic changed since this session started (``recheck``'s
        check, now): a restore runs it before refusing state, since a topic recreated under
        the session explains offsets that no longer fit better than a damaged checkpoint
        does. KafkaError when the broker does not answer."""
        stats = () if self.statistics_name is None else (self.statistics_name,)
        shapes = describe(admin, (*self.inputs, *stats))
        try:
            check_unchanged(self.inputs, shapes)
            for name in stats:
                check_statistics_unchanged(name, self.statistics_id, shapes.get(name))
        except TopicLayoutError as exc:
            raise Fatal(2, f"evald run: stopping: {exc}") from None

    def check_checkpoint(self, saved: object, partition: int) -> None:
        """Refuse (exit 2) to restore ``partition`` from a checkpoint written against other
        input topics (``saved``: the checkpoint's ``topic_ids``)."""
        try:
            check_checkpoint_ids(saved if isinstance(saved, dict) else {}, self.inputs, partition)
        except TopicLayoutError as exc:
            raise Fatal(2, f"evald run: refusing to restore: {exc}") from None


def check_statistics_unchanged(name: str, seen: str | None, now: TopicShape | None) -> None:
    """Raise TopicLayoutError when the statistics topic is gone or was recreated while evald
    ran: the shares every partition published before are lost with it."""
    if now is not None and (not seen or not now.topic_id or seen == now.topic_id):
        return
    what = (
        "no longer exists" if now is None else f"was recreated (topic id {seen} -> {now.topic_id})"
    )
    raise TopicLayoutError(
        f"statistics topic {name} {what} while evald ran: the comparison shares every "
        "partition published before are lost with it. Delete it if a client created it again "
        "(a broker with auto.create.topics.enable=true creates a topic with its defaults "
        "when a client asks for it), then start evald again: it creates the topic compacted "
        "and, partition by partition, tells whether a comparison lost windows and what to do"
    )


def topic_configs(admin: KafkaAdminClient, name: str) -> dict[str, str] | None:
    """The topic's configs as strings; None when the broker does not answer them (an old
    broker, no DescribeConfigs permission)."""
    from kafka.admin import ConfigResource, ConfigResourceType

    try:
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name)], config_filter="all"
        )
    except KafkaError:
        return None
    entries = (described or {}).get("topic", {}).get(name) or {}
    out = {}
    for key, entry in entries.items():
        value = entry.get("value") if isinstance(entry, dict) else entry
        if value is not None:
            out[key] = str(value)
    return out or None


def statistics_policy_problem(name: str, configs: Mapping[str, str] | None) -> str | None:
    """What is wrong with the statistics topic's cleanup policy, with the command that fixes
    it; None when it is compacted (or the broker does not say). It must keep every share and
    each partition's newest final mark for the comparison's life: compacted, never deleted by
    time (docs/design.md, "Statistics over all partitions")."""
    if configs is None or "cleanup.policy" not in configs:
        return None
    policy = {part.strip() for part in configs["cleanup.policy"].split(",")}
    retention = configs.get("retention.ms", "")
    if "compact" in policy and ("delete" not in policy or retention == "-1"):
        return None
    return (
        f"cleanup.policy={configs['cleanup.policy']} (retention.ms={retention or '?'}): "
        "evald needs compact, so that no share is deleted by time and only each "
        "partition's newest final mark is kept (a restart refolds from the topic); run "
        f"kafka-configs.sh --alter --entity-type topics --entity-name {name} --add-config "
        "cleanup.policy=compact"
    )


def ensure_statistics_topic(admin: KafkaAdminClient, name: str) -> None:
    """Create the statistics topic (evald/daemon/comparisons.py) if missing: one partition,
    so its records are read in the order written; compacted, since a share is written once
    per key and only a partition's newest final mark is needed."""
    if name in set(admin.list_topics()):
        return
    log.info("creating statistics topic %s (1 partition, compacted)", name)
    with contextlib.suppress(TopicAlreadyExistsError):
        admin.create_topics([NewTopic(name, 1, -1, topic_configs={"cleanup.policy": "compact"})])
