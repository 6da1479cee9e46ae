"""The smallest max.message.bytes evald's checkpoint and DLQ topics need, and the check-config
lines that say so (the broker-side behaviour: test_kafka_misconfigured.py)."""

from __future__ import annotations

from evald.daemon.connect_check import FAIL, OK, TopicInfo, record_size_checks
from evald.daemon.dead_letters import SLACK_BYTES, build_letter, record_size
from evald.daemon.main.snapshots import CHUNK_BYTES, chunks
from evald.daemon.record_limits import CHECKPOINT_NEED, DLQ_NEED
from evald.daemon.settings import load_settings


def test_a_full_snapshot_chunk_under_its_longest_key_fits_the_checkpoint_need() -> None:
    (chunk, _) = chunks(b"\x7f" * (CHUNK_BYTES + 1))
    assert record_size(b"2147483647.statistics", chunk, []) + SLACK_BYTES == CHECKPOINT_NEED


def test_the_largest_headers_only_letter_fits_the_dlq_need() -> None:
    headers = [
        ("evald-reason", b"implausible_timestamp"),
        ("evald-detail", b"d" * 4096),  # the senders cut it there
        ("evald-source-topic", b"t" * 249),
        ("evald-source-partition", b"2147483647"),
        ("evald-source-offset", b"9223372036854775807"),
        ("evald-kind", b"impression"),
    ]
    letter = build_letter(b"k" * 5000, b"v" * 10_000_000, headers, DLQ_NEED)
    assert letter.truncated  # to fit, never below its headers (a reason under 64 bytes
    # and an original size of 8 digits leave room for a few bytes of the value)
    assert record_size(letter.key, letter.value, letter.headers) + SLACK_BYTES <= DLQ_NEED


def test_check_config_fails_a_checkpoint_topic_below_the_need_and_skips_unreported_limits() -> None:
    settings = load_settings(environ={}, flags={"topics": {"results": "res", "dlq": "dlq"}})
    info = {
        "res.checkpoints": TopicInfo(1, configs={"max.message.bytes": str(CHECKPOINT_NEED - 1)}),
        "dlq": TopicInfo(1, configs={"cleanup.policy": "delete"}),
    }
    (check,) = record_size_checks(settings, info)
    assert (check.status, check.subject) == (FAIL, "topics.checkpoints res.checkpoints")
    assert f"max.message.bytes={CHECKPOINT_NEED}" in check.detail
    info["res.checkpoints"] = TopicInfo(1, configs={"max.message.bytes": str(CHECKPOINT_NEED)})
    assert [c.status for c in record_size_checks(settings, info)] == [OK]


def test_a_full_share_record_fits_the_statistics_need() -> None:
    """CELLS_PER_RECORD sums of any value, at the widest key, under no labels."""
    import numpy as np

    from evald.daemon.record_limits import STATISTICS_NEED
    from evald.statistics.shares import CELLS_PER_RECORD, Share

    rng = np.random.default_rng(7)
    sums = rng.standard_normal((CELLS_PER_RECORD // 3, 3)) * 10.0 ** rng.integers(-300, 300, (1, 1))
    sums[0, 0] = -2.2250738585072014e-308
    share = Share(-(2**62), 2**62, 2**31 - 1, (((), sums),), chunk=999)
    assert record_size(share.key, share.encode(), []) + SLACK_BYTES <= STATISTICS_NEED


def test_check_config_fails_a_statistics_topic_below_a_full_share_record() -> None:
    from evald.daemon.record_limits import STATISTICS_NEED

    comparison = {"name": "ab", "label": "arm", "control": "c", "treatments": ["t"], "start": 0}
    statistics = {"comparisons": [comparison]}
    flags = {"topics": {"results": "res", "dlq": "dlq"}, "engine": {"statistics": statistics}}
    settings = load_settings(environ={}, flags=flags)
    name = "res.checkpoints.statistics"
    info = {name: TopicInfo(1, configs={"max.message.bytes": str(STATISTICS_NEED - 1)})}
    (check,) = record_size_checks(settings, info)
    assert (check.status, check.subject) == (FAIL, f"statistics topic {name}")


def test_check_config_notes_a_dlq_without_room_for_a_refused_result() -> None:
    """Kafka's default on both topics: a result the results topic refuses is dead-lettered
    truncated. A note, not a FAIL: evald runs, only that letter loses its value."""
    from evald.daemon.connect_check import NOTE
    from evald.daemon.record_limits import RESULT_LETTER_ROOM

    settings = load_settings(environ={}, flags={"topics": {"results": "res", "dlq": "dlq"}})
    info = {name: TopicInfo(1, configs={"max.message.bytes": "1048588"}) for name in ("res", "dlq")}
    checks = record_size_checks(settings, info)
    (note,) = [c for c in checks if c.status == NOTE]
    assert note.subject == "topics.dlq dlq"
    assert f"max.message.bytes={1048588 + RESULT_LETTER_ROOM}" in note.detail
    info["dlq"] = TopicInfo(1, configs={"max.message.bytes": str(1048588 + RESULT_LETTER_ROOM)})
    assert all(c.status == OK for c in record_size_checks(settings, info))
