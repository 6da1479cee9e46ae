"""The smallest max.message.bytes evald's checkpoint and DLQ topics need, and the check-config
lines that say so (the broker-side behaviour: test_kafka_misconfigured.py)."""

from __future__ import annotations

from typing import Any

import pytest

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


AB = {"name": "ab", "label": "arm", "control": "c", "treatments": ["t"], "start": 0}
#: a code point JSON escapes as two surrogates: 12 bytes for one character
WIDE = "\U0010ffff"


def _engine(**engine: Any) -> Any:
    from evald.config import load_config

    return load_config(engine)


@pytest.mark.parametrize(
    ("measures", "replicates", "keys", "longest", "segments"),
    [
        (1, 0, ["arm"], 8, 5000),  # the most segments, rows and brackets a record holds
        (5, 1198, ["arm"], 512, 3),  # one segment's row fills a record
        (7, 100, ["model", "arm", "surface"], 512, 200),  # the defaults
        (2, 10, ["model", "arm", "surface"], 512, 2000),  # cut by the labels' bytes
        (3, 50, ["model", "arm"], 20_000, 3),  # one segment's labels past 256 KiB
    ],
)
def test_share_records_cut_as_freeze_cuts_them_fit_the_statistics_need(
    measures: int, replicates: int, keys: list[str], longest: int, segments: int
) -> None:
    """Widest floats, labels of the longest values with every character escaped at its
    widest, at the widest key: each record fits. Before, the need left the labels out (and
    one segment of many replicates), so a topic it passed refused such records."""
    import numpy as np

    from evald.daemon.record_limits import statistics_bytes
    from evald.statistics.clustered import row_width
    from evald.statistics.shares import CELLS_PER_RECORD, Share, _label_bytes, pieces

    names = ["nDCG@10", "RR", "P@10", "R@10", "AP@10", "Success@10", "nDCG@5"][:measures]
    stats = {"bootstrap_replicates": replicates, "comparisons": [AB]}
    limits = {"max_string_length": longest}
    drill = {"max_query_length": min(longest, 100)}
    engine = _engine(
        measures=names, label_keys=keys, limits=limits, statistics=stats, drilldown=drill
    )
    need = statistics_bytes(engine)
    columns = row_width(replicates)
    rows = np.full((measures, columns), -2.2250738585072014e-308)
    items = [
        (tuple((key, (WIDE * longest)[: longest - 6] + f"{i:06d}") for key in keys), rows)
        for i in range(segments)
    ]
    step = max(1, CELLS_PER_RECORD // (columns * measures))
    records = pieces(items, step, _label_bytes)
    for chunk, piece in enumerate(records):
        share = Share(-(2**62), 2**62, 2**31 - 1, piece, chunk=2**31 - 1)
        assert record_size(share.key, share.encode(), []) + SLACK_BYTES <= need, chunk


@pytest.mark.parametrize(("replicates", "cells"), [(0, 2500), (5997, 2), (100, 300)])
def test_credit_records_fit_the_statistics_need(replicates: int, cells: int) -> None:
    """The interleaving credit shares, team names and segment values at their widest."""
    import numpy as np

    from evald.daemon.record_limits import statistics_bytes
    from evald.interleaving.shares import COUNTS, NUMBERS_PER_RECORD, CreditShare, _label_bytes
    from evald.interleaving.sums import PairSums
    from evald.statistics.shares import pieces

    engine = _engine(
        label_keys=["arm"],
        interleaving={"teams": ["a", "b"]},
        statistics={"bootstrap_replicates": replicates},
    )
    need = statistics_bytes(engine)
    reps = np.full(replicates, -2.2250738585072014e-308) if replicates else None
    big = 2**62
    sums = PairSums(big, big, big, big, big, big, reps, reps)
    team = WIDE * 512
    items = [(((f"{i:06d}" + WIDE * 506,), team, team), sums) for i in range(cells)]
    step = max(1, NUMBERS_PER_RECORD // (len(COUNTS) + 2 * replicates))
    for chunk, piece in enumerate(pieces(items, step, _label_bytes)):
        share = CreditShare(-(2**62), 2**62, 2**31 - 1, piece, 2**31 - 1)
        assert record_size(share.key, share.encode(), []) + SLACK_BYTES <= need, chunk


def test_check_config_fails_a_statistics_topic_the_settings_records_would_not_fit() -> None:
    """A statistics topic at the old need (308,340 bytes: the numbers of a record, labels left
    out) passed, then refused a record holding labels in every session; the need follows the
    settings: labels of long values raise it past Kafka's default."""
    from evald.daemon.record_limits import statistics_bytes

    def checks(limit: int, **engine: Any) -> tuple[str, str]:
        flags = {"topics": {"results": "res", "dlq": "dlq"}, "engine": engine}
        settings = load_settings(environ={}, flags=flags)
        name = "res.checkpoints.statistics"
        info = {name: TopicInfo(1, configs={"max.message.bytes": str(limit)})}
        (check,) = record_size_checks(settings, info)
        assert check.subject == f"statistics topic {name}"
        return check.status, check.detail

    statistics = {"comparisons": [AB]}
    need = statistics_bytes(_engine(statistics=statistics))
    assert need > 308_340 + 200_000  # a record's numbers and its labels' 256 KiB
    status, detail = checks(308_340, statistics=statistics)
    assert status == FAIL and f"max.message.bytes={need}" in detail
    assert checks(need - 1, statistics=statistics)[0] == FAIL
    assert checks(need, statistics=statistics)[0] == OK
    assert checks(1048588, statistics=statistics)[0] == OK
    # three label values of 100,000 characters: one segment's labels are 3.6 MB, never cut
    long = {"statistics": statistics, "limits": {"max_string_length": 100_000}}
    status, detail = checks(1048588, **long)
    assert status == FAIL and 3_600_000 < statistics_bytes(_engine(**long)) < 4_000_000
    # more replicates widen a record's rows: fewer brackets, the need follows
    more = {"statistics": {**statistics, "bootstrap_replicates": 800}}
    assert statistics_bytes(_engine(**more)) != need


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


def test_the_table_of_needs_in_docs_daemon_md_is_what_evald_checks() -> None:
    from pathlib import Path

    from evald.daemon.record_limits import statistics_bytes

    doc = (Path(__file__).resolve().parents[2] / "docs" / "daemon.md").read_text()
    rows = [line for line in doc.splitlines() if "`record_limits." in line or "CHUNK_BYTES" in line]
    assert any(row.endswith(f"| {CHECKPOINT_NEED} |") for row in rows)
    assert any(row.endswith(f"| {DLQ_NEED} |") for row in doc.splitlines())
    need = statistics_bytes(_engine(statistics={"comparisons": [AB]}))
    assert any(f"| {need} with the default settings" in row for row in rows)
