"""What evald's principal must be allowed to do on each Kafka resource, and what to tell the
operator when the broker denies it.

Why one module: `evald check-config --connect` reports the operations missing on each topic from
what the broker says the principal may do (KIP-430's authorized operations); `evald run` refuses
to start on the same finding, and when the broker denies a request while it runs (an ACL
removed) it exits 2 with the same words: the resource, the operation, and the `kafka-acls.sh`
command that grants it. No retry grants an ACL, and a daemon that kept retrying would look
alive while it wrote nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kafka.errors import (
    AuthorizationError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)

from evald.daemon.main.comparisons import publishes_statistics, statistics_topic
from evald.daemon.names import transactional_id
from evald.daemon.settings import Settings

__all__ = [
    "Need",
    "acl_command",
    "denied_topics",
    "explain_denial",
    "missing",
    "principal",
    "topic_denied",
    "topic_needs",
    "unauthorized",
]

#: the operations as `kafka-acls.sh --operation` spells them
_SPELLING = {"DESCRIBE": "Describe", "READ": "Read", "WRITE": "Write", "DELETE": "Delete"}


@dataclass(frozen=True)
class Need:
    """The operations evald needs on one topic, and why (said when one is denied)."""

    setting: str
    topic: str
    operations: tuple[str, ...]
    why: str


#: the settings that make `evald run` write and fold the statistics topic (the first named
#: when both are set)
STATISTICS_SETTINGS = ("statistics.comparisons", "interleaving.teams")


def topic_needs(settings: Settings) -> list[Need]:
    """The topics the main stage of `evald run` reads and writes, with the operations each
    needs: the inputs as ``settings`` names them (with ``input.repartition`` the main stage's
    settings name the internal topics), results, checkpoints, the DLQ and, with comparisons,
    the statistics topic."""
    topics = settings.topics
    read = ("DESCRIBE", "READ")
    write_back = ("DESCRIBE", "READ", "WRITE")
    needs = [
        Need("topics.impressions", topics.impressions, read, "evald consumes it"),
        Need("topics.feedback", topics.feedback, read, "evald consumes it"),
        Need(
            "topics.results",
            topics.results,
            write_back,
            "evald writes the results and reads them back when it restores a partition",
        ),
        Need(
            "topics.checkpoints",
            topics.checkpoint_topic,
            write_back,
            "evald writes its checkpoints there and restores partitions from them",
        ),
        Need("topics.dlq", topics.dlq, ("DESCRIBE", "WRITE"), "evald writes rejected records"),
    ]
    engine = settings.engine_config()
    if publishes_statistics(engine):
        compares = bool(engine.statistics.comparisons)
        needs.append(
            Need(
                STATISTICS_SETTINGS[0] if compares else STATISTICS_SETTINGS[1],
                statistics_topic(topics),
                write_back,
                "evald writes every partition's comparison (and interleaving credit) shares and "
                "folds them",
            )
        )
    return needs


def principal(settings: Settings) -> str:
    """The principal the broker sees evald as (as `kafka-acls.sh` writes it)."""
    kafka = settings.kafka
    if kafka.security_protocol.startswith("SASL"):
        return f"User:{kafka.sasl_username}"
    if kafka.security_protocol == "SSL" and kafka.ssl_certfile:
        return "User:<the distinguished name of evald's client certificate>"
    return "User:ANONYMOUS"


def _spelt(operations: Iterable[str]) -> list[str]:
    return [_SPELLING.get(op, op.title()) for op in operations]


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def acl_command(settings: Settings, resource: str, operations: Iterable[str]) -> str:
    """The `kafka-acls.sh` line that grants ``operations`` on ``resource`` (its flags, e.g.
    ``--topic NAME``) to evald's principal."""
    ops = " ".join(f"--operation {op}" for op in _spelt(operations))
    server = settings.kafka.bootstrap_servers[0]
    return (
        f"kafka-acls.sh --bootstrap-server {server} --add --allow-principal "
        f"'{principal(settings)}' {ops} {resource}"
    )


#: the note every denial ends with: a grant does not undo an explicit DENY ACL
_DENY_WINS = "; a DENY ACL overrides any grant (`kafka-acls.sh --list` shows them)"


def topic_denied(settings: Settings, need: Need, operations: tuple[str, ...]) -> str:
    """The message for ``operations`` of ``need`` denied on its topic."""
    return (
        f"the broker denies evald's principal ({principal(settings)}) "
        f"{_listed(_spelt(operations))} on topic {need.topic} ({need.setting}: {need.why}); "
        f"grant {'it' if len(operations) == 1 else 'them'}: "
        f"{acl_command(settings, f'--topic {need.topic}', operations)}{_DENY_WINS}"
    )


def missing(need: Need, authorized: frozenset[str] | None) -> tuple[str, ...]:
    """The operations of ``need`` outside ``authorized`` (None: the broker did not say, so
    nothing is known to be missing)."""
    if authorized is None:
        return ()
    return tuple(op for op in need.operations if op not in authorized)


def unauthorized(settings: Settings, authorized: Mapping[str, frozenset[str] | None]) -> list[str]:
    """One message per topic missing an operation evald needs. ``authorized`` maps each
    existing topic to the operations the broker reported (an empty set: it refused to
    describe the topic; None: it did not report them); absent topics are not judged."""
    out = []
    for need in topic_needs(settings):
        if need.topic in authorized:
            lacking = missing(need, authorized[need.topic])
            if lacking:
                out.append(topic_denied(settings, need, lacking))
    return out


def denied_topics(error: BaseException) -> set[str]:
    """The topics a ``TopicAuthorizationFailedError`` names (kafka-python passes them as a set
    argument; otherwise the quoted names of its message)."""
    names: set[str] = set()
    for arg in error.args:
        if isinstance(arg, set | frozenset | list | tuple):
            names.update(str(name) for name in arg)
    return names or set(re.findall(r"'([^']+)'", str(error)))


def explain_denial(
    settings: Settings,
    error: AuthorizationError,
    authorized: Mapping[str, frozenset[str] | None] | None = None,
) -> str:
    """What to grant after the broker refused a request with ``error``; ``authorized``: the
    operations it reports per topic now (:func:`unauthorized`), when they could be asked."""
    name = type(error).__name__
    if isinstance(error, TopicAuthorizationFailedError):
        named = denied_topics(error)
        needs = [need for need in topic_needs(settings) if need.topic in named]
        said = [
            topic_denied(
                settings,
                need,
                missing(need, (authorized or {}).get(need.topic)) or need.operations,
            )
            for need in needs
        ]
        if said:
            return f"{name}: " + "; and ".join(said)
    if isinstance(error, GroupAuthorizationFailedError):
        group = settings.daemon.group_id
        return (
            f"{name}: the broker denies evald's principal ({principal(settings)}) Read on its "
            f"consumer group {group} (daemon.group_id); grant it: "
            f"{acl_command(settings, f'--group {group}', ['READ'])}{_DENY_WINS}"
        )
    if isinstance(error, TransactionalIdAuthorizationFailedError):
        prefix = transactional_id(settings.daemon.group_id, "")
        mine = settings.daemon.transactional_id()
        resource = f"--transactional-id '{prefix}' --resource-pattern-type prefixed"
        return (
            f"{name}: the broker denies evald's principal ({principal(settings)}) Write on "
            f"its transactional id {mine}; grant Write and Describe on the ids of the group "
            f"(prefix {prefix}): {acl_command(settings, resource, ['WRITE', 'DESCRIBE'])}"
            f"{_DENY_WINS}"
        )
    return (
        f"the broker denied an operation ({name}: {error}): grant evald's principal "
        f"({principal(settings)}) Read on both input topics; Describe, Read and Write on the "
        "results and checkpoint topics; Describe and Write on the dead-letter topic; Read on "
        "its consumer group; Write and Describe on its transactional id "
        f"({settings.daemon.transactional_id()}); see docs/daemon.md"
    )
