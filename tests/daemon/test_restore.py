"""The restore protocol (evald.daemon.main.restore.Restorer) on fake Kafka clients and a real
engine: where a partition resumes, and every kind of saved state it refuses with exit 2 and
what to do (the same cases run through `evald run` on Apache Kafka in test_kafka_restore.py)."""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Any

import pytest
from fake_reader import FakeGroupConsumer, FakeReader, Log
from kafka import TopicPartition
from settable_clock import SettableClock

from evald.config import load_config
from evald.daemon.fatal import Fatal
from evald.daemon.main.checkpoint import Checkpoint, ResultRange, SnapshotRef
from evald.daemon.main.inputs import Inputs
from evald.daemon.main.restore import Restorer
from evald.daemon.settings import load_settings
from evald.daemon.topics import TopicGuard
from evald.decode import time_in_words
from evald.engine import Engine
from evald.join.clock import EventTimes

TOPICS = {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"}
CKPT = "res.checkpoints"
STATISTICS_TOPIC = "res.checkpoints.statistics"
NOW_MS = 1_763_683_200_000  # the engine's wall clock
ENGINE = {"window": "1m", "lateness": "10s", "windows": ["5m"], "retention": "2h"}


def tp(topic: str, p: int = 0) -> TopicPartition:
    return TopicPartition(topic, p)


def checkpoint(p: int = 0, **fields: Any) -> Checkpoint:
    doc: dict[str, Any] = {
        "partition": p,
        "watermark": NOW_MS - 60_000,
        "committed": {"impression": 2, "feedback": 1},
        "consumed": {"impression": 4, "feedback": 3},
        "event_times": EventTimes(NOW_MS - 50_000),
    }
    doc.update(fields)
    return Checkpoint.of(**doc)


def result(rid: str) -> bytes:
    ts = NOW_MS - 120_000
    return json.dumps({"request_id": rid, "ts": ts, "labels": {}, "measures": {"RR": 1.0}}).encode()


class Cluster:
    """The topics of one partition (or more) and the group's offsets, as a restore finds them."""

    def __init__(self, partitions: int = 1, engine: dict[str, Any] | None = None) -> None:
        self.clock = SettableClock()
        self.logs: dict[TopicPartition, Log] = {}
        for p in range(partitions):
            self.logs[tp("imp", p)] = {o: (b"k", b"{}") for o in range(5)}
            self.logs[tp("fb", p)] = {o: (b"k", b"{}") for o in range(5)}
            self.logs[tp("res", p)] = {}
            self.logs[tp(CKPT, p)] = {}
        self.offsets: dict[TopicPartition, int] = {}
        self.starts: dict[TopicPartition, int] = {}
        self.listed_ends: dict[TopicPartition, int] = {}
        self.committed_view: dict[TopicPartition, Log] | None = None  # read_committed's view
        self.config = load_config({**ENGINE, **(engine or {})})

    def save(
        self, cp: Checkpoint, *, commit: bool = True, at: int | None = None, p: int | None = None
    ) -> int:
        """Append ``cp`` to checkpoint partition ``p`` (default: its own), and with ``commit``
        commit the group's offsets as a transaction would."""
        p = cp.partition if p is None else p
        log = self.logs[tp(CKPT, p)]
        offset = at if at is not None else max(log, default=-1) + 1
        log[offset] = (str(p).encode(), cp.encode())
        if commit:
            self.offsets[tp(CKPT, p)] = offset + 1
            self.offsets[tp("imp", p)] = cp.committed.get("impression", 0)
            self.offsets[tp("fb", p)] = cp.committed.get("feedback", 0)
        return offset

    def restore(
        self,
        partitions: list[int] | None = None,
        statistics_id: str | None = None,
        verify_topics: Any = lambda: None,
    ) -> tuple[Engine, Inputs]:
        settings = load_settings(
            environ={},
            flags={"topics": TOPICS, "daemon": {"group_id": "g"}, "engine": ENGINE},
        )
        engine = Engine(self.config, clock=lambda: NOW_MS / 1000)
        inputs = Inputs("imp", "fb", self.clock, 2.0)
        inputs.connect(FakeGroupConsumer())  # type: ignore[arg-type]
        ps = partitions or [0]
        inputs.assign(set(ps))
        consumer = FakeGroupConsumer(self.offsets)
        reader = FakeReader(self.logs, self.clock, starts=self.starts, listed_ends=self.listed_ends)
        committed = self.committed_view if self.committed_view is not None else self.logs
        guard = TopicGuard(settings, self.clock, STATISTICS_TOPIC)
        guard.statistics_id = statistics_id
        restorer = Restorer(
            settings,
            consumer=consumer,  # type: ignore[arg-type]
            reader=reader,  # type: ignore[arg-type]
            committed_reader=lambda: FakeReader(committed, self.clock, starts=self.starts),  # type: ignore[arg-type,return-value]
            engine=engine,
            guard=guard,
            inputs=inputs,
            clock=self.clock,
            verify_topics=verify_topics,
        )
        for p, restored in restorer.restore(ps).items():
            inputs.resume(p, restored)
        self.seeks = consumer.seeks
        return engine, inputs

    def refused(self, match: str, **kwargs: Any) -> str:
        with pytest.raises(Fatal) as caught:
            self.restore(**kwargs)
        assert caught.value.status == 2
        message = str(caught.value)
        assert message.startswith("evald run: refusing to restore: "), message
        assert match in message, message
        return message


def test_a_fresh_group_starts_both_inputs_at_their_log_start() -> None:
    cluster = Cluster()
    cluster.starts[tp("imp")] = 3
    _, inputs = cluster.restore()
    part = inputs.parts[0]
    assert part.restored and part.fed_next == {"impression": 3, "feedback": 0}
    assert cluster.seeks == {tp("imp"): 3, tp("fb"): 0}


def test_the_checkpoint_is_the_record_before_the_committed_offset() -> None:
    cluster = Cluster()
    cluster.save(checkpoint(watermark=NOW_MS - 90_000), commit=False)
    cluster.save(checkpoint())
    engine, inputs = cluster.restore()
    part = inputs.parts[0]
    assert engine.watermarks()[0] == NOW_MS - 60_000
    assert part.fed_next == {"impression": 2, "feedback": 1}
    assert part.replay_end == {"impression": 4, "feedback": 3}
    assert cluster.seeks == {tp("imp"): 2, tp("fb"): 1}


def test_64_partitions_are_restored_with_one_offset_fetch_and_few_polls() -> None:
    cluster = Cluster(partitions=64)
    for p in range(64):
        ref_at = cluster.save(checkpoint(p), commit=False)  # a filler before the one used
        assert ref_at == 0
        cluster.logs[tp("res", p)] = {o: (b"r", result(f"r{p}-{o}")) for o in range(3)}
        cluster.save(checkpoint(p, results=(ResultRange(0, 3, None),)))
    engine, inputs = cluster.restore(list(range(64)))
    assert all(inputs.parts[p].restored for p in range(64))
    assert all(engine.watermarks()[p] == NOW_MS - 60_000 for p in range(64))


def test_input_offsets_without_a_checkpoint_offset_mean_the_checkpoint_topic_was_deleted() -> None:
    """Kafka drops a group's offsets of a deleted topic: the inputs' offsets remain. Starting
    from the beginning would write every result again (2,312 duplicates in the issue)."""
    cluster = Cluster()
    cluster.offsets = {tp("imp"): 2, tp("fb"): 1}
    message = cluster.refused("but none on the checkpoint topic res.checkpoints")
    assert "imp:0@2, fb:0@1" in message and "new daemon.group_id (not g)" in message


def test_a_checkpoint_below_the_log_start_expired() -> None:
    cluster = Cluster()
    cluster.save(checkpoint())
    cluster.starts[tp(CKPT)] = 1  # retention deleted offset 0
    cluster.refused("is gone: the partition's log starts at 1")


def test_no_offset_at_all_but_a_committed_checkpoint_means_the_offsets_expired() -> None:
    cluster = Cluster()
    cluster.save(checkpoint(), commit=False)
    message = cluster.refused("has no committed offset for partition 0")
    assert "offsets.retention.minutes" in message and "--to-offset" in message


def test_records_of_a_first_transaction_that_never_committed_are_a_fresh_start() -> None:
    """Killed before its first commit: the checkpoint partition holds an aborted record, which
    a read_committed reader does not see."""
    cluster = Cluster()
    cluster.save(checkpoint(), commit=False)
    cluster.committed_view = {tp(CKPT): {}}
    _, inputs = cluster.restore()
    assert inputs.parts[0].fed_next == {"impression": 0, "feedback": 0}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"\xffnot json", "is not a checkpoint"),
        (b'{"v": 2, "partition": 0}', "is not a checkpoint (malformed checkpoint"),
        (b'{"v": 99}', "unsupported checkpoint version 99"),
        (None, "is not a checkpoint"),
    ],
)
def test_a_record_that_is_not_a_checkpoint_is_refused(value: bytes | None, says: str) -> None:
    cluster = Cluster()
    at = cluster.save(checkpoint())
    cluster.logs[tp(CKPT)][at] = (b"0", value)
    message = cluster.refused(says)
    assert "res.checkpoints:0@0" in message and "--reset-offsets" in message


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"partition": 3}, "it is the checkpoint of partition 3"),
        ({"watermark": 253_402_300_799_000}, "its watermark is 9999-12-31T23:59:59"),
        ({"event_times": EventTimes(NOW_MS + 3 * 3_600_000)}, "its newest confirmed event time"),
        ({"watermark": 5}, "before engine.min_event_time"),
        ({"committed": {"impression": 5, "feedback": 1}}, "committed offset 5 and consumed"),
        ({"consumed": {"impression": 4}}, "consumed offsets name ['impression']"),
        ({"consumed": {"impression": 40, "feedback": 3}}, "up to offset 40, but that partition"),
        ({"results": (ResultRange(5, 9), ResultRange(2, 3))}, "overlap"),
        ({"evicted": ((7, 7),)}, "evicted offsets"),
        ({"held_feedback": ((2, 1),)}, "held_feedback offsets"),
        ({"held_feedback": ((1, 1_000_000_000),)}, "held feedback [(1, 1000000000)] lies"),
    ],
)
def test_values_that_cannot_be_right_are_refused(fields: dict[str, Any], says: str) -> None:
    cluster = Cluster()
    cluster.save(checkpoint(**fields), p=0)
    cluster.refused(says)


def test_an_input_topic_recreated_under_the_session_is_said_before_a_refusal() -> None:
    """Offsets that no longer fit are what a recreated input looks like from a restore; the
    topic check (TopicGuard.verify) says so, with what to do about the topic."""
    cluster = Cluster()
    cluster.save(checkpoint(consumed={"impression": 40, "feedback": 3}))

    def recreated() -> None:
        raise Fatal(2, "evald run: stopping: input topic imp was deleted and recreated")

    with pytest.raises(Fatal, match="input topic imp was deleted and recreated"):
        cluster.restore(verify_topics=recreated)
    cluster.refused("up to offset 40, but that partition ends at 5")  # topics as they were


def test_a_watermark_far_ahead_is_accepted_when_the_engine_bounds_no_lead() -> None:
    cluster = Cluster(engine={"max_event_lead": None})
    cluster.save(checkpoint(watermark=NOW_MS + 10 * 3_600_000))
    engine, _ = cluster.restore()
    assert engine.watermarks()[0] == NOW_MS + 10 * 3_600_000


def test_consumed_past_a_lagging_listoffsets_end_is_confirmed_by_a_fetch() -> None:
    """tansu's ListOffsets answers the base offset of the last batch: the fetch decides."""
    cluster = Cluster()
    cluster.listed_ends[tp("imp")] = 2
    cluster.save(checkpoint())
    _, inputs = cluster.restore()
    assert inputs.parts[0].restored


def test_a_group_offset_pointing_after_a_marker_is_refused() -> None:
    cluster = Cluster()
    cluster.save(checkpoint())
    cluster.offsets[tp(CKPT)] = 3
    cluster.logs[tp(CKPT)][3] = (b"0", checkpoint().encode())  # offsets 1, 2: markers
    cluster.refused("points after offset 2, which holds no record")


def test_a_checkpoint_past_the_end_of_its_partition_is_refused() -> None:
    cluster = Cluster()
    cluster.save(checkpoint(), at=9)
    del cluster.logs[tp(CKPT)][9]  # truncated: the log now ends at 0
    cluster.refused("is not there: the partition ends at offset 0")


def snapshot_of(engine: Engine) -> bytes:
    engine.absorb_result(json.loads(result("s1")), 0)
    return engine.snapshot(0)


def test_a_snapshot_is_joined_from_its_chunks_skipping_foreign_records() -> None:
    cluster = Cluster()
    raw = snapshot_of(Engine(cluster.config))
    cut = len(raw) // 2
    log = cluster.logs[tp(CKPT)]
    log[0], log[1], log[2] = (
        (b"0.snapshot", raw[:cut]),
        (b"x", b"foreign"),
        (b"0.snapshot", raw[cut:]),
    )
    ref = SnapshotRef((0, 2), len(raw), zlib.crc32(raw), NOW_MS)
    cluster.save(checkpoint(snapshot=ref))
    engine, _ = cluster.restore()
    assert engine.snapshot(0) == raw


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("crc", "are damaged: snapshot at [0, 2] has"),
        ("missing", "are damaged: no record at offsets [2]"),
        ("after", "its snapshot records [0, 2, 5] do not precede it"),
        ("expired", "its snapshot records [0, 2] were deleted"),
    ],
)
def test_a_damaged_snapshot_is_refused(change: str, says: str) -> None:
    cluster = Cluster()
    raw = snapshot_of(Engine(cluster.config))
    cut = len(raw) // 2
    log = cluster.logs[tp(CKPT)]
    log[0], log[2] = (b"0.snapshot", raw[:cut]), (b"0.snapshot", raw[cut:])
    offsets, crc = (0, 2), zlib.crc32(raw)
    if change == "crc":
        crc ^= 1
    elif change == "missing":
        del log[2]
    elif change == "after":
        offsets = (0, 2, 5)
    elif change == "expired":
        cluster.starts[tp(CKPT)] = 1
    cluster.save(checkpoint(snapshot=SnapshotRef(offsets, len(raw), crc, NOW_MS)), at=3)
    cluster.refused(says)


def test_a_damaged_click_model_is_refused_naming_the_partition() -> None:
    """A checkpoint whose engine state a loader cannot read (here the click model's snapshot,
    inline, not base64: no CRC guards the inline parts) ends the restore with exit 2 naming
    the partition, the part and the ways out; before, the ValueError escaped the restore and
    every retry of the Kafka loop failed on it again, without end."""
    cluster = Cluster(engine={"click_model": {"model": "pbm"}})
    cp = checkpoint()
    cp = dataclasses.replace(cp, state=dataclasses.replace(cp.state, click_model={"snapshot": "@"}))
    cluster.save(cp)
    message = cluster.refused("of partition 0 holds engine state this evald cannot load")
    assert "the click model's snapshot is not base64" in message
    assert "resume from an earlier checkpoint of partition 0" in message


def test_results_that_are_not_results_are_left_out_and_the_restore_goes_on() -> None:
    """Another producer's garbage in the results topic: the real results around it count."""
    cluster = Cluster()
    cluster.logs[tp("res")] = {
        0: (b"r", result("r1")),
        1: (b"r", b"\xff not json"),
        2: (b"r", b"[1, 2]"),
        3: (b"r", result("r2")),
    }
    cluster.save(checkpoint(results=(ResultRange(0, 4, None),)))
    engine, _ = cluster.restore()
    reference = Engine(cluster.config)
    for rid in ("r1", "r2"):
        assert reference.absorb_result(json.loads(result(rid)), 0)
    assert engine.snapshot(0) == reference.snapshot(0)
    assert engine.snapshot(0) != Engine(cluster.config).snapshot(0)


def test_results_named_past_the_end_of_the_results_partition_are_refused() -> None:
    cluster = Cluster()
    cluster.logs[tp("res")] = {0: (b"r", result("r1"))}
    cluster.save(checkpoint(results=(ResultRange(0, 6, None),)))
    cluster.refused("names results up to offset 6 of res:0, but that partition ends at 1")


HOUR = 3_600_000


def comparing(start_ms: int) -> dict[str, Any]:
    comparison = {
        "name": "ab",
        "label": "arm",
        "control": "control",
        "treatments": ["treatment"],
        "start": start_ms,
    }
    return {"statistics": {"window": "5m", "comparisons": [comparison]}}


@pytest.mark.parametrize("start_after", [False, True], ids=["lost", "not-needed"])
def test_shares_lost_with_a_recreated_statistics_topic_are_refused_when_a_comparison_needs_them(
    start_after: bool,
) -> None:
    """The checkpoint says partition 0 published its shares up to ``final``; the statistics
    topic it was written against (id ``old``) is not today's (``new``)."""
    final = (NOW_MS // 300_000) * 300_000 - 300_000
    start = final if start_after else final - 2 * HOUR
    cluster = Cluster(engine=comparing(start))
    shares = {"v": 1, "width": 300_000, "final": final, "open": []}
    extra = {"topic_ids": {STATISTICS_TOPIC: "old"}}
    cluster.save(checkpoint(statistics=shares, extra=extra))
    if start_after:
        engine, _ = cluster.restore(statistics_id="new")
        assert engine.shares is not None
        return
    message = cluster.refused(
        "the statistics topic res.checkpoints.statistics was deleted and created again",
        statistics_id="new",
    )
    assert f"(0 up to {time_in_words(final)})" in message
    assert "the comparisons ['ab'] would silently miss" in message
    assert "set their start to" in message
    # the same topic as when the checkpoint was written: nothing was lost
    cluster.restore(statistics_id="old")


@pytest.mark.parametrize(
    ("case", "refused"),
    [("lost", True), ("start-after", False), ("same-topic", False), ("other-width", False)],
)
def test_credit_shares_lost_with_a_recreated_statistics_topic_are_refused_while_the_test_needs_them(
    case: str, refused: bool
) -> None:
    """Partition 0's checkpoint says it published its interleaving credit shares up to
    ``final``, on the statistics topic of id ``old``; no comparison is configured."""
    final = (NOW_MS // 300_000) * 300_000 - 300_000
    start = final if case == "start-after" else 0
    width = "10m" if case == "other-width" else "5m"
    interleaving = {"teams": ["a", "b"], "window": width, "start": start}
    cluster = Cluster(engine={"interleaving": interleaving})
    replicates = cluster.config.statistics.bootstrap_replicates
    credit = {"v": 1, "width": 300_000, "replicates": replicates, "final": final, "open": []}
    extra = {"topic_ids": {STATISTICS_TOPIC: "old"}}
    cluster.save(checkpoint(statistics={"interleaving": credit}, extra=extra))
    current = "old" if case == "same-topic" else "new"
    if not refused:
        engine, _ = cluster.restore(statistics_id=current)
        assert engine.interleaving.shares is not None
        return
    message = cluster.refused(
        "the statistics topic res.checkpoints.statistics was deleted and created again",
        statistics_id=current,
    )
    assert f"(0 up to {time_in_words(final)})" in message
    assert "the interleaving test would silently miss" in message
    assert f"set interleaving.start to {time_in_words(final)} or later" in message
