"""The simulator is a pure generator whose traffic has the shape the demo promises."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from typing import Any

import pytest

from evald.demo.simulator import (
    ARMS,
    DEFAULT_START_MS,
    FEEDBACK,
    IMPRESSION,
    ClickModel,
    Faults,
    SimEvent,
    Simulator,
)

HOUR_MS = 3_600_000


def _parse(events: list[SimEvent]) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Impressions by request id and feedback in order; every record must be valid JSON."""
    impressions: dict[str, dict[str, Any]] = {}
    feedback: list[dict[str, Any]] = []
    for event in events:
        record = json.loads(event.value)
        if event.kind == IMPRESSION:
            impressions[record["request_id"]] = record
        else:
            feedback.append(record)
    return impressions, feedback


@pytest.fixture(scope="module")
def clean_traffic() -> list[SimEvent]:
    """Half an hour of event time without injected faults."""
    sim = Simulator(11, faults=Faults.none(), stop_ms=DEFAULT_START_MS + HOUR_MS // 2)
    return list(sim)


def test_same_seed_same_bytes_and_other_seed_differs() -> None:
    first = list(itertools.islice(Simulator(5), 5_000))
    again = list(itertools.islice(Simulator(5), 5_000))
    other = list(itertools.islice(Simulator(6), 5_000))
    assert first == again
    assert [e.value for e in first] != [e.value for e in other]
    # iterating the same object twice restarts the same stream
    sim = Simulator(5)
    assert list(itertools.islice(sim, 100)) == list(itertools.islice(sim, 100)) == first[:100]


def test_arrival_order_and_keys(clean_traffic: list[SimEvent]) -> None:
    arrivals = [e.at_ms for e in clean_traffic]
    assert arrivals == sorted(arrivals)
    assert arrivals[0] >= DEFAULT_START_MS
    for event in clean_traffic[:2_000]:
        record = json.loads(event.value)
        assert event.key == record["request_id"].encode()
        assert record["ts"] <= event.at_ms  # nothing arrives before it happened
        assert event.kind in (IMPRESSION, FEEDBACK)
        assert ("items" in record) == (event.kind == IMPRESSION)


def test_arrival_order_holds_at_high_request_rates() -> None:
    """Thousands of requests per event-time second spread feedback over many calendar buckets."""
    sim = Simulator(9, rate=200_000, speed=1, faults=Faults.none())
    assert sim.qps > 10_000
    events = list(itertools.islice(sim, 150_000))
    arrivals = [e.at_ms for e in events]
    assert arrivals == sorted(arrivals)
    seen: set[bytes] = set()
    for event in events:
        if event.kind == IMPRESSION:
            seen.add(event.key)
        else:
            assert event.key in seen  # clean traffic: never before its impression
    assert len({e.value for e in events}) == len(events)  # nothing emitted twice


def test_feedback_follows_its_impression_within_the_delay_cap(
    clean_traffic: list[SimEvent],
) -> None:
    impressions, feedback = _parse(clean_traffic)
    seen: set[str] = set()
    cap = ClickModel().max_delay_ms
    for event in clean_traffic:
        record = json.loads(event.value)
        if event.kind == IMPRESSION:
            seen.add(record["request_id"])
            continue
        # clean traffic: no orphans, no unknown items, the impression arrived first
        assert record["request_id"] in seen
        served = impressions[record["request_id"]]
        assert served["items"][record["position"] - 1] == record["item"]
        assert 0 <= record["ts"] - served["ts"] <= cap
    lags = sorted(f["ts"] - impressions[f["request_id"]]["ts"] for f in feedback)
    # seconds for most, minutes for some: the join must wait
    assert lags[len(lags) // 2] < 60_000
    assert lags[int(len(lags) * 0.99)] > 5 * 60_000


def test_funnel_cart_after_click_purchase_after_cart(clean_traffic: list[SimEvent]) -> None:
    _, feedback = _parse(clean_traffic)
    when: dict[tuple[str, str, str], int] = {}
    for record in feedback:
        when[(record["request_id"], record["item"], record["action"])] = record["ts"]
    actions = Counter(action for _, _, action in when)
    assert actions["click"] > actions["add_to_cart"] > actions["purchase"] > 0
    for (rid, item, action), ts in when.items():
        if action == "add_to_cart":
            assert when[(rid, item, "click")] <= ts
        elif action == "purchase":
            assert when[(rid, item, "add_to_cart")] <= ts


def test_clicks_are_position_biased(clean_traffic: list[SimEvent]) -> None:
    impressions, feedback = _parse(clean_traffic)
    clicks = Counter(f["position"] for f in feedback if f["action"] == "click")
    ctr = {rank: clicks[rank] / len(impressions) for rank in (1, 2, 5, 10, 20)}
    assert ctr[1] > ctr[2] > ctr[5] > ctr[10] > ctr[20]
    assert ctr[1] > 2 * ctr[5]


def test_treatment_ranks_better_than_control_until_the_regression() -> None:
    """The treatment's top result is clicked more often; after the regression, less often."""
    start, half = DEFAULT_START_MS, 20 * 60_000
    sim = Simulator(3, faults=Faults.none(), stop_ms=start + 2 * half, regress_at_ms=start + half)
    impressions, feedback = _parse(list(sim))
    shown: Counter[tuple[str, bool]] = Counter()
    top_clicks: Counter[tuple[str, bool]] = Counter()
    for record in impressions.values():
        shown[(record["labels"]["arm"], record["ts"] >= start + half)] += 1
    for record in feedback:
        if record["action"] == "click" and record["position"] == 1:
            served = impressions[record["request_id"]]
            top_clicks[(served["labels"]["arm"], served["ts"] >= start + half)] += 1
    rate = {k: top_clicks[k] / shown[k] for k in shown}
    assert rate[("treatment", False)] > rate[("control", False)]
    assert rate[("treatment", True)] < rate[("control", True)] * 0.8
    # control is untouched by the regression (same model, same noise)
    assert rate[("control", True)] == pytest.approx(rate[("control", False)], rel=0.1)


def test_labels_and_stable_arm_per_user(clean_traffic: list[SimEvent]) -> None:
    impressions, _ = _parse(clean_traffic)
    arm_of_user: dict[str, str] = {}
    models = dict(ARMS)
    arms = Counter()
    for record in impressions.values():
        labels = record["labels"]
        assert set(labels) == {"model", "arm", "surface"}
        assert models[labels["arm"]] == labels["model"]
        assert arm_of_user.setdefault(record["user_id"], labels["arm"]) == labels["arm"]
        arms[labels["arm"]] += 1
        assert len(record["items"]) == len(set(record["items"])) == 20
    share = arms["treatment"] / sum(arms.values())
    assert 0.45 < share < 0.55


def test_rate_is_events_per_wall_second() -> None:
    """`rate` events per wall second at `speed`: event-time span / speed gives the wall span."""
    sim = Simulator(2, rate=1_000, speed=30, stop_ms=DEFAULT_START_MS + 2 * HOUR_MS)
    events = list(sim)
    wall_seconds = 2 * HOUR_MS / 1000 / 30  # requests stop at stop_ms; their feedback counts
    assert len(events) / wall_seconds == pytest.approx(1_000, rel=0.1)


def test_stop_bounds_the_stream() -> None:
    stop = DEFAULT_START_MS + 10 * 60_000
    events = list(Simulator(4, stop_ms=stop))
    impressions, feedback = _parse([e for e in events if e.key != b"malformed"])
    assert impressions and feedback
    assert max(r["ts"] for r in impressions.values()) < stop
    # feedback of the last requests still arrives after the stop
    assert max(e.at_ms for e in events) > stop


def test_default_faults_show_in_the_stream() -> None:
    events = list(Simulator(8, stop_ms=DEFAULT_START_MS + HOUR_MS // 2))
    values = Counter(e.value for e in events)
    malformed = 0
    impressions: dict[str, list[str]] = {}
    feedback: list[dict[str, Any]] = []
    event_ids: Counter[str] = Counter()
    for event in events:
        try:
            record = json.loads(event.value)
        except ValueError:
            malformed += 1
            continue
        if not isinstance(record, dict) or event.key == b"malformed":
            malformed += 1
            continue
        if event.kind == IMPRESSION:
            impressions[record["request_id"]] = record["items"]
        else:
            feedback.append(record)
            event_ids[record["event_id"]] += 1
    duplicated_impressions = sum(1 for value, n in values.items() if n > 1 and b'"items"' in value)
    orphans = {f["request_id"] for f in feedback} - set(impressions)
    unknown = [
        f
        for f in feedback
        if f["request_id"] in impressions and f["item"] not in impressions[f["request_id"]]
    ]
    late_arrivals = defaultdict(int)
    for event in events:
        if event.kind == FEEDBACK and event.key != b"malformed":
            late_arrivals[event.at_ms - json.loads(event.value)["ts"] > 2 * 60_000] += 1
    assert malformed > 0
    assert duplicated_impressions > 0
    assert any(n > 1 for n in event_ids.values())
    assert orphans
    assert unknown
    assert late_arrivals[True] > 0
    # still mostly clean
    assert malformed < 0.01 * len(events)
    assert late_arrivals[True] < 0.05 * late_arrivals[False]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        Simulator(rate=0)
    with pytest.raises(ValueError):
        Simulator(speed=-1)
    with pytest.raises(ValueError):
        Simulator(rate=float("nan"))
