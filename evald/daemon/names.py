"""Every name the daemon derives from the names it is given: transactional ids, the
repartition stage's group and member id, its internal topics, the checkpoint topic's default
and the statistics topic.

Pure functions of strings, so the settings can check the names before anything starts and the
stages use the same ones, without the settings importing a stage (docs/daemon.md,
"Transactional ids"; docs/design.md, "Topics keyed any way").

Transactional ids: two unrelated deployments must never share one, or the broker would let each
fence the other's transactions. Joining the parts with a separator that may also occur inside
them is ambiguous (group ``g-a`` with instance ``b`` and group ``g`` with instance ``a-b``), so
each part is escaped first: ``%`` and ``/`` become ``%25`` and ``%2F``, and the parts are joined
by ``/``. Group and instance ids rarely hold either, so ids read as they are written
(``evald/evald-prod/evald-0``) and ``kafka-transactions.sh --list | grep evald-prod`` finds them.
The repartition stage appends one more part (``…/repartition``); an id's number of unescaped
``/`` tells the stages apart, so no instance id can take another instance's stage id.
"""

from __future__ import annotations

__all__ = [
    "INTERNAL_SUFFIX",
    "REPARTITION_SUFFIX",
    "checkpoint_topic",
    "internal_topic",
    "repartition_group",
    "repartition_member",
    "statistics_topic",
    "transactional_id",
]

PREFIX = "evald"
REPARTITION_STAGE = "repartition"
#: the internal topic of input topic ``t`` read by consumer group ``g`` is ``g.t`` + this suffix
INTERNAL_SUFFIX = ".evald-repartition"
#: the repartition stage's static member id is the instance's plus this, in its own group
#: (:func:`repartition_group`, docs/daemon.md)
REPARTITION_SUFFIX = "-repartition"


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


def transactional_id(group_id: str, instance_id: str, *, repartition: bool = False) -> str:
    """The ``transactional.id`` of instance ``instance_id`` in ``group_id``: the main stage's,
    or with ``repartition`` the repartition stage's (docs/daemon.md, "Transactional ids")."""
    parts = [PREFIX, _escape(group_id), _escape(instance_id)]
    if repartition:
        parts.append(REPARTITION_STAGE)
    return "/".join(parts)


def repartition_group(group_id: str) -> str:
    """The consumer group the repartition stage of group ``group_id`` reads the inputs in."""
    return f"{group_id}.repartition"


def repartition_member(instance_id: str) -> str:
    """The repartition stage's static member id in its own group (:func:`repartition_group`)."""
    return instance_id + REPARTITION_SUFFIX


def internal_topic(group_id: str, topic: str) -> str:
    """The internal topic the daemon of consumer group ``group_id`` re-keys ``topic`` into.

    The group is part of the name because the copies are one group's reading of the input: a
    daemon started with a new group reads the input again from its start, and writing that
    into the old group's internal topics would put every record there twice."""
    return f"{group_id}.{topic}{INTERNAL_SUFFIX}"


def checkpoint_topic(results: str, checkpoints: str | None) -> str:
    """The checkpoint topic: ``checkpoints`` when given, else ``<results>.checkpoints``."""
    return checkpoints or f"{results}.checkpoints"


def statistics_topic(checkpoint_topic: str) -> str:
    """``<checkpoint topic>.statistics``: the shares belong with the checkpoints that hold the
    open ones, so the two are kept, reset and deleted together."""
    return f"{checkpoint_topic}.statistics"
