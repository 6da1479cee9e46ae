"""Dead letters that always fit the DLQ topic.

A record rejected as ``too_large`` can be as large as the input topic allows, and its dead
letter (the original bytes plus evald's headers) is then larger than the DLQ topic, or the
producer, accepts. Such a letter is written truncated: its value is cut so that the whole
record fits, and headers keep what is needed to find and verify the original (its size, a
SHA-256 of it, and the source coordinates every letter carries). A letter that the broker
rejects all the same is written once more as headers only (``minimal``), see docs/design.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "Letter", "build_letter", "max_message_bytes"]

#: Kafka's default ``message.max.bytes`` (broker) and ``max.message.bytes`` (topic)
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
#: room left under the limit for what the size estimate does not see (varint widths)
SLACK_BYTES = 64
#: the longest key kept on a truncated letter (keys are request ids)
MAX_TRUNCATED_KEY = 1024

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Letter:
    """One dead letter ready for ``producer.send``."""

    key: bytes | None
    value: bytes
    headers: Headers
    truncated: bool


def record_size(key: bytes | None, value: bytes, headers: Headers) -> int:
    """Bytes one record takes in a batch of its own, as the producer counts them."""
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers))


def build_letter(
    key: bytes | None, value: bytes, headers: Headers, limit: int, *, minimal: bool = False
) -> Letter:
    """The letter for ``value`` with ``headers``, truncated to fit ``limit`` bytes if needed.

    A truncated (or ``minimal``: value dropped) letter gets ``evald-original-size`` (bytes of
    the original value), ``evald-original-sha256`` (hex) and ``evald-truncated`` (bytes kept);
    a key longer than 1 KiB is cut too, with ``evald-original-key-size``.
    """
    if not minimal and record_size(key, value, headers) + SLACK_BYTES <= limit:
        return Letter(key, value, headers, truncated=False)
    extra: Headers = [
        ("evald-original-size", str(len(value)).encode()),
        ("evald-original-sha256", hashlib.sha256(value).hexdigest().encode()),
    ]
    if key is not None and len(key) > MAX_TRUNCATED_KEY:
        extra.append(("evald-original-key-size", str(len(key)).encode()))
        key = key[:MAX_TRUNCATED_KEY]
    # the kept length is written last; its digits are counted at their widest
    fixed = record_size(key, b"", [*headers, *extra, ("evald-truncated", b"0" * 10)])
    keep = 0 if minimal else max(0, min(len(value), limit - SLACK_BYTES - fixed))
    extra.append(("evald-truncated", str(keep).encode()))
    return Letter(key, value[:keep], [*headers, *extra], truncated=True)


def max_message_bytes(admin: Any, topic: str) -> int:
    """The topic's ``max.message.bytes``; Kafka's default when the broker does not say (tansu
    answers with no configs) or the topic does not exist yet."""
    from kafka.admin import ConfigResource, ConfigResourceType

    try:
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"
        )
    except Exception:  # an old broker, no DescribeConfigs ACL: the default is the honest guess
        return DEFAULT_MAX_MESSAGE_BYTES
    entries = (described or {}).get("topic", {}).get(topic) or {}
    entry = entries.get("max.message.bytes")
    value = entry.get("value") if isinstance(entry, dict) else entry
    try:
        return int(value) if value is not None else DEFAULT_MAX_MESSAGE_BYTES
    except (TypeError, ValueError):
        return DEFAULT_MAX_MESSAGE_BYTES
