"""`evald produce` against what a real broker accepts and holds in event time: the timestamp
limit (message.timestamp.after.max.ms), a record the broker refuses, and a second run after a
first one that ran ahead of the wall clock."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
from kafka_harness import ENGINE, Broker, KafkaTools

from evald.config import load_config
from evald.daemon.produce import Horizon, _start_time
from evald.daemon.topic_time import (
    DEFAULT_AFTER_MAX_MS,
    SENT_HEADER,
    TimestampLimit,
    TopicsEnd,
    sent_at,
)

ROOT = Path(__file__).resolve().parents[2]


def _produce(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evald", "produce", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _create(bootstrap: str, topics: list[str], configs: dict[str, str]) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(t, 2, 1, topic_configs=configs) for t in topics])
    finally:
        admin.close()


@pytest.mark.kafka
def test_a_burst_stays_within_the_brokers_timestamp_limit_and_loses_nothing(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """Topics that accept timestamps at most 4 s ahead: a burst spanning 6 s of event time
    sends what is within the limit at once and the rest as the wall clock catches up, and
    every record is acknowledged (before: the broker refused the records past the limit and
    produce said they were written)."""
    imp, fb = f"limp-{unique}", f"lfb-{unique}"
    _create(broker.bootstrap, [imp, fb], {"message.timestamp.after.max.ms": "4000"})
    began = time.time() * 1000
    proc = _produce(
        "--bootstrap-servers", broker.bootstrap, "--impressions-topic", imp,
        "--feedback-topic", fb, "--events", "6000", "--rate", "1000", "--speed", "1",
        "--clean", "--seed", "4",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "message.timestamp.after.max.ms = 4s; topic" in proc.stderr
    assert "from here on it advances with the wall clock" in proc.stderr
    assert "6,000 acknowledged by the broker" in proc.stderr.splitlines()[-1], proc.stderr
    records = kafka_tools.read(imp) + kafka_tools.read(fb)
    assert len(records) == 6000
    # each record left within the limit: 3 s ahead of the wall clock at most (4 s less 1 s)
    assert max(r.timestamp for r in records) <= time.time() * 1000 + 3_000
    assert min(r.timestamp for r in records) >= began


@pytest.mark.kafka
def test_a_refused_record_stops_the_run_saying_what_the_broker_said_and_what_to_do(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """Topics that refuse records stamped more than a minute in the past, and a --start a year
    back: the broker refuses every record; produce stops, exit 1, with the broker's error, the
    topic's limits and what to do (before: exit 0, "written")."""
    imp, fb = f"rimp-{unique}", f"rfb-{unique}"
    _create(broker.bootstrap, [imp, fb], {"message.timestamp.before.max.ms": "60000"})
    proc = _produce(
        "--bootstrap-servers", broker.bootstrap, "--impressions-topic", imp,
        "--feedback-topic", fb, "--events", "3000", "--start", "2025-11-01T00:00:00Z",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Timestamp 1761955200" in proc.stderr and "is out of range" in proc.stderr  # Kafka's
    assert "message.timestamp.before.max.ms = 1m" in proc.stderr
    assert "--realtime --speed 1" in proc.stderr and "Traceback" not in proc.stderr
    assert "; 0 acknowledged" in proc.stderr
    assert kafka_tools.read(imp) == [] and kafka_tools.read(fb) == []


@pytest.mark.kafka
def test_a_start_further_ahead_than_the_broker_accepts_is_refused_up_front(
    broker: Broker, unique: str
) -> None:
    imp, fb = f"simp-{unique}", f"sfb-{unique}"
    _create(broker.bootstrap, [imp, fb], {})
    ahead = int(time.time() * 1000) + 2 * DEFAULT_AFTER_MAX_MS
    proc = _produce(
        "--bootstrap-servers", broker.bootstrap, "--impressions-topic", imp,
        "--feedback-topic", fb, "--events", "10", "--start", str(ahead),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "message.timestamp.after.max.ms = 1h; topic" in proc.stderr
    assert "Give an earlier --start" in proc.stderr


@pytest.mark.kafka
def test_a_second_run_goes_on_after_the_first_and_none_of_its_records_is_late(
    broker: Broker, kafka_tools: KafkaTools, unique: str
) -> None:
    """The first run's event time runs minutes ahead of the wall clock; the second starts
    where the topics end, so the engine (as `evald run` feeds it) scores none of its
    impressions as late and its means match the first run's (before: it started at "now",
    behind the watermark, and its first impressions closed at once without their feedback)."""
    imp, fb = f"cimp-{unique}", f"cfb-{unique}"
    common = ["--bootstrap-servers", broker.bootstrap, "--impressions-topic", imp,
              "--feedback-topic", fb, "--events", "12000", "--clean"]  # fmt: skip
    first = _produce(*common, "--run-id", "first", "--seed", "1")
    assert first.returncode == 0, first.stderr
    second = _produce(*common, "--run-id", "second", "--seed", "2")
    assert second.returncode == 0, second.stderr
    assert "going on from there" in second.stderr
    records = kafka_tools.read(imp) + kafka_tools.read(fb)
    runs = {
        name: [r.timestamp for r in records if r.key.startswith(name.encode() + b"-")]
        for name in ("first", "second")
    }
    assert len(runs["first"]) + len(runs["second"]) == 24_000
    assert min(runs["second"]) > max(runs["first"])

    config = load_config(**ENGINE)
    results, engine = kafka_tools.expected(config, imp, fb)
    engine.drain()
    assert engine.stats.finalized["late"] == 0
    ndcg: dict[str, list[float]] = {"first": [], "second": []}
    for request_id, result in results.items():
        ndcg[request_id.split("-")[0]].append(result["measures"]["nDCG@10"])
    assert min(len(v) for v in ndcg.values()) > 1000
    assert np.mean(ndcg["second"]) == pytest.approx(np.mean(ndcg["first"]), abs=0.05)


def test_the_horizon_holds_a_record_until_the_wall_clock_catches_up() -> None:
    wall = [1_000_000]
    stream = io.StringIO()
    limit = TimestampLimit(60_000, None, "topic t")
    horizon = Horizon(limit, Namespace(realtime=True), wall_ms=lambda: wall[0], stream=stream)
    assert limit.headroom_ms() == 6_000
    assert horizon.hold(1_000_000 + 54_000) == 0.0
    assert stream.getvalue() == ""
    assert horizon.hold(1_000_000 + 56_000) == pytest.approx(2.0)
    assert "--speed 1 keeps event time at the wall clock" in stream.getvalue()
    wall[0] += 2_000
    assert horizon.hold(1_000_000 + 56_000) == 0.0
    assert stream.getvalue().count("\n") == 1  # said once
    unlimited = Horizon(TimestampLimit(None, None, "t"), Namespace(realtime=False))
    assert unlimited.hold(10**15) == 0.0


def test_the_start_is_now_or_after_the_topics_records() -> None:
    limit = TimestampLimit(DEFAULT_AFTER_MAX_MS, None, "Kafka's default")
    now = 1_800_000_000_000
    assert _start_time(None, None, limit, now) == now
    assert _start_time(None, TopicsEnd(now - 5_000, None), limit, now) == now  # in the past
    assert _start_time(None, TopicsEnd(now + 600_000, None), limit, now) == now + 600_001
    # the topics end at the limit already: this run starts at the limit
    end = TopicsEnd(now + DEFAULT_AFTER_MAX_MS, None)
    assert _start_time(None, end, limit, now) == now + 3_540_000
    # --start is kept (with a warning)
    assert _start_time(now - 10, TopicsEnd(now, None), limit, now) == now - 10
    assert _start_time(now + DEFAULT_AFTER_MAX_MS, None, limit, now) is None


def test_the_start_goes_on_by_the_time_the_topics_were_quiet() -> None:
    """`evald run`'s idle fallback moves its watermark on with the wall clock while its inputs
    are quiet: a run 12 minutes after the last one, started where the topics end, had its first
    12 minutes of event time late (scored at once, their feedback orphaned)."""
    limit = TimestampLimit(DEFAULT_AFTER_MAX_MS, None, "Kafka's default")
    now = 1_800_000_000_000
    sent_12_min_ago = now - 720_000
    end = TopicsEnd(now + 600_000, sent_12_min_ago)  # 22 minutes ahead when it was sent
    assert _start_time(None, end, limit, now) == now + 1_320_001
    # the topics end in the past, but evald run's watermark is still 5 minutes ahead of now
    assert _start_time(None, TopicsEnd(now - 60_000, now - 360_000), limit, now) == now + 300_001
    # written just now: where the topics end, as before
    assert _start_time(None, TopicsEnd(now + 600_000, now), limit, now) == now + 600_001


def test_the_sent_header_is_read_when_it_is_digits() -> None:
    assert sent_at([("other", b"1"), (SENT_HEADER, b"1800000000000")]) == 1_800_000_000_000
    assert sent_at([(SENT_HEADER, b"soon")]) is None
    assert sent_at(None) is None
