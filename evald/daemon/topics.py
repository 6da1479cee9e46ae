"""Topic layout checks: the input topics must be co-partitioned, outputs must line up with them.

Why: the join for a request happens in the instance that owns partition *p* of both input
topics, which only works if both topics have the same partition count and producers key by
request_id. Results and checkpoints are written to the same partition number *p*, so they need
at least as many partitions as the inputs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import (
    ClusterAuthorizationFailedError,
    KafkaError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)

from evald.daemon.broker_config import described
from evald.daemon.dead_letters import DEFAULT_MAX_MESSAGE_BYTES, SLACK_BYTES, max_message_bytes
from evald.daemon.fatal import Fatal
from evald.daemon.permissions import acl_command, principal, topic_denied, topic_needs, unauthorized
from evald.daemon.record_limits import (
    RESULT_LETTER_ROOM,
    needs,
    shortfall,
    statistics_bytes,
    statistics_need,
)
from evald.daemon.settings import Settings

__all__ = [
    "TOPIC_CHECK_INTERVAL_S",
    "OutputLimits",
    "TopicAccessDenied",
    "TopicGuard",
    "TopicLayoutError",
    "TopicShape",
    "batch_under",
    "check_checkpoint_ids",
    "check_layout",
    "check_outputs_kept",
    "check_unchanged",
    "create_dlq",
    "describe",
    "dlq_limit",
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
    """What identifies a topic to a running daemon: its id (None when the broker does not
    report one) and its partition count; and the operations evald's principal may perform on
    it (KIP-430; None when the broker does not report them)."""

    topic_id: str | None
    partitions: int
    authorized: frozenset[str] | None = None


class OutputLimits(NamedTuple):
    """The largest record batch (``max.message.bytes``) the DLQ, the results, the checkpoint
    and the statistics topic accept (the same transactional producer writes all four)."""

    dlq: int
    results: int
    checkpoints: int
    statistics: int = DEFAULT_MAX_MESSAGE_BYTES

    def batch_bytes(self, most: int) -> int:
        """The producer's ``batch_size``: at most ``most``, and below every limit, which bounds
        a whole batch, not a record (a topic accepting 64 KiB refused the batches of 300-byte
        results that filled the 512 KiB default, each time again)."""
        return batch_under(most, self)


def batch_under(most: int, limits: Iterable[int]) -> int:
    """A producer ``batch_size`` of at most ``most`` bytes that every topic of ``limits``
    (their ``max.message.bytes``) accepts, with room for what the producer's count misses."""
    return max(1, min(most, *(limit - SLACK_BYTES for limit in limits)))


class TopicAccessDenied(Exception):
    """The broker refused to describe ``topics`` (no Describe permission)."""

    def __init__(self, topics: list[str]) -> None:
        super().__init__(", ".join(topics))
        self.topics = topics


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


def check_outputs_kept(
    before: Mapping[str, TopicShape], now: Mapping[str, TopicShape | None], group: str
) -> None:
    """Raise TopicLayoutError when the results or checkpoint topic seen ``before`` is gone or
    was recreated (another topic id) ``now``.

    Why fatal rather than created again: a checkpoint locates the committed results of its
    partition by their offsets in the results topic (a restore reads them back to rebuild the
    window aggregates) and the group's committed offset on the checkpoint topic locates the
    checkpoint; a new topic restarts at offset 0, so either would be read as something it is
    not, and the results the deleted topic held are gone for its readers (docs/daemon.md,
    "Topics deleted while evald runs").
    """
    for name, old in before.items():
        new = now.get(name)
        if new is not None and not (old.topic_id and new.topic_id != old.topic_id):
            continue
        what = (
            "was deleted"
            if new is None
            else f"was deleted and recreated (topic id {old.topic_id} -> {new.topic_id})"
        )
        raise TopicLayoutError(
            f"output topic {name} {what} while evald ran: whatever it held is gone, and the "
            f"checkpoints of group {group} point at offsets in the old topic (the results a "
            "restore reads back, the checkpoint a partition resumes from), so evald cannot go "
            "on with a new one. To start over, start evald with a new daemon.group_id and new "
            "results/checkpoint topics (evald creates missing ones): it reads the inputs again "
            "from their earliest retained records and writes their results anew"
        )


#: what to do when an input topic is not the one the checkpoints were written against
INPUT_ADVICE = (
    "the committed offsets and checkpoints refer to the old topic. To consume the new one, "
    "start evald with a new daemon.group_id and new results/checkpoint topics (or delete the "
    "group and its checkpoint topic)"
)
#: ... and when the results topic is not
RESULTS_ADVICE = (
    "the checkpoint locates its committed results by their offsets in the old topic, and "
    "those results are gone. To start over, start evald with a new daemon.group_id and a new "
    "checkpoint topic: it reads the inputs again from their earliest retained records and "
    "writes their results anew"
)


def check_checkpoint_ids(
    saved: Mapping[str, str],
    now: Mapping[str, TopicShape],
    partition: int,
    *,
    role: str = "input topic",
    advice: str = INPUT_ADVICE,
) -> None:
    """Raise TopicLayoutError when a topic's id differs from the one partition ``partition``'s
    checkpoint was written against: the topic was recreated while no evald ran
    (``check_unchanged`` and ``check_outputs_kept`` see only changes during this process's
    life)."""
    for name, shape in now.items():
        old = saved.get(name)
        if old and shape.topic_id and old != shape.topic_id:
            raise TopicLayoutError(
                f"{role} {name} was deleted and recreated since the checkpoint of partition "
                f"{partition} was written (topic id {old} -> {shape.topic_id}); {advice}"
            )


def describe(admin: KafkaAdminClient, names: tuple[str, ...]) -> dict[str, TopicShape | None]:
    """Each topic's id, partition count and authorized operations (None: it does not exist),
    in one metadata request. Raises :class:`TopicAccessDenied` naming the topics the broker
    refuses to describe: a topic evald may not see is not a missing one."""
    shapes: dict[str, TopicShape | None] = dict.fromkeys(names)
    denied = []
    for desc in admin.describe_topics(list(shapes)) if shapes else []:
        name = desc.get("name") or desc.get("topic")
        if name not in shapes:
            continue
        code = desc.get("error_code") or 0
        if code == TopicAuthorizationFailedError.errno:
            denied.append(name)
            continue
        if code == UnknownTopicOrPartitionError.errno:
            continue  # missing
        if code:  # e.g. still being created: nothing to conclude, ask again later
            raise KafkaError(f"describing topic {name}: error code {code}")
        topic_id = desc.get("topic_id")
        ops = desc.get("authorized_operations")
        shapes[name] = TopicShape(
            None if not topic_id or topic_id == NO_TOPIC_ID else str(topic_id),
            len(desc["partitions"]),
            frozenset(str(op).upper() for op in ops) if ops else None,
        )
    if denied:
        raise TopicAccessDenied(denied)
    return shapes


class TopicGuard:
    """The topic checks of one daemon: at the start of every session and every
    ``TOPIC_CHECK_INTERVAL_S`` while it runs. Each failure is a :class:`Fatal` (exit 2)."""

    def __init__(
        self, settings: Settings, clock: Callable[[], float], statistics: str | None = None
    ) -> None:
        """``statistics``: the statistics topic, when comparisons are configured."""
        self._settings = settings
        self._topics = settings.topics
        self._clock = clock
        #: the input topics as first seen by this process; kept across sessions, so a topic
        #: recreated during an outage is noticed when the next session starts
        self.inputs: dict[str, TopicShape] = {}
        #: the results and checkpoint topics as first seen by this process (kept the same way)
        self.outputs: dict[str, TopicShape] = {}
        #: the dead-letter topic was seen (it is created again, not fatal: daemon.md)
        self._dlq_seen = False
        self._last_check = 0.0
        #: the thread that started the session: the only one that uses its admin client
        self._thread: threading.Thread | None = None
        self.statistics_name = statistics
        #: the statistics topic's id as this session found (or created) it
        self.statistics_id: str | None = None

    def topic_ids(self) -> dict[str, str]:
        """The ids of the input topics, of the results topic and of the statistics topic
        (those the broker reports), as written into checkpoints: a restore refuses a
        checkpoint written against other inputs or results, and compares the statistics
        topic's with today's."""
        results = self.outputs.get(self._topics.results)
        shapes = {**self.inputs, **({self._topics.results: results} if results else {})}
        ids = {name: shape.topic_id for name, shape in shapes.items() if shape.topic_id}
        if self.statistics_name and self.statistics_id:
            ids[self.statistics_name] = self.statistics_id
        return ids

    def start(self, admin: KafkaAdminClient) -> OutputLimits:
        """Refuse input topics that are missing, not co-partitioned or not those this process
        consumed before, output topics this process wrote that are gone, and topics evald's
        principal may not use, and output topics whose ``max.message.bytes`` is below what
        evald's records need; create missing output topics. Returns the DLQ, results,
        checkpoint and statistics topics' ``max.message.bytes``."""
        self._thread = threading.current_thread()
        topics = self._topics
        ckpt = topics.checkpoint_topic
        outputs = (topics.results, ckpt, topics.dlq)
        shapes = self._describe(admin, "refusing to start")
        counts = {
            name: None if shape is None else shape.partitions for name, shape in shapes.items()
        }
        try:
            # first: a topic this process consumed before and that is gone now gets the message
            # that says what to do about the old offsets, not the one for a first start
            check_unchanged(self.inputs, shapes)
            check_outputs_kept(self.outputs, shapes, self._settings.daemon.group_id)
            partitions = check_layout(
                counts, impressions=topics.impressions, feedback=topics.feedback, outputs=outputs
            )
        except TopicLayoutError as exc:
            raise Fatal(2, f"evald run: refusing to start: {exc}") from None
        # check_layout passed: both inputs exist
        inputs = (topics.impressions, topics.feedback)
        self.inputs = {name: shape for name in inputs if (shape := shapes[name]) is not None}
        self._last_check = self._clock()
        create = missing_outputs(counts, outputs)
        if create:
            self._create(admin, create, partitions)
            with contextlib.suppress(KafkaError):  # not visible yet: the next check has them
                admin.wait_for_topics(create, timeout_ms=5_000)
            # their ids, for the checkpoints; and a topic evald may create but not write to
            # is refused before it is ready (one not described yet: the next check has it)
            with contextlib.suppress(KafkaError):
                shapes.update(describe(admin, tuple(create)))
        if self.statistics_name is not None:
            self.statistics_id = self._statistics(admin, self.statistics_name)
        self._check_permissions(shapes, "refusing to start")
        self._keep_outputs(shapes)
        # read after creating: a topic evald created has the broker's default, maybe too small
        return self._limits(admin)

    def _limits(self, admin: KafkaAdminClient) -> OutputLimits:
        """The output topics' ``max.message.bytes``; a topic whose limit is below the largest
        record evald writes to it (record_limits) is fatal: the broker would refuse that
        record's transaction in every session. The statistics topic's is left at Kafka's
        default when evald writes none (its shares share the commit transaction)."""
        topics = self._topics
        stats = self.statistics_name
        names = (topics.dlq, topics.results, topics.checkpoint_topic, *((stats,) if stats else ()))
        limits = OutputLimits(*(max_message_bytes(admin, name) for name in names))
        of = {topics.dlq: limits.dlq, topics.checkpoint_topic: limits.checkpoints}
        limited = needs(topics)
        if stats:
            of[stats] = limits.statistics
            limited.append(statistics_need(stats, self._settings.engine_config()))
        said = [
            f"{need.setting} {need.topic} {problem}"
            for need in limited
            if (problem := shortfall(need, of[need.topic]))
        ]
        if said:
            raise Fatal(2, "evald run: refusing to start: " + "; and ".join(said))
        return limits

    def _statistics(self, admin: KafkaAdminClient, name: str) -> str | None:
        """Create the statistics topic when it is missing; refuse one that is not compacted
        (a client's metadata request re-creates a deleted topic with the broker's defaults
        where the broker allows it). Returns its id."""
        ensure_statistics_topic(admin, name, statistics_bytes(self._settings.engine_config()))
        problem = statistics_policy_problem(name, topic_configs(admin, name))
        if problem is not None:
            raise Fatal(2, f"evald run: refusing to start: statistics topic {name}: {problem}")
        for _ in range(STATISTICS_ID_TRIES):  # a topic just created may not be described yet
            shape = describe(admin, (name,)).get(name)
            if shape is not None:
                return shape.topic_id
            time.sleep(0.1)
        return None

    def recheck(
        self, admin: KafkaAdminClient, now: float, interval_s: float = TOPIC_CHECK_INTERVAL_S
    ) -> None:
        """Every ``interval_s``: :meth:`verify`. Only on the thread that started the session (a
        commit in a rebalance callback waits on another one)."""
        if now - self._last_check < interval_s or threading.current_thread() is not self._thread:
            return
        self._last_check = self._clock()
        try:
            shapes = self._shapes(admin)
        except KafkaError as exc:
            log.debug("topic check skipped: %s", exc)  # the lag probe reports the broker
            return
        self._verify(shapes)

    def verify(self, admin: KafkaAdminClient) -> None:
        """Stop (exit 2) when an input topic was deleted, recreated or repartitioned, the
        results or checkpoint topic was deleted or recreated, the statistics topic deleted or
        recreated, or the principal lost an operation evald needs on one of its topics; end
        the session (a transient KafkaError) when the dead-letter topic was deleted, so that
        the next one creates it again. A restore runs it before refusing state, since a topic
        recreated under the session explains offsets that no longer fit better than a damaged
        checkpoint does. KafkaError when the broker does not answer."""
        self._verify(self._shapes(admin))

    def _shapes(self, admin: KafkaAdminClient) -> dict[str, TopicShape | None]:
        """Every topic evald uses, the statistics topic included, described."""
        shapes = self._describe(admin, "stopping")
        name = self.statistics_name
        if name is not None and name not in shapes:
            shapes.update(describe(admin, (name,)))
        return shapes

    def _verify(self, shapes: dict[str, TopicShape | None]) -> None:
        """:meth:`verify` on topics described."""
        stats = () if self.statistics_name is None else (self.statistics_name,)
        try:
            check_unchanged(self.inputs, shapes)
            check_outputs_kept(self.outputs, shapes, self._settings.daemon.group_id)
            for name in stats:
                check_statistics_unchanged(name, self.statistics_id, shapes.get(name))
        except TopicLayoutError as exc:
            raise Fatal(2, f"evald run: stopping: {exc}") from None
        self._check_permissions(shapes, "stopping")
        self._keep_outputs(shapes)
        if self._dlq_seen and shapes.get(self._topics.dlq) is None:
            # evald never reads it back: a new session creates it again, and the letters of
            # the transaction this ends are written again by the replay
            raise KafkaError(f"the dead-letter topic {self._topics.dlq} was deleted; recreating it")

    def authorized(self, admin: KafkaAdminClient) -> dict[str, frozenset[str] | None]:
        """Per topic evald uses, the operations the broker says its principal may perform now
        (an empty set: it may not even describe the topic); a topic that does not exist is
        left out. For the message of a denied request (permissions.explain_denial)."""
        names = tuple(dict.fromkeys(need.topic for need in topic_needs(self._settings)))
        try:
            shapes = describe(admin, names)
        except TopicAccessDenied as exc:
            denied = set(exc.topics)
            allowed = describe(admin, tuple(name for name in names if name not in denied))
            return {
                **{name: s.authorized for name, s in allowed.items() if s is not None},
                **dict.fromkeys(denied, frozenset()),
            }
        return {name: shape.authorized for name, shape in shapes.items() if shape is not None}

    def _describe(self, admin: KafkaAdminClient, verb: str) -> dict[str, TopicShape | None]:
        """Every topic evald uses, described; a topic it may not describe is fatal."""
        names = tuple(dict.fromkeys(need.topic for need in topic_needs(self._settings)))
        try:
            return describe(admin, names)
        except TopicAccessDenied as exc:
            denied = [need for need in topic_needs(self._settings) if need.topic in exc.topics]
            said = [topic_denied(self._settings, need, need.operations) for need in denied]
            raise Fatal(2, f"evald run: {verb}: " + "; and ".join(said)) from None

    def _check_permissions(self, shapes: Mapping[str, TopicShape | None], verb: str) -> None:
        """Fatal when the broker reports an operation evald needs as not authorized."""
        authorized = {name: shape.authorized for name, shape in shapes.items() if shape}
        said = unauthorized(self._settings, authorized)
        if said:
            raise Fatal(2, f"evald run: {verb}: " + "; and ".join(said))

    def _create(self, admin: KafkaAdminClient, names: list[str], partitions: int) -> None:
        """Create the missing output topics; the checkpoint topic with Kafka's default
        ``max.message.bytes``, whatever the broker's default (its chunks need a quarter of it,
        record_limits.CHECKPOINT_NEED); the DLQ with room for a result the results topic
        refuses (:func:`create_dlq`)."""
        log.info("creating output topics %s with %d partitions", names, partitions)
        limit = {"max.message.bytes": str(DEFAULT_MAX_MESSAGE_BYTES)}
        ckpt, dlq = self._topics.checkpoint_topic, self._topics.dlq
        others = [
            NewTopic(name, partitions, -1, topic_configs=limit if name == ckpt else {})
            for name in names
            if name != dlq
        ]
        try:
            if others:  # kafka-python refuses an empty list (the DLQ alone missing)
                with contextlib.suppress(TopicAlreadyExistsError):
                    # the DLQ last: its limit follows the results topic's, which may be new
                    admin.create_topics(others)
            if dlq in names:
                create_dlq(admin, dlq, partitions, self._topics.results)
        except (TopicAuthorizationFailedError, ClusterAuthorizationFailedError) as exc:
            grant = acl_command(self._settings, "--cluster", ["CREATE"])
            raise Fatal(
                2,
                f"evald run: refusing to start: the broker denies evald's principal "
                f"({principal(self._settings)}) Create for the missing output topics "
                f"{', '.join(names)} ({type(exc).__name__}); create them yourself with "
                f"{partitions} partitions, or grant Create: {grant}",
            ) from None

    def _keep_outputs(self, shapes: Mapping[str, TopicShape | None]) -> None:
        """Remember the results and checkpoint topics the first time they are seen."""
        for name in (self._topics.results, self._topics.checkpoint_topic):
            shape = shapes.get(name)
            if name not in self.outputs and shape is not None:
                self.outputs[name] = shape
        self._dlq_seen = self._dlq_seen or shapes.get(self._topics.dlq) is not None

    def check_checkpoint(self, saved: object, partition: int) -> None:
        """Refuse (exit 2) to restore ``partition`` from a checkpoint written against other
        input topics or another results topic (``saved``: the checkpoint's ``topic_ids``)."""
        ids = saved if isinstance(saved, dict) else {}
        results = self._topics.results
        try:
            check_checkpoint_ids(ids, self.inputs, partition)
            check_checkpoint_ids(
                {results: ids[results]} if results in ids else {},
                {results: self.outputs[results]} if results in self.outputs else {},
                partition,
                role="results topic",
                advice=RESULTS_ADVICE,
            )
        except TopicLayoutError as exc:
            raise Fatal(2, f"evald run: refusing to restore: {exc}") from None


def dlq_limit(results_limit: int) -> int:
    """The ``max.message.bytes`` evald gives a DLQ topic it creates: a result_too_large letter
    holds its whole result up to the results topic's limit, whatever that is, and no letter
    gets less room than Kafka's default (a topic-level limit may exceed the broker's
    ``message.max.bytes``; replicas and consumers fetch a larger batch all the same)."""
    return max(results_limit, DEFAULT_MAX_MESSAGE_BYTES) + RESULT_LETTER_ROOM


def create_dlq(admin: KafkaAdminClient, name: str, partitions: int, results: str) -> None:
    """Create the dead-letter topic with :func:`dlq_limit` of the results topic's limit (Kafka's
    default when the results topic does not exist yet or the broker does not say)."""
    limit = dlq_limit(max_message_bytes(admin, results))
    configs = {"max.message.bytes": str(limit)}
    with contextlib.suppress(TopicAlreadyExistsError):
        admin.create_topics([NewTopic(name, partitions, -1, topic_configs=configs)])


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
    broker, no DescribeConfigs permission: ``broker_config.described``)."""
    return described(admin, "topic", name)


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


def ensure_statistics_topic(admin: KafkaAdminClient, name: str, need: int) -> None:
    """Create the statistics topic (evald/daemon/main/comparisons.py) if missing: one partition,
    so its records are read in the order written; compacted, since a share is written once
    per key and only a partition's newest final mark is needed; ``max.message.bytes`` Kafka's
    default whatever the broker's, or ``need`` (record_limits.statistics_bytes) where the
    settings' labels make a record larger: a smaller limit would refuse it in every session."""
    if name in set(admin.list_topics()):
        return
    log.info("creating statistics topic %s (1 partition, compacted)", name)
    limit = max(DEFAULT_MAX_MESSAGE_BYTES, need)
    configs = {"cleanup.policy": "compact", "max.message.bytes": str(limit)}
    with contextlib.suppress(TopicAlreadyExistsError):
        admin.create_topics([NewTopic(name, 1, -1, topic_configs=configs)])
