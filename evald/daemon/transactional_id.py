"""The transactional ids of evald's producers, one per (group, instance, stage).

Two unrelated deployments must never share an id: the broker would let each fence the other's
transactions. Joining the parts with a separator that may also occur inside them is ambiguous
(group ``g-a`` with instance ``b`` and group ``g`` with instance ``a-b``), so each part is
escaped first: ``%`` and ``/`` become ``%25`` and ``%2F``, and the parts are joined by ``/``.
Group and instance ids rarely hold either, so ids read as they are written
(``evald/evald-prod/evald-0``) and ``kafka-transactions.sh --list | grep evald-prod`` finds them.
The repartition stage appends one more part (``…/repartition``); an id's number of unescaped
``/`` tells the stages apart, so no instance id can take another instance's stage id.
"""

from __future__ import annotations

PREFIX = "evald"
REPARTITION_STAGE = "repartition"


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


def transactional_id(group_id: str, instance_id: str, *, repartition: bool = False) -> str:
    """The ``transactional.id`` of instance ``instance_id`` in ``group_id``: the main stage's,
    or with ``repartition`` the repartition stage's (docs/daemon.md, "Transactional ids")."""
    parts = [PREFIX, _escape(group_id), _escape(instance_id)]
    if repartition:
        parts.append(REPARTITION_STAGE)
    return "/".join(parts)
