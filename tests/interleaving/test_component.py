import random

import pytest
from interleaved_stream import CONFIG, events, lines, plain_credit, plain_pairs

from evald.config import ConfigError, load_config
from evald.engine import Engine, Result


def run(stream, *, partitions: int = 1, seed: int = 0, **settings) -> tuple[Engine, list[Result]]:
    """The stream through one engine; with several partitions each impression and its
    feedback go to the partition of their request id, fed in random chunks with ticks."""
    results: list[Result] = []
    config = load_config({**CONFIG, **settings})
    engine = Engine(config, clock=lambda: 0.0, on_result=results.append, global_statistics=True)
    raws = lines(stream)
    rng = random.Random(seed)
    by_part: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for event, raw in zip(stream, raws, strict=True):
        by_part[int(event["request_id"][1:]) % partitions].append(raw)
    cursors = dict.fromkeys(by_part, 0)
    while any(cursors[p] < len(by_part[p]) for p in by_part):
        p = rng.choice([q for q in by_part if cursors[q] < len(by_part[q])])
        step = rng.randint(1, 400)
        chunk = by_part[p][cursors[p] : cursors[p] + step]
        cursors[p] += step
        assert engine.feed_batch(chunk, partition=p) == []
        if rng.random() < 0.3:
            engine.tick()
    engine.drain()
    return engine, results


@pytest.mark.parametrize("credit", ["clicks", "grades"])
def test_each_results_credit_equals_the_plain_computation(credit):
    stream = events()
    engine, results = run(stream, interleaving={**CONFIG["interleaving"], "credit": credit})
    expected = plain_credit(stream, credit)
    got = {r.request_id: r.to_json().get("interleaving") for r in results}
    assert len(got) == 3000
    assert {rid for rid, field in got.items() if field is None} == {
        f"r{i}" for i in range(9, 3000, 10)
    }
    assert {rid: f["credit"] for rid, f in got.items() if f is not None} == expected
    assert sum(engine.interleaving.outcomes.values()) == 2700
    assert engine.interleaving.outcomes["late"] == 0


def totals(engine: Engine) -> dict[tuple, dict[str, int]]:
    assert engine.interleaving.state is not None
    keys = ("lists", "lead_a", "wins_a", "wins_b", "ties")
    return {
        cell: {k: getattr(p.total, k) for k in keys}
        for cell, p in engine.interleaving.state.pairs.items()
    }


@pytest.mark.parametrize("multi", [False, True])
def test_the_folded_pairs_equal_the_plain_counts(multi):
    stream = events(multi=multi)
    engine, _ = run(stream)
    assert totals(engine) == plain_pairs(stream)
    if multi:  # the pairwise matrix of three rankers: every pair of a segment
        assert {cell[1:] for cell in totals(engine)} == {("A", "B"), ("A", "C"), ("B", "C")}


def test_any_partitioning_gives_the_same_state():
    stream = events()
    one, _ = run(stream)
    assert one.interleaving.state is not None
    for partitions, seed in ((3, 1), (5, 2)):
        other, _ = run(stream, partitions=partitions, seed=seed)
        assert other.interleaving.state is not None
        assert totals(other) == totals(one)
        for cell, pair in one.interleaving.state.pairs.items():
            mine = other.interleaving.state.pairs[cell]
            assert mine.total.users == pair.total.users
            assert mine.total.weighted == pytest.approx(pair.total.weighted, abs=1e-9)
            assert mine.bound.low == pytest.approx(pair.bound.low, abs=1e-12)
            assert (mine.winner, mine.p_value) == pytest.approx((pair.winner, pair.p_value))


def test_late_lists_are_counted_and_not_credited():
    stream = events(n=300)
    late = {
        "request_id": "r999999",
        "ts": stream[0]["ts"],
        "items": ["x", "y"],
        "teams": ["A", "B"],
        "interleaving": "team_draft",
        "labels": {"surface": "web"},
    }
    engine, results = run([*stream, late])
    assert engine.interleaving.outcomes["late"] == 1
    assert next(r for r in results if r.request_id == "r999999").interleaving is None


def test_lists_of_undeclared_teams_are_counted_and_not_credited():
    stream = events(n=300)
    engine, results = run(stream, interleaving={**CONFIG["interleaving"], "teams": ["A", "C"]})
    assert engine.interleaving.outcomes["unknown_team"] == 270
    assert all(r.interleaving is None for r in results)
    assert engine.interleaving.records() == []
    default, _ = run(stream, interleaving={})
    assert default.interleaving.outcomes["unknown_team"] == 270


@pytest.mark.parametrize("teams", [["A", "A"], ["A", ""], [f"t{i}" for i in range(17)]])
def test_bad_team_declarations_name_the_field(teams):
    with pytest.raises(ConfigError, match=r"interleaving\.teams"):
        load_config({"interleaving": {"teams": teams}})
