"""`evald check-config --connect`: will `evald run` work against these brokers and topics?

Checks, each reported as ok / note / FAIL with what to do: the brokers answer;
``kafka.transaction_timeout_ms`` is within a broker's ``transaction.max.timeout.ms`` (else
`evald run` exits 2 at its first transaction); both input topics
exist and are co-partitioned (same partition count); existing output topics have at least that
many partitions (missing ones are created by `evald run`); and, where the broker reports the
operations the client is authorized for (KIP-430), that the principal may read the inputs and
write the outputs; with comparisons configured, that the statistics topic is compacted (or
missing: `evald run` creates it so); that the checkpoint and dead-letter topics accept the
largest record evald writes to them (record_limits.py). The decisions are pure functions of
the described topics, so they are tested without a broker; :func:`connect_checks` only fetches
the description.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from evald.daemon.broker_config import described_int
from evald.daemon.names import internal_topic
from evald.daemon.permissions import STATISTICS_SETTINGS, acl_command, topic_needs
from evald.daemon.record_limits import (
    RESULT_LETTER_ROOM,
    needs,
    shortfall,
    statistics_need,
)
from evald.daemon.settings import Settings
from evald.daemon.topics import (
    TopicLayoutError,
    check_layout,
    statistics_policy_problem,
    topic_configs,
)

__all__ = [
    "Check",
    "TopicInfo",
    "connect_checks",
    "layout_checks",
    "permission_checks",
    "record_size_checks",
    "statistics_check",
    "transaction_timeout_check",
]

OK, NOTE, FAIL = "ok", "note", "FAIL"


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    status: str  # OK, NOTE or FAIL
    subject: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.subject}: {self.detail}"


@dataclass(frozen=True)
class TopicInfo:
    """What the broker said about one topic."""

    partitions: int | None  # None: the topic does not exist
    authorized: frozenset[str] | None = None  # operation names; None: not reported
    error: str | None = None  # e.g. "not authorized to describe it"
    configs: Mapping[str, str] | None = None  # topic configs asked for; None: not reported


#: the comparisons' setting (``STATISTICS_SETTINGS`` holds the interleaving's too)
STATISTICS = STATISTICS_SETTINGS[0]


def _roles(settings: Settings) -> list[tuple[str, str, tuple[str, ...]]]:
    """(setting, topic, operations evald needs on it): the main stage's (permissions.py), and
    the repartition stage's internal topics before the statistics topic."""
    needs = topic_needs(settings)
    roles = [
        (n.setting, n.topic, n.operations) for n in needs if n.setting not in STATISTICS_SETTINGS
    ]
    if settings.input.repartition:
        topics = settings.topics
        for name in (topics.impressions, topics.feedback):
            internal = internal_topic(settings.daemon.group_id, name)
            roles.append(("input.repartition", internal, ("DESCRIBE", "READ", "WRITE", "DELETE")))
    roles += [(n.setting, n.topic, n.operations) for n in needs if n.setting in STATISTICS_SETTINGS]
    return roles


def layout_checks(settings: Settings, info: Mapping[str, TopicInfo]) -> list[Check]:
    """Existence, partition counts and co-partitioning, as `evald run` will check them."""
    topics = settings.topics
    roles = _roles(settings)
    out: list[Check] = []
    for setting, name, _ in roles:
        topic = info.get(name, TopicInfo(None))
        if topic.error:
            out.append(Check(FAIL, f"{setting} {name}", topic.error))
        elif topic.partitions is None:
            if setting in ("topics.impressions", "topics.feedback"):
                out.append(
                    Check(
                        FAIL,
                        f"{setting} {name}",
                        "does not exist; create both input topics with the same partition "
                        "count and key records by request_id",
                    )
                )
            else:
                created = " (1 partition, compacted)" if setting in STATISTICS_SETTINGS else ""
                out.append(
                    Check(
                        NOTE,
                        f"{setting} {name}",
                        f"does not exist; `evald run` creates it{created}",
                    )
                )
        elif setting in STATISTICS_SETTINGS:
            out.append(statistics_check(name, topic, setting))
        else:
            out.append(Check(OK, f"{setting} {name}", f"{topic.partitions} partitions"))
    counts = {name: info.get(name, TopicInfo(None)).partitions for _, name, _ in roles}
    outputs = (topics.results, topics.checkpoint_topic, topics.dlq)
    if settings.input.repartition:
        out.extend(_repartition_checks(settings, counts, outputs))
    elif counts[topics.impressions] and counts[topics.feedback]:
        try:
            shared = check_layout(
                counts, impressions=topics.impressions, feedback=topics.feedback, outputs=outputs
            )
        except TopicLayoutError as exc:
            out.append(Check(FAIL, "co-partitioning", str(exc)))
        else:
            out.append(
                Check(OK, "co-partitioning", f"inputs share {shared} partitions; outputs fit")
            )
    return out


def statistics_check(name: str, topic: TopicInfo, setting: str = STATISTICS) -> Check:
    """The existing statistics topic must keep every share and each partition's newest final
    mark for the comparison's life: compacted, never deleted by time (docs/design.md,
    "Statistics over all partitions")."""
    subject = f"{setting} {name}"
    configs = topic.configs
    if configs is None or "cleanup.policy" not in configs:
        return Check(
            NOTE, subject, "the broker did not report its cleanup.policy; it must be compact"
        )
    problem = statistics_policy_problem(name, configs)
    if problem is not None:
        return Check(FAIL, subject, problem)
    if topic.partitions != 1:
        detail = f"compacted; {topic.partitions} partitions, of which evald uses partition 0 only"
        return Check(NOTE, subject, detail)
    return Check(OK, subject, "1 partition, compacted")


def _repartition_checks(
    settings: Settings, counts: Mapping[str, int | None], outputs: tuple[str, ...]
) -> list[Check]:
    """With ``input.repartition`` the inputs may be keyed any way and differ in partition
    count; the internal topics (and so the outputs) get the count `evald run` would use."""
    topics = settings.topics
    group = settings.daemon.group_id
    internal = [internal_topic(group, name) for name in (topics.impressions, topics.feedback)]
    existing = [n for name in internal if (n := counts.get(name)) is not None]
    wanted = settings.input.repartition_partitions or next(iter(existing), None)
    wanted = wanted or counts.get(topics.impressions)
    if not wanted:
        return []
    if any(n != wanted for n in existing):
        shown = ", ".join(f"{name} has {counts.get(name)}" for name in internal)
        detail = f"the internal topics must both have {wanted} partitions: {shown}"
        return [Check(FAIL, "repartitioning", detail)]
    try:
        check_layout(
            {**counts, **dict.fromkeys(internal, wanted)},
            impressions=internal[0],
            feedback=internal[1],
            outputs=outputs,
        )
    except TopicLayoutError as exc:
        return [Check(FAIL, "repartitioning", str(exc))]
    detail = f"inputs keyed any way, re-keyed by request id into {wanted} partitions; outputs fit"
    return [Check(OK, "repartitioning", detail)]


def permission_checks(settings: Settings, info: Mapping[str, TopicInfo]) -> list[Check]:
    """Missing operations per topic, from the authorized operations the broker reported."""
    reported = False
    out: list[Check] = []
    for setting, name, needed in _roles(settings):
        topic = info.get(name)
        if topic is None or topic.partitions is None or topic.authorized is None:
            continue
        reported = True
        missing = [op for op in needed if op not in topic.authorized]
        if missing:
            out.append(
                Check(
                    FAIL,
                    f"permissions {name}",
                    f"the principal lacks {', '.join(missing)} ({setting}); grant them: "
                    f"{acl_command(settings, f'--topic {name}', missing)}",
                )
            )
        else:
            out.append(Check(OK, f"permissions {name}", ", ".join(needed)))
    if not reported:
        out.append(
            Check(
                NOTE,
                "permissions",
                "the broker does not report authorized operations; evald needs Read on the "
                "inputs, Read+Write on results and checkpoints, Write on the DLQ, Read on the "
                "consumer group and Write on its transactional id",
            )
        )
    return out


def transaction_timeout_check(settings: Settings, broker_max_ms: int | None) -> Check:
    """``kafka.transaction_timeout_ms`` against the broker's ``transaction.max.timeout.ms``
    (None: not reported): the broker refuses a larger one at every start (exit 2)."""
    ours = settings.kafka.transaction_timeout_ms
    subject = "kafka.transaction_timeout_ms"
    if broker_max_ms is None:
        return Check(NOTE, subject, f"{ours}; the broker did not report transaction.max.timeout.ms")
    if ours > broker_max_ms:
        return Check(
            FAIL,
            subject,
            f"{ours} is above the broker's transaction.max.timeout.ms ({broker_max_ms}): the "
            "broker refuses it (INVALID_TRANSACTION_TIMEOUT); lower kafka.transaction_timeout_ms "
            "or raise transaction.max.timeout.ms on every broker",
        )
    return Check(OK, subject, f"{ours}, within the broker's transaction.max.timeout.ms")


def _broker_max_transaction_ms(admin: Any, cluster: Mapping[str, Any]) -> int | None:
    """One broker's ``transaction.max.timeout.ms``; None when it does not say (no
    DescribeConfigs permission on the cluster, an old broker)."""
    brokers = cluster.get("brokers") or []
    node = str(brokers[0].get("broker_id", brokers[0].get("node_id"))) if brokers else ""
    if not node.isdigit():
        return None
    return described_int(admin, "broker", node, "transaction.max.timeout.ms")


def _topic_info(desc: Mapping[str, Any]) -> TopicInfo:
    code = desc.get("error_code", 0)
    if code == 3:  # UNKNOWN_TOPIC_OR_PARTITION
        return TopicInfo(None)
    if code == 29:  # TOPIC_AUTHORIZATION_FAILED
        return TopicInfo(None, error="not authorized to describe it (grant Describe)")
    if code:
        return TopicInfo(None, error=f"the broker answered error code {code}")
    ops = desc.get("authorized_operations")
    authorized = None if ops is None else frozenset(str(op).upper() for op in ops)
    return TopicInfo(len(desc.get("partitions") or []), authorized)


def describe(admin: Any, names: Sequence[str]) -> dict[str, TopicInfo]:
    """Ask the broker about ``names`` (one metadata request)."""
    info: dict[str, TopicInfo] = {}
    for desc in admin.describe_topics(list(names)):
        name = desc.get("name") or desc.get("topic")
        info[name] = _topic_info(desc)
    return info


def connect_checks(settings: Settings, timeout_s: float) -> list[Check]:
    """Connect with the settings' client configuration and run every check."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    servers = ",".join(settings.kafka.bootstrap_servers)
    config = settings.kafka.client_config()
    config["request_timeout_ms"] = min(config["request_timeout_ms"], int(timeout_s * 1000))
    kafka_log = logging.getLogger("kafka")
    level = kafka_log.level
    kafka_log.setLevel(logging.CRITICAL)  # connection retries are reported below, once
    try:
        try:
            admin = KafkaAdminClient(bootstrap_timeout_ms=int(timeout_s * 1000), **config)
        except KafkaError as exc:
            return [
                Check(
                    FAIL,
                    "brokers",
                    f"none answered at {servers} within {timeout_s:g}s ({exc}); check "
                    "kafka.bootstrap_servers, the network and the security settings",
                )
            ]
        try:
            cluster = admin.describe_cluster()
            brokers = len(cluster.get("brokers") or [])
            names = list(dict.fromkeys(name for _, name, _ in _roles(settings)))
            info = describe(admin, names)
            most_ms = _broker_max_transaction_ms(admin, cluster)
            limited = {need.topic for need in needs(settings.topics)} | {settings.topics.results}
            for setting, name, _ in _roles(settings):
                wanted = setting in STATISTICS_SETTINGS or name in limited
                if wanted and info.get(name, TopicInfo(None)).partitions:
                    info[name] = replace(info[name], configs=topic_configs(admin, name))
        except KafkaError as exc:
            return [Check(FAIL, "brokers", f"{servers} answered but then failed: {exc}")]
        finally:
            admin.close()
    finally:
        kafka_log.setLevel(level)
    head = Check(OK, "brokers", f"{brokers} broker(s) answered at {servers}")
    return [
        head,
        transaction_timeout_check(settings, most_ms),
        *layout_checks(settings, info),
        *record_size_checks(settings, info),
        *permission_checks(settings, info),
    ]


def record_size_checks(settings: Settings, info: Mapping[str, TopicInfo]) -> list[Check]:
    """Existing topics whose ``max.message.bytes`` is below the largest record evald writes to
    them (record_limits): `evald run` exits 2 at start, naming the same."""
    out = []
    stats = {name for setting, name, _ in _roles(settings) if setting in STATISTICS_SETTINGS}
    engine = settings.engine_config()
    statistics = [statistics_need(name, engine) for name in sorted(stats)]
    for need in [*needs(settings.topics), *statistics]:
        configs = info.get(need.topic, TopicInfo(None)).configs or {}
        try:
            limit = int(configs["max.message.bytes"])
        except (KeyError, ValueError):
            continue  # missing, or not reported: `evald run` checks it again
        problem = shortfall(need, limit)
        subject = f"{need.setting} {need.topic}"
        if problem is None:
            detail = f"max.message.bytes {limit}, at least the {need.need} evald's records need"
            out.append(Check(OK, subject, detail))
        else:
            out.append(Check(FAIL, subject, problem))
    return out + letter_room_check(settings, info)


def letter_room_check(settings: Settings, info: Mapping[str, TopicInfo]) -> list[Check]:
    """A note when the DLQ topic cannot take a result the results topic refuses whole: its
    letter is then truncated to fit, only the result's size and SHA-256 kept (evald creates the
    DLQ with the room, topics.dlq_limit)."""
    topics = settings.topics
    try:
        limits = [
            int((info[name].configs or {})["max.message.bytes"])
            for name in (topics.dlq, topics.results)
        ]
    except (KeyError, ValueError):
        return []
    dlq, results = limits
    if dlq >= results + RESULT_LETTER_ROOM:
        return []
    detail = (
        f"max.message.bytes {dlq} leaves no room for a result that {topics.results} "
        f"(max.message.bytes {results}) refuses: such a result is dead-lettered truncated, "
        "its size and SHA-256 kept. To keep it whole: kafka-configs.sh --alter --entity-type "
        f"topics --entity-name {topics.dlq} --add-config "
        f"max.message.bytes={results + RESULT_LETTER_ROOM} (or more)"
    )
    return [Check(NOTE, f"topics.dlq {topics.dlq}", detail)]
