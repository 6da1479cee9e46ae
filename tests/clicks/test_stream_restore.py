"""The click model in the partition's checkpointed state, at the engine: a restore restored
again before any new list, a partition dropped and loaded again, the settings changed across a
restart, and damaged checkpoint parts. Each run is compared with an uninterrupted engine fed
the same records (no Kafka: ``Engine.state``, a fresh ``Engine``, ``Engine.resume``)."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import lz4.frame
import pytest
from test_stream import ENGINE, THETA, events, named

from evald import snapshot as codec
from evald.clicks import stream
from evald.config import load_config
from evald.engine import Engine
from evald.partition_state import PartitionState
from evald.result import Result

Tagged = list[tuple[str, int, bytes]]
CLICKS = {"model": "pbm", "depth": 6, "refit_every": 200}
BATCH = 300  # records per poll; a commit after each
FAMILIES = (
    "evald_click_examination",
    "evald_click_model_lists",
    "evald_click_ips_clicks_total",
    "evald_click_ips_expected_total",
    "evald_click_measure_sum",
    "evald_click_measure_count",
)
#: of ``FAMILIES``, those of the partitions owned now (the others are counters)
GAUGES = ("evald_click_examination", "evald_click_model_lists")


def tagged(seed: int, n: int = 3000) -> Tagged:
    """``events`` as (kind, per-kind offset, record)."""
    out, offsets = [], {"impression": 0, "feedback": 0}
    for raw in events(seed, THETA, n):
        kind = "impression" if b'"items"' in raw else "feedback"
        out.append((kind, offsets[kind], raw))
        offsets[kind] += 1
    return out


def make(**click_model: Any) -> tuple[Engine, list[Result]]:
    results: list[Result] = []
    config = load_config(ENGINE, click_model={**CLICKS, **click_model})
    return Engine(config, clock=lambda: 0.0, on_result=results.append), results


def feed(engine: Engine, records: Tagged, partition: int = 0) -> None:
    for start in range(0, len(records), BATCH):
        chunk = records[start : start + BATCH]
        engine.feed_batch(
            [raw for _, _, raw in chunk],
            partition=partition,
            kinds=[kind for kind, _, _ in chunk],
            offsets=[offset for _, offset, _ in chunk],
        )
        engine.tick()


def consumed(records: Tagged) -> dict[str, int]:
    out = {"impression": 0, "feedback": 0}
    for kind, offset, _ in records:
        out[kind] = offset + 1
    return out


def committed_run(records: Tagged, cut: int) -> tuple[list[Result], PartitionState]:
    """An engine fed ``records[:cut]``, a commit (``state``) after each poll batch; the
    results and the last state, through JSON as a checkpoint carries it."""
    engine, results = make()
    state = None
    for start in range(0, cut, BATCH):
        stop = min(start + BATCH, cut)
        feed(engine, records[start:stop])
        state = engine.state(0, consumed(records[:stop]))
    assert state is not None
    return results, PartitionState.from_json(json.loads(json.dumps(state.to_json())))


def refeed(engine: Engine, records: Tagged, state: PartitionState) -> None:
    feed(engine, [r for r in records if r[1] >= state.committed[r[0]]])


def view(engine: Engine) -> tuple[Any, ...]:
    clicks = engine.clicks
    assert clicks is not None
    models = {p: m.snapshot() for p, m in sorted(clicks.models.items())}
    return models, clicks.ips_rows(), clicks.debiased.rows(), clicks.curve.tobytes()


def test_a_restore_restored_again_before_any_list_equals_the_uninterrupted_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restart during a restore: the state taken right after a load is the loaded one to
    the byte (the same snapshot named, the same log, not observed twice), and a second load
    of the same checkpoint into the same engine, or a load of that second state, then the
    rest of the stream, ends equal to the uninterrupted run: model, IPS and debiased sums,
    curve and every result."""
    monkeypatch.setattr(stream, "LOG_SHARE", 1e9)  # one snapshot a life: the rest is logged
    records = tagged(4)
    reference, want = make()
    feed(reference, records)
    reference.drain()
    cut = int(len(records) * 0.8)
    before, first = committed_run(records, cut)
    assert first.click_model is not None and first.click_model.get("log")
    again, after = make()
    again.resume(0, first, consumed(records[:cut]))
    second = again.state(0, first.committed)
    assert second.to_json() == first.to_json()
    again.resume(0, first, consumed(records[:cut]))  # restored once more, nothing fed between
    refeed(again, records, first)
    again.drain()
    third, after_second = make()
    third.resume(0, second, consumed(records[:cut]))
    refeed(third, records, second)
    third.drain()
    for engine, results in ((again, after), (third, after_second)):
        assert view(engine) == view(reference)
        assert [r.to_json() for r in before + results] == [r.to_json() for r in want]
    clicks = reference.clicks
    assert clicks is not None and clicks.models[0].fits >= 3 and clicks.ips_rows()


def test_a_dropped_partition_leaves_the_curve_at_once_and_its_counts_stay() -> None:
    """Two partitions pooled, one revoked: the curve and its evidence are at once the other
    partition's alone, as on an engine that never had it, while the counters (IPS and
    debiased sums) keep what this engine scored of it: a counter never goes down, and the
    partition's next owner counts only what it scores itself. Reassigned (loaded from its
    commit), the curve is the two partitions' again and the counters count nothing twice."""
    zero, one = tagged(4), tagged(5)
    both, _ = make()
    feed(both, zero)
    feed(both, one, partition=1)
    only, _ = make()
    feed(only, zero)
    pooled = {family: named(both, family) for family in FAMILIES}
    state = both.state(1, consumed(one))
    assert named(both, "evald_click_examination") != named(only, "evald_click_examination")
    both.drop_partition(1)
    for family in FAMILIES:  # before any tick
        gauge = family in GAUGES
        assert named(both, family) == (named(only, family) if gauge else pooled[family]), family
    assert pooled["evald_click_ips_clicks_total"] != named(only, "evald_click_ips_clicks_total")
    both.resume(1, state, consumed(one))
    for family in FAMILIES:
        assert named(both, family) == pooled[family], family


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"depth": 5}, "depth 6 -> 5"),
        ({"max_pairs": 1000}, "max_pairs 20000 -> 1000"),
        ({"half_life": "1h"}, "half_life 86400000 -> 3600000"),
        ({"refit_every": 300}, "refit_every 200 -> 300"),
    ],
)
def test_a_checkpoint_of_other_click_settings_starts_afresh_and_says_which(
    change: dict[str, Any], says: str, caplog: pytest.LogCaptureFixture
) -> None:
    """engine.click_model changed across a restart: the partition's fit and sums start
    empty (nothing stale exported), the stream goes on, and a warning names the partition
    and each changed setting with its old and new value."""
    records = tagged(4)
    cut = int(len(records) * 0.8)
    _, state = committed_run(records, cut)
    engine, _ = make(**change)
    with caplog.at_level(logging.WARNING, logger="evald.clicks.stream"):
        engine.resume(0, state, consumed(records[:cut]))
    clicks = engine.clicks
    assert clicks is not None and not clicks.models and not clicks.ips_rows()
    assert not clicks.debiased.rows()
    (message,) = [r.getMessage() for r in caplog.records if "click model" in r.getMessage()]
    assert message.startswith("partition 0: ") and says in message, message
    refeed(engine, records, state)
    engine.drain()
    fresh = clicks.models[0]
    assert fresh.settings == clicks.settings and fresh.seen < cut / 2


def test_debiased_sums_of_other_measures_start_again_and_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    records = tagged(4)
    cut = int(len(records) * 0.8)
    _, state = committed_run(records, cut)
    config = load_config({**ENGINE, "measures": ["RR"]}, click_model=CLICKS)
    engine = Engine(config, clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="evald.clicks.stream"):
        engine.resume(0, state, consumed(records[:cut]))
    assert engine.clicks is not None and 0 in engine.clicks.models  # the model is kept
    (message,) = [r.getMessage() for r in caplog.records]
    assert "partition 0" in message and "['nDCG@6']" in message and "['RR']" in message


def damaged(doc: dict[str, Any], how: str) -> Any:
    snapshot = base64.b64decode(doc["snapshot"])
    log = base64.b64decode(doc["log"])
    flipped = bytearray(snapshot)
    flipped[len(flipped) // 2] ^= 0xFF
    return {
        "snapshot not base64": {**doc, "snapshot": doc["snapshot"][:-4] + "!!!!"},
        "snapshot cut short": {**doc, "snapshot": base64.b64encode(snapshot[:-99]).decode()},
        "snapshot byte flipped": {**doc, "snapshot": base64.b64encode(bytes(flipped)).decode()},
        "no snapshot": {k: v for k, v in doc.items() if k != "snapshot"},
        "not an object": "garbage",
        "log not base64": {**doc, "log": "%%%"},
        "log cut short": {**doc, "log": base64.b64encode(log[:-7]).decode()},
        "ips rows short": {**doc, "ips": [[["a0"], 1]]},
        "debiased rows short": {**doc, "debiased": {"measures": ["nDCG@6"], "rows": [[["a0"]]]}},
        "debiased a list": {**doc, "debiased": ["nDCG@6"]},
        "debiased a string": {**doc, "debiased": "nDCG@6"},
        "ips infinite": {**doc, "ips": [[["a0"], float("inf"), 2, 3]]},
        "settings unknown": {**doc, "snapshot": with_settings(snapshot, {"future": 1})},
        "no pairs": {**doc, "snapshot": with_settings(snapshot, {}, drop="pairs")},
    }[how]


def with_settings(packed: bytes, extra: dict[str, Any], drop: str = "") -> str:
    """A checkpointed snapshot with ``extra`` settings (a later evald's) and its meta's
    ``drop`` field left out."""
    meta, arrays = codec.decode(lz4.frame.decompress(packed[len(stream.LZ4) :]))
    meta["settings"] = {**meta["settings"], **extra}
    meta.pop(drop, None)
    raw = stream.LZ4 + lz4.frame.compress(codec.encode(meta, arrays))
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("snapshot not base64", "click model's snapshot is not base64"),
        ("snapshot cut short", "click model's snapshot is damaged"),
        ("snapshot byte flipped", "malformed snapshot"),
        ("no snapshot", "click model's snapshot is not base64"),
        ("not an object", "click model's state is not an object"),
        ("log not base64", "click model's log is not base64"),
        ("log cut short", "click-model log batch"),
        ("ips rows short", "click model's IPS sums are unreadable"),
        ("debiased rows short", "click model's debiased sums are unreadable"),
        ("debiased a list", "click model's debiased sums are not an object"),
        ("debiased a string", "click model's debiased sums are not an object"),
        ("ips infinite", "click model's IPS sums are unreadable"),
        ("settings unknown", "click-model snapshot this evald cannot read"),
        ("no pairs", "click-model snapshot this evald cannot read"),
    ],
)
def test_a_damaged_click_model_state_is_a_value_error_naming_the_part(
    how: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never a model silently started empty (nor one that fails later, mid-stream): a
    ValueError saying which part is damaged, which the restore turns into its refusal, and
    nothing of the partition left loaded."""
    monkeypatch.setattr(stream, "LOG_SHARE", 1e9)
    records = tagged(4)
    cut = int(len(records) * 0.8)
    _, state = committed_run(records, cut)
    assert state.click_model is not None
    bad = PartitionState(**{**state.__dict__, "click_model": damaged(state.click_model, how)})
    engine, _ = make()
    with pytest.raises(ValueError, match=says):
        engine.resume(0, bad, consumed(records[:cut]))
    clicks = engine.clicks
    assert clicks is not None and not clicks.models and not clicks.ips_rows()
    assert not clicks.debiased.rows()


def test_a_click_model_switched_off_across_a_restart_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    records = tagged(4)
    cut = int(len(records) * 0.8)
    _, state = committed_run(records, cut)
    assert state.click_model is not None
    engine = Engine(load_config(ENGINE), clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="evald.engine"):
        engine.resume(0, state, consumed(records[:cut]))
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("partition 0: ") and "engine.click_model, which is off" in message
    refeed(engine, records, state)
    assert engine.clicks is None and engine.state(0, consumed(records)).click_model is None
