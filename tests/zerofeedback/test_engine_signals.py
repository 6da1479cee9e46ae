"""The zero-feedback signals through the engine: equal to an offline computation on the same
stream, exact across a restore, and read by the exposition."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from test_rbo import plain_rbo_ext

from evald.config import ConfigError, load_config
from evald.engine import Engine, Result
from evald.partition_state import PartitionState

MIN = 60_000
WINDOW = 2 * MIN
DEPTH = 5
P = 0.8
RETENTION = 30 * MIN
JUDGED, REFERENCES = 50, 8  # below the stream's pairs and queries: the bounds are exercised
SETTINGS = {
    "min_event_time": 0,
    "max_event_lead": None,
    "window": WINDOW,
    "lateness": 0,
    "watermark_quorum": 1,
    "measures": "RR",
    "label_keys": ["arm"],
    "bucket": MIN,
    "windows": [5 * MIN, 10 * MIN],
    "retention": RETENTION,
    "zero_feedback": {
        "depth": DEPTH,
        "p": P,
        "judged_capacity": JUDGED,
        "reference_capacity": REFERENCES,
    },
}


def make(**over: Any) -> tuple[Engine, list[Result]]:
    results: list[Result] = []
    config = load_config({**SETTINGS, **over})
    return Engine(config, clock=lambda: 0.0, on_result=results.append), results


def stream(seed: int, n: int = 600, change_at: int = 300) -> list[tuple[str, int, dict]]:
    """(kind, per-kind offset, event) in time order: control and treatment lists for 12
    queries (and a few without a query); from list ``change_at`` on the treatment ranks from a
    shuffled catalogue (its lists change); about a tenth of the lists are empty; clicks come
    10 s after their list, on one of its items, for a third of the lists."""
    rng = np.random.default_rng(seed)
    events: list[tuple[int, str, dict]] = []
    for k in range(n):
        ts = 5 * MIN + k * 4_000
        arm = "control" if k % 2 == 0 else "treatment"
        q = int(rng.integers(0, 12))
        base = [f"item-{(q * 7 + j) % 40}" for j in range(8)]
        if arm == "treatment" and k >= change_at:
            base = [f"item-{x}" for x in rng.permutation(40)[:8]]
        elif rng.random() < 0.3:
            base[0], base[1] = base[1], base[0]
        items = [] if rng.random() < 0.1 else base[: int(rng.integers(3, 9))]
        body: dict = {"request_id": f"r{k}", "ts": ts, "items": items, "labels": {"arm": arm}}
        if rng.random() < 0.95:
            body["query"] = f"Query {q}"
        events.append((ts, "impression", body))
        if items and rng.random() < 0.33:
            item = items[int(rng.integers(0, len(items)))]
            click = {"request_id": f"r{k}", "ts": ts + 10_000, "item": item, "action": "click"}
            events.append((ts + 10_000, "feedback", click))
    events.sort(key=lambda e: e[0])
    offsets = {"impression": 0, "feedback": 0}
    out = []
    for _, kind, body in events:
        out.append((kind, offsets[kind], body))
        offsets[kind] += 1
    return out


def remember(memory: dict, key: Any, value: Any, capacity: int) -> None:
    """The documented bound: the entry written least recently goes first."""
    memory.pop(key, None)
    memory[key] = value
    if len(memory) > capacity:
        del memory[next(iter(memory))]


def offline(events: list[tuple[str, int, dict]], order: list[str]) -> dict[str, list[float]]:
    """Each list's (empty, unjudged, rbo), computed plainly in the order the lists were
    finalized (``order``, request ids): the judged pairs and the control's newest list per
    query, the retention and the capacities."""
    impressions = {e["request_id"]: e for kind, _, e in events if kind == "impression"}
    clicked: dict[str, set[str]] = defaultdict(set)
    for kind, _, e in events:
        if kind == "feedback":
            clicked[e["request_id"]].add(e["item"])
    judged: dict[tuple[str, str], int] = {}
    control: dict[str, tuple[int, list[str]]] = {}
    out = {}
    for rid in order:
        imp = impressions[rid]
        items, ts, query = imp["items"][:DEPTH], imp["ts"], imp.get("query", "").lower()
        empty = 0.0 if imp["items"] else 1.0
        unjudged = rbo = math.nan
        if query:
            fresh = [
                i for i in items if (query, i) not in judged or judged[query, i] < ts - RETENTION
            ]
            unjudged = len(fresh) / len(items) if items else math.nan
            if imp["labels"]["arm"] == "control":
                remember(control, query, (ts, items), REFERENCES)
            elif query in control and control[query][0] >= ts - RETENTION:
                ref = control[query][1]
                if items and ref:
                    ids = {name: n for n, name in enumerate({*items, *ref})}
                    rbo = plain_rbo_ext([ids[i] for i in items], [ids[i] for i in ref], P)
                elif items or ref:
                    rbo = 0.0  # one list empty: nothing in common
            for item in items:
                if item in clicked[rid]:
                    remember(judged, (query, item), ts, JUDGED)
        out[rid] = [empty, unjudged, rbo]
    return out


def feed(engine: Engine, events: list[tuple[str, int, dict]]) -> None:
    for kind, off, body in events:
        engine.feed(json.dumps(body).encode(), kind=kind, offset=off)
        engine.tick()


def values(result: Result) -> list[float]:
    assert result.zero_feedback is not None
    return [math.nan if v is None else v for v in result.zero_feedback.values()]


def same(a: list[float], b: list[float]) -> bool:
    pairs = zip(a, b, strict=True)
    return all((x != x and y != y) or x == pytest.approx(y, abs=1e-12) for x, y in pairs)


def test_each_list_s_values_and_the_window_means_equal_an_offline_computation() -> None:
    events = stream(3)
    engine, results = make()
    feed(engine, events)
    engine.drain()
    want = offline(events, [r.request_id for r in results])
    assert len(results) == 600
    for result in results:
        assert same(values(result), want[result.request_id]), result.request_id
    # the last complete 5m window's means, per arm, from the per-list values offline
    rows = {(r.labels["arm"], r.quantity, r.window): r for r in engine.zero_feedback_rows()}
    (end,) = {r.end_ms for r in rows.values() if r.window == "5m"}
    impressions = {e["request_id"]: e for k, _, e in events if k == "impression"}
    for arm in ("control", "treatment"):
        for q, name in enumerate(("empty", "unjudged", "rbo")):
            picked = [
                want[r.request_id][q]
                for r in results
                if impressions[r.request_id]["labels"]["arm"] == arm
                and end - 5 * MIN <= r.ts < end
                and not math.isnan(want[r.request_id][q])
            ]
            row = rows.get((arm, name, "5m"))
            if not picked:
                assert row is None or row.count == 0
                continue
            assert row is not None and row.count == len(picked)
            assert row.mean == pytest.approx(sum(picked) / len(picked), abs=1e-12)
    # the treatment's change shows: RBO with control high before it, low after
    before = [want[r.request_id][2] for r in results[:250] if not math.isnan(want[r.request_id][2])]
    after = [want[r.request_id][2] for r in results[350:] if not math.isnan(want[r.request_id][2])]
    assert np.mean(before) > 0.7 and np.mean(after) < 0.3, (np.mean(before), np.mean(after))
    assert rows[("treatment", "rbo", "5m")].mean < 0.5


def test_the_values_go_through_the_result_record_and_back() -> None:
    events = stream(4, n=200)
    engine, results = make()
    feed(engine, events)
    engine.drain()
    doc = results[-1].to_json()
    assert set(doc["zero_feedback"]) == {"empty", "unjudged", "rbo"}
    again, _ = make()
    for result in results:
        assert again.absorb_result(json.loads(json.dumps(result.to_json())), 0)
    again.drain()
    assert [r.to_json() for r in again.zero_feedback_rows()] == [
        r.to_json() for r in engine.zero_feedback_rows()
    ]


def restored_run(
    events: list[tuple[str, int, dict]], cut: int, *, keep_memory: bool = True, **second_over: Any
) -> tuple[list[Result], Engine]:
    """A first engine fed ``events[:cut]``, committed (results, state, snapshot), killed; a
    second (with the settings ``second_over`` changes) resumed from the commit and fed again
    from the state's low offsets. (The results committed, the second's, the second.)"""
    first, first_results = make()
    consumed = {"impression": 0, "feedback": 0}
    for kind, off, body in events[:cut]:
        first.feed(json.dumps(body).encode(), kind=kind, offset=off)
        first.tick()
        consumed[kind] = off + 1
    committed = list(first_results)
    state = first.state(0, consumed)
    snapshot = first.snapshot(0)
    if not keep_memory:
        state = PartitionState(**{**state.__dict__, "zero_feedback": None})
    state = PartitionState.from_json(json.loads(json.dumps(state.to_json())))
    second, second_results = make(**second_over)
    second.resume(0, state, consumed)
    second.load_snapshot(0, snapshot)
    for kind, off, body in events:
        if off >= state.committed[kind]:
            second.feed(json.dumps(body).encode(), kind=kind, offset=off)
            second.tick()
    second.drain()
    return committed, second_results, second


@pytest.mark.parametrize("cut", [150, 420, 700])
def test_a_restore_from_a_commit_equals_the_uninterrupted_run_exactly(cut: int) -> None:
    events = stream(5)
    reference, want = make()
    feed(reference, events)
    reference.drain()
    committed, after, restored = restored_run(events, cut)
    got = committed + after
    assert [r.request_id for r in got] == [r.request_id for r in want]
    assert [r.to_json() for r in got] == [r.to_json() for r in want]
    assert [r.to_json() for r in restored.zero_feedback_rows()] == [
        r.to_json() for r in reference.zero_feedback_rows()
    ]
    assert every_window(restored) == every_window(reference)


def every_window(engine: Engine) -> list[list]:
    """Every 5m window's sums over the stream's span (the exported rows show only the last)."""
    zero = engine.aggregates.zero
    assert zero is not None
    n = len(engine.segments)
    return [zero.sums(t, t + 5 * MIN, n).tolist() for t in range(0, 60 * MIN, 5 * MIN)]


def test_a_restore_without_the_memory_in_the_state_differs() -> None:
    """The negative control: the PartitionState field is what makes the restore exact."""
    events = stream(5)
    _, want = make()
    reference, want = make()
    feed(reference, events)
    reference.drain()
    committed, after, _ = restored_run(events, 420, keep_memory=False)
    got = committed + after
    assert [r.to_json() for r in got] != [r.to_json() for r in want]


def test_off_by_default_and_nothing_is_kept() -> None:
    config = load_config({})
    assert config.zero_feedback.depth == 0
    engine = Engine(config)
    assert engine.aggregates.zero is None and engine.zero_feedback_rows() == []
    assert engine.state(0, {"impression": 0, "feedback": 0}).zero_feedback is None


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"p": 1.0}, "zero_feedback.p"),
        ({"p": 0}, "zero_feedback.p"),
        ({"depth": -1}, "zero_feedback.depth"),
        ({"depth": 101}, "zero_feedback.depth"),
        ({"judged_capacity": 0}, "zero_feedback.judged_capacity"),
        ({"judged_capacity": 8193}, "zero_feedback.judged_capacity"),
        ({"reference_capacity": 1025}, "zero_feedback.reference_capacity"),
        ({"depth": 100, "reference_capacity": 100}, "zero_feedback.reference_capacity"),
        ({"reference": ""}, "zero_feedback.reference"),
        ({"deepth": 3}, "zero_feedback.deepth"),
    ],
)
def test_bad_settings_name_the_field(section: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config({"zero_feedback": section})


def test_the_batch_s_result_fields_equal_one_field_per_row() -> None:
    from evald.zerofeedback.component import result_field, result_fields

    values = np.array([[0.0, math.nan, 0.25], [1.0, 0.1, math.nan], [0.0, 1.0, 1.0]])
    got = list(result_fields(values))
    assert got == [result_field(row) for row in values.tolist()]
    assert got[0] == {"empty": 0.0, "unjudged": None, "rbo": 0.25}
    assert all(type(v) in (float, type(None)) for row in got for v in row.values())


def test_a_memory_switched_off_across_a_restart_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, _ = make()
    feed(first, stream(5)[:200])
    state = first.state(0, {"impression": 0, "feedback": 0})
    assert state.zero_feedback is not None
    off, _ = make(zero_feedback={"depth": 0})
    with caplog.at_level("WARNING", logger="evald.engine"):
        off.resume(0, state, {"impression": 0, "feedback": 0})
    (message,) = [r.getMessage() for r in caplog.records]
    assert "partition 0" in message and "engine.zero_feedback.depth, which is off" in message


@pytest.mark.parametrize("changed", [{"reference": "treatment"}, {"arm_label": "variant"}])
def test_references_of_another_arm_are_dropped_across_a_restart_with_a_warning(
    changed: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """``zero_feedback.reference`` (or ``arm_label``) changed across a restart: no list after
    it is compared with the old arm's references. Each RBO is the one a run with the new
    settings throughout gives, or none yet (that run had the new arm's references from before
    the restart); the old code compared the old arm's lists with their own (RBO 0.8 where the
    new settings give none)."""
    events = stream(5)
    for kind, _, body in events:  # another split of the lists under another label
        if kind == "impression":
            k = int(body["request_id"][1:])
            body["labels"]["variant"] = "control" if k % 3 == 0 else "treatment"
    new = {"zero_feedback": {**SETTINGS["zero_feedback"], **changed}}
    throughout, want = make(**new)
    feed(throughout, events)
    throughout.drain()
    wanted = {r.request_id: values(r)[2] for r in want}
    with caplog.at_level("WARNING", logger="evald.zerofeedback.component"):
        _, after, _ = restored_run(events, 420, **new)
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("partition 0: its checkpointed zero-feedback references")
    assert "zero_feedback.arm_label 'arm' -> " in message
    assert "zero_feedback.reference 'control' -> " in message
    compared = [values(r)[2] for r in after]
    assert all(x != x or x == wanted[r.request_id] for x, r in zip(compared, after, strict=True))
    assert sum(x == x for x in compared) > 50  # the new arm's references did come
