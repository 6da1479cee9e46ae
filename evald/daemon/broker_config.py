"""One integer setting of a topic or a broker as DescribeConfigs answers it, or None.

Shared by what reads a limit the broker enforces (a topic's ``max.message.bytes``, a broker's
``transaction.max.timeout.ms``), so that the answer is read one way and the same failures
mean "the broker does not say": kafka-python's ``KafkaError`` (no DescribeConfigs
permission, an old broker, a timeout, a connection lost) and ``ValueError`` (a broker id it
cannot read). Anything else is a bug in evald or kafka-python and is raised, not turned into
a guess that then looks like the broker's answer.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["described", "described_int"]


def described(admin: Any, kind: Literal["topic", "broker"], name: str) -> dict[str, str] | None:
    """Every config of the topic or broker ``name`` that has a value, as strings; None when
    the broker does not say (see the module doc) or answers none (tansu)."""
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.errors import KafkaError

    resource = ConfigResource(ConfigResourceType[kind.upper()], name)
    try:
        answer = admin.describe_configs([resource], config_filter="all")
    except (KafkaError, ValueError):
        return None
    entries = (answer or {}).get(kind, {}).get(name) or {}
    out = {}
    for key, entry in entries.items():
        value = entry.get("value") if isinstance(entry, dict) else entry  # kafka-python: either
        if value is not None:
            out[key] = str(value)
    return out or None


def described_int(admin: Any, kind: Literal["topic", "broker"], name: str, key: str) -> int | None:
    """``key`` of the topic or broker ``name``; None when the broker does not say (see the
    module doc), has no such key (tansu answers no configs) or no integer there."""
    value = (described(admin, kind, name) or {}).get(key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
