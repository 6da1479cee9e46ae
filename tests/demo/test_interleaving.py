"""The demo's interleaving mode: a share of the simulated requests is one team-draft list of the
control and treatment rankers, and the engine's always-valid test on it, configured as
`evald demo` configures it, credits the better ranker (and decides nothing between identical
rankers: the negative control)."""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice
from typing import Any

from evald.config import load_config
from evald.demo import command
from evald.demo.simulator import (
    ARMS,
    DEFAULT_START_MS,
    IMPRESSION,
    INTERLEAVED,
    TEAMS,
    Faults,
    Simulator,
)
from evald.engine import Engine
from evald.interleaving.teams import TEAM_DRAFT, problem

MINUTE_MS = 60_000


def _impressions(sim: Simulator, limit: int) -> list[dict[str, Any]]:
    events = islice(sim.events(), limit)
    return [json.loads(e.value) for e in events if e.kind == IMPRESSION]


def test_a_share_of_the_lists_is_team_draft_of_the_two_rankers_with_its_own_labels() -> None:
    sim = Simulator(7, interleave=0.3, faults=Faults.none())
    shown = _impressions(sim, 20_000)
    mixed = [r for r in shown if "teams" in r]
    assert 0.25 < len(mixed) / len(shown) < 0.35
    models = dict(ARMS)
    for record in shown:
        labels = record["labels"]
        if "teams" not in record:  # an A/B list: its arm's model, no team data
            assert models[labels["arm"]] == labels["model"] and "interleaving" not in record
            continue
        assert (labels["arm"], labels["model"]) == INTERLEAVED
        assert record["interleaving"] == TEAM_DRAFT
        assert problem(record["items"], record["teams"], TEAM_DRAFT, None) is None
        teams = record["teams"]
        assert len(teams) == len(record["items"]) == len(set(record["items"]))
        # team draft: each round of two places one item of each ranker, either first
        for k in range(0, len(teams), 2):
            assert sorted(teams[k : k + 2]) == sorted(TEAMS)
    # the draft's coin: the control leads about half of the lists
    leads = Counter(r["teams"][0] for r in mixed)
    assert abs(leads[TEAMS[0]] - leads[TEAMS[1]]) < 4 * len(mixed) ** 0.5


def test_no_share_is_the_traffic_without_interleaving() -> None:
    """interleave=0 draws nothing from the interleaving stream: the A/B traffic is unchanged,
    and the A/B lists of an interleaving run are the same users' arms as before."""
    plain = list(islice(Simulator(3).events(), 5_000))
    assert plain == list(islice(Simulator(3, interleave=0.0).events(), 5_000))
    clean = Faults.none()
    before = _impressions(Simulator(3, faults=clean), 20_000)
    arm_of_user = {r["user_id"]: r["labels"]["arm"] for r in before}
    for record in _impressions(Simulator(3, faults=clean, interleave=0.5), 20_000):
        arm = record["labels"]["arm"]
        if arm != INTERLEAVED[0] and record["user_id"] in arm_of_user:
            assert arm_of_user[record["user_id"]] == arm


def _verdicts(noise: tuple[float, float], seed: int) -> list[dict[str, Any]]:
    """25 event minutes of the demo's traffic (its share, its faults) through an engine with
    the demo's settings; the interleaving test's records at the end."""
    config = load_config(
        window="5m",
        lateness="2m",
        statistics=command.STATISTICS,
        interleaving=command.INTERLEAVING,
    )
    sim = Simulator(
        seed,
        stop_ms=DEFAULT_START_MS + 25 * MINUTE_MS,
        noise=noise,
        interleave=command.DEFAULT_INTERLEAVE,
    )
    engine = Engine(config, global_statistics=True)
    for n, event in enumerate(sim.events(), 1):
        engine.feed(event.value, kind=event.kind, timestamp=event.at_ms)
        if n % 10_000 == 0:
            engine.tick()
    engine.drain()
    return engine.interleaving.records()


def test_the_demo_interleaving_verdict_goes_to_the_better_ranker() -> None:
    """The treatment's ranker (noise 0.7 against 1.0) wins on every surface within 25 minutes
    of event time (25 wall seconds of the demo at its default speed)."""
    records = _verdicts((1.0, 0.7), 0)
    assert {r["segment"]["surface"] for r in records} == {"web", "app"}
    for r in records:
        assert (r["team_a"], r["team_b"]) == TEAMS
        assert r["winner"] == TEAMS[1], r
        assert r["preference"] < 0 < r["wins"][TEAMS[1]] - r["wins"][TEAMS[0]]


def test_identical_rankers_do_not_decide() -> None:
    """The negative control: the same traffic with the control's ranker on both sides has its
    bands published (enough compared lists) and holding 0, and no winner."""
    records = _verdicts((1.0, 1.0), 0)
    assert len(records) == 2
    for r in records:
        assert r["compared"] > 1_000 and r["lower"] is not None
        assert r["winner"] is None and r["lower"] < 0 < r["upper"], r
