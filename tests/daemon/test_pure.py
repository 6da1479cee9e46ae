"""Pure helpers of the daemon: backoff, topic layout checks, checkpoint records and ranges."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from evald.config import load_config
from evald.daemon.backoff import Backoff
from evald.daemon.main.checkpoint import Checkpoint, ResultRange, SnapshotRef, from_runs, to_runs
from evald.daemon.main.ledger import extend_ranges, prune_ranges
from evald.daemon.topics import (
    TopicLayoutError,
    TopicShape,
    check_checkpoint_ids,
    check_layout,
    check_outputs_kept,
    check_statistics_unchanged,
    check_unchanged,
    missing_outputs,
    statistics_policy_problem,
)
from evald.engine import Engine
from evald.join.clock import EventTimes


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    top = Backoff(0.1, 1.0, rand=lambda: 1.0)
    assert [round(top.next_delay(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    top.reset()
    assert top.next_delay() == pytest.approx(0.1)
    bottom = Backoff(0.1, 1.0, rand=lambda: 0.0)
    assert [round(bottom.next_delay(), 3) for _ in range(3)] == [0.05, 0.1, 0.2]
    with pytest.raises(ValueError):
        Backoff(2.0, 1.0)


def test_layout_accepts_copartitioned_inputs() -> None:
    counts = {"imp": 4, "fb": 4, "res": 4, "dlq": None}
    assert check_layout(counts, impressions="imp", feedback="fb", outputs=("res", "dlq")) == 4
    assert missing_outputs(counts, ("res", "dlq")) == ["dlq"]


def test_layout_refuses_different_partition_counts() -> None:
    with pytest.raises(TopicLayoutError, match="co-partitioned: imp has 4 partitions, fb has 3"):
        check_layout({"imp": 4, "fb": 3}, impressions="imp", feedback="fb")


def test_layout_refuses_missing_inputs_and_small_outputs() -> None:
    with pytest.raises(TopicLayoutError, match="fb do not exist"):
        check_layout({"imp": 2}, impressions="imp", feedback="fb")
    with pytest.raises(TopicLayoutError, match="res has 2 partitions but the inputs have 4"):
        check_layout(
            {"imp": 4, "fb": 4, "res": 2}, impressions="imp", feedback="fb", outputs=("res",)
        )


def test_checkpoint_round_trips_and_rejects_garbage() -> None:
    cp = Checkpoint.of(
        partition=3,
        watermark=1_700_000_000_000,
        committed={"impression": 10, "feedback": 7},
        consumed={"impression": 25, "feedback": 30},
        results=(ResultRange(0, 5, 99), ResultRange(9, 12, None)),
        epoch_start=9,
        instance="a",
    )
    assert Checkpoint.decode(cp.encode()) == cp
    for raw in (b"not json", b"{}", b'{"v": 99}', b'{"v": 1, "partition": 1}'):
        with pytest.raises(ValueError):
            Checkpoint.decode(raw)


def test_a_version_2_checkpoint_names_its_snapshot_and_the_evicted_offsets() -> None:
    cp = Checkpoint.of(
        partition=1,
        watermark=5,
        committed={"impression": 10, "feedback": 7},
        consumed={"impression": 25, "feedback": 30},
        results=(ResultRange(40, 45, 99),),
        epoch_start=40,
        snapshot=SnapshotRef((31, 32, 34), 600_000, 123, 1_700_000_000_000),
        evicted=((10, 12), (20, 21)),
    )
    raw = cp.encode()
    assert json.loads(raw)["v"] == 2
    assert Checkpoint.decode(raw) == cp
    for bad in ({"offsets": []}, {"offsets": [3, 2]}, {"offsets": [1], "size": "x"}):
        doc = json.loads(raw)
        doc["snapshot"] = {**doc["snapshot"], **bad}
        with pytest.raises(ValueError):
            Checkpoint.decode(json.dumps(doc).encode())


def test_a_checkpoint_carries_its_open_comparison_shares() -> None:
    """The shares not final at the commit travel with the checkpoint (absent without
    comparisons, and in checkpoints written before them)."""
    from evald.segments import SegmentIndex
    from evald.statistics.shares import PartitionShares

    segments = SegmentIndex(("arm",), 10, 10)
    seg = segments.segment_of({"arm": "A"})
    shares = PartitionShares(3_600_000, 60_000, 2, segments)
    shares.observe(1, np.array([seg]), np.array([7_200_001]), np.ones((1, 2)), ["window"])
    cp = Checkpoint.of(
        partition=1,
        watermark=5,
        committed={"impression": 10, "feedback": 7},
        consumed={"impression": 25, "feedback": 30},
        statistics=shares.state(1),
    )
    decoded = Checkpoint.decode(cp.encode())
    assert decoded == cp and decoded.statistics is not None
    assert decoded.statistics["open"][0][0] == 7_200_000
    plain = Checkpoint.of(1, 5, {"impression": 1, "feedback": 1}, {"impression": 1, "feedback": 1})
    assert "statistics" not in json.loads(plain.encode())
    assert Checkpoint.decode(plain.encode()).statistics is None


def test_a_version_1_checkpoint_still_restores_through_its_ranges() -> None:
    """What evald wrote before snapshots: no snapshot, no evicted offsets, all ranges."""
    raw = (
        b'{"committed":{"feedback":7,"impression":10},"consumed":{"feedback":30,"impression":25},'
        b'"epoch_start":9,"event_times":[4,null],"instance":"a","partition":3,'
        b'"results":[[0,5,99],[9,12,null]],"v":1,"watermark":1700000000000}'
    )
    cp = Checkpoint.decode(raw)
    assert cp.snapshot is None and cp.evicted == ()
    assert cp.results == (ResultRange(0, 5, 99), ResultRange(9, 12, None))
    assert cp.event_times == EventTimes(4)


def test_the_feedback_held_at_a_checkpoint_travels_as_runs_and_is_optional() -> None:
    """Written only when some feedback is held (an older reader ignores it); a checkpoint
    without it, from an older evald or with none held, reads as none held."""
    cp = Checkpoint.of(
        partition=1,
        watermark=5,
        committed={"impression": 10, "feedback": 7},
        consumed={"impression": 25, "feedback": 30},
        held_feedback=((7, 9), (12, 13)),
    )
    raw = cp.encode()
    assert json.loads(raw)["held_feedback"] == [[7, 9], [12, 13]]
    assert Checkpoint.decode(raw) == cp
    plain = Checkpoint.of(1, 5, {"impression": 1, "feedback": 1}, {"impression": 1, "feedback": 1})
    assert "held_feedback" not in json.loads(plain.encode())
    assert Checkpoint.decode(plain.encode()).held_feedback == ()


def test_evicted_offsets_travel_as_runs() -> None:
    offsets = [3, 4, 5, 9, 11, 12]
    assert to_runs(offsets) == ((3, 6), (9, 10), (11, 13))
    assert from_runs(to_runs(offsets)) == offsets
    assert to_runs([]) == () and from_runs(()) == []
    assert len(to_runs(list(range(1000, 6000)))) == 1


def test_ranges_extend_within_an_epoch_and_split_across_epochs() -> None:
    ranges, epoch = extend_ranges((), None, 0, 4, 100)
    assert ranges == (ResultRange(0, 5, 100),) and epoch == 0
    # next transaction of the same epoch: after our own commit marker at offset 5
    ranges, epoch = extend_ranges(ranges, epoch, 6, 9, 90)
    assert ranges == (ResultRange(0, 10, 100),) and epoch == 0
    # restart: a new epoch starts after aborted records at 10..14, which stay outside
    ranges, epoch = extend_ranges(ranges, None, 15, 15, 120)
    assert ranges == (ResultRange(0, 10, 100), ResultRange(15, 16, 120)) and epoch == 15
    with pytest.raises(ValueError):
        extend_ranges(ranges, epoch, 5, 4, None)


def test_prune_keeps_reachable_ranges_and_the_current_epoch() -> None:
    ranges = (ResultRange(0, 5, 100), ResultRange(7, 9, 300), ResultRange(11, 12, 50))
    assert prune_ranges(ranges, 200) == (ResultRange(7, 9, 300), ResultRange(11, 12, 50))
    assert prune_ranges(ranges, None) == ranges


def test_unchanged_topics_pass_and_brokers_without_ids_compare_counts_only() -> None:
    before = {"imp": TopicShape("id-1", 3), "fb": TopicShape(None, 3)}
    check_unchanged(before, {"imp": TopicShape("id-1", 3), "fb": TopicShape("id-9", 3)})
    check_unchanged({}, {"imp": None})  # nothing seen yet: nothing to compare


@pytest.mark.parametrize(
    ("now", "said"),
    [
        ({"imp": None}, "input topic imp no longer exists"),
        ({"imp": TopicShape("id-2", 3)}, "input topic imp was deleted and recreated"),
        ({"imp": TopicShape("id-2", 4)}, "input topic imp changed from 3 to 4 partitions"),
        ({"imp": TopicShape("id-1", 6)}, "input topic imp changed from 3 to 6 partitions"),
    ],
)
def test_a_changed_input_topic_is_refused_with_what_to_do(
    now: dict[str, TopicShape | None], said: str
) -> None:
    with pytest.raises(TopicLayoutError, match=said) as info:
        check_unchanged({"imp": TopicShape("id-1", 3)}, now)
    assert "new daemon.group_id" in str(info.value)


def test_a_checkpoint_written_against_another_topic_id_is_refused() -> None:
    now = {"imp": TopicShape("id-2", 3), "fb": TopicShape(None, 3)}
    check_checkpoint_ids({"imp": "id-2", "fb": "id-7"}, now, 0)  # no id now: nothing to compare
    check_checkpoint_ids({}, now, 0)  # a checkpoint from before ids were kept
    with pytest.raises(
        TopicLayoutError, match="imp was deleted and recreated since the checkpoint"
    ):
        check_checkpoint_ids({"imp": "id-1"}, now, 4)


@pytest.mark.parametrize(
    ("now", "said"),
    [
        ({"res": None}, "output topic res was deleted while evald ran"),
        ({"res": TopicShape("id-2", 3)}, "res was deleted and recreated (topic id id-1 -> id-2)"),
    ],
)
def test_a_results_topic_gone_while_running_is_refused_with_what_to_do(
    now: dict[str, TopicShape | None], said: str
) -> None:
    with pytest.raises(TopicLayoutError, match=re.escape(said)) as info:
        check_outputs_kept({"res": TopicShape("id-1", 3)}, now, "g")
    assert "checkpoints of group g point at offsets in the old topic" in str(info.value)
    assert "new daemon.group_id and new results/checkpoint topics" in str(info.value)
    check_outputs_kept({"res": TopicShape("id-1", 3)}, {"res": TopicShape("id-1", 6)}, "g")
    check_outputs_kept({"res": TopicShape(None, 3)}, {"res": TopicShape("id-9", 3)}, "g")
    check_outputs_kept({}, {"res": None}, "g")  # not seen yet: nothing to compare


def test_a_checkpoint_written_against_another_results_topic_is_refused() -> None:
    now = {"res": TopicShape("id-2", 3)}
    check_checkpoint_ids({"res": "id-2"}, now, 0, role="results topic")
    with pytest.raises(TopicLayoutError, match="results topic res was deleted and recreated since"):
        check_checkpoint_ids({"res": "id-1"}, now, 0, role="results topic")


def test_the_statistics_topic_gone_or_recreated_while_running_is_refused() -> None:
    check_statistics_unchanged("s", "id-1", TopicShape("id-1", 1))
    check_statistics_unchanged("s", None, TopicShape("id-1", 1))  # no id seen: nothing to compare
    with pytest.raises(TopicLayoutError, match="statistics topic s no longer exists while"):
        check_statistics_unchanged("s", "id-1", None)
    with pytest.raises(TopicLayoutError, match=r"s was recreated \(topic id id-1 -> id-2\)"):
        check_statistics_unchanged("s", "id-1", TopicShape("id-2", 1))


@pytest.mark.parametrize(
    ("configs", "problem"),
    [
        ({"cleanup.policy": "compact"}, None),
        ({"cleanup.policy": "compact,delete", "retention.ms": "-1"}, None),
        (None, None),  # the broker does not say (no DescribeConfigs): not refused
        ({"cleanup.policy": "delete", "retention.ms": "604800000"}, "cleanup.policy=delete"),
        ({"cleanup.policy": "compact,delete", "retention.ms": "1000"}, "compact,delete"),
    ],
)
def test_a_statistics_topic_that_is_not_compacted_is_refused_with_the_fix(
    configs: dict[str, str] | None, problem: str | None
) -> None:
    said = statistics_policy_problem("s", configs)
    if problem is None:
        assert said is None
    else:
        assert said is not None and problem in said
        assert "--entity-name s --add-config cleanup.policy=compact" in said


def test_checkpoint_carries_the_clocks_event_times_and_reads_older_checkpoints() -> None:
    times = EventTimes(
        1_700_000_120_000, (1_700_000_121_000, 1_700_000_119_000), (1_700_003_000_000,)
    )
    cp = Checkpoint.of(
        partition=0,
        watermark=1_700_000_000_000,
        committed={"impression": 1, "feedback": 1},
        consumed={"impression": 2, "feedback": 2},
        event_times=times,
    )
    assert Checkpoint.decode(cp.encode()) == cp
    doc = json.loads(cp.encode())
    # what a reader from before the blocks expects (it ignores the two lists)
    assert doc["event_times"] == [1_700_000_120_000, None]
    assert doc["event_block"] == [1_700_000_121_000, 1_700_000_119_000]
    assert doc["event_ahead"] == [1_700_003_000_000]
    bare = Checkpoint.of(0, 5, {}, {}, event_times=EventTimes(7))
    assert "event_block" not in json.loads(bare.encode())
    assert Checkpoint.decode(bare.encode()).event_times == EventTimes(7)
    older = json.loads(cp.encode())
    del older["event_times"]
    assert Checkpoint.decode(json.dumps(older).encode()).event_times is None
    older["event_times"] = [1, 2, 3]
    with pytest.raises(ValueError):
        Checkpoint.decode(json.dumps(older).encode())


#: a checkpoint exactly as evald wrote it before the blocks: confirmed time T0 + 4 min and a
#: candidate 45 min ahead of it (one event the former rule was holding back)
BEFORE_BLOCKS = (
    b'{"committed":{"feedback":38,"impression":40},"consumed":{"feedback":60,"impression":61},'
    b'"epoch_start":null,"event_times":[1714565040000,1714567740000],"instance":"a",'
    b'"partition":2,"results":[],"v":2,"watermark":1714564920000}'
)


def test_a_checkpoint_written_before_the_blocks_restores_and_its_candidate_is_dropped() -> None:
    """Its confirmed time and watermark are taken; its candidate is one unconfirmed time, not
    a block, so a second event near it (what confirmed it before) moves nothing; events the
    restore re-feeds do not count; new ones fill blocks from the confirmed time on."""
    cp = Checkpoint.decode(BEFORE_BLOCKS)
    t0 = 1_714_564_800_000
    assert cp.event_times == EventTimes(t0 + 4 * 60_000)
    engine = Engine(load_config())
    engine.restore(2, cp.watermark, cp.consumed, cp.event_times)

    def impression(rid: str, ts: int) -> bytes:
        return json.dumps({"request_id": rid, "ts": ts, "items": ["x"]}).encode()

    for offset in range(40, 61):  # re-fed: seen before the checkpoint
        engine.feed(impression(f"old{offset}", t0 + offset * 5_000), partition=2, offset=offset)
    assert engine.event_times(2) == EventTimes(t0 + 4 * 60_000)
    near = impression("near", 1_714_567_740_000 + 60_000)
    engine.feed(near, partition=2, kind="impression", offset=61)
    assert engine.watermarks()[2] == cp.watermark
    for k in range(31):  # the rest of the block, from T0 + 5 min
        engine.feed(impression(f"n{k}", t0 + 300_000 + k * 1_000), partition=2, offset=62 + k)
    assert engine.watermarks()[2] == t0 + 300_000 - 120_000  # the block's earliest, - 2m
