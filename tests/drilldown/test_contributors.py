"""``evald_drop_contributor``: the top three explanations of the served attribution as series,
scraped from an engine fed the seeded stream whose treatment is degraded for four known
queries (and the negative control, the same drop spread evenly), and from one whose treatment
(or control) degrades after an hour, a drop against its own baseline too."""

from __future__ import annotations

from typing import Any

import pytest
import test_baseline_attribution as onset
from prometheus_client import CollectorRegistry
from test_queries_replay import CONFIG, DEGRADED, events

from evald.config import EngineConfig, load_config
from evald.drilldown.contributors import per_segment
from evald.drilldown.outputs import served_attribution
from evald.engine import Engine
from evald.exposition.budget import SeriesShape
from evald.exposition.collector import EngineCollector

LABELS = ("comparison", "measure", "against", "rank", "dimension", "value")
#: (against, arm, surface, rank, dimension=value) -> share
Contributors = dict[tuple[str, str, str, str, str], float]


def served(config: dict[str, Any], lines: list[str]) -> tuple[Engine, Contributors]:
    """The engine fed the stream (not drained: what `evald run` serves) and its scraped
    contributors."""
    engine = Engine(load_config(config), clock=lambda: 0.0, global_statistics=True)
    for line in lines:
        engine.feed(line.encode())
    engine.tick()
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))  # type: ignore[arg-type]
    out: Contributors = {}
    for metric in registry.collect():
        for s in metric.samples:
            if s.name == "evald_drop_contributor":
                assert set(s.labels) == {*LABELS, "arm", "surface"}
                assert s.labels["comparison"] == "ab" and s.labels["measure"] == "RR"
                named = f"{s.labels['dimension']}={s.labels['value']}"
                labels = (s.labels[k] for k in ("against", "arm", "surface", "rank"))
                key = (*labels, named)
                assert key not in out, f"a duplicate series: {s.labels}"
                out[key] = s.value
    return engine, out


def expected(records: list[dict[str, Any]]) -> Contributors:
    """The first three explanations of each attribution record, keyed as :func:`served`."""
    return {
        (
            r["against"],
            r["arm"],
            r["segment"]["surface"],
            str(rank),
            f"{e['dimension']}={e['value']}",
        ): e["explanatory_power"]
        for r in records
        for rank, e in enumerate(r["explanations"][:3], 1)
    }


@pytest.fixture(scope="module")
def degraded() -> tuple[Engine, Contributors]:
    return served(CONFIG, events(27, spread=False))


def test_the_series_name_the_degraded_queries_with_their_share(degraded: Any) -> None:
    engine, got = degraded
    records = served_attribution(engine)
    assert records, "the drop is flagged and attributed"
    assert got == expected(records)
    assert {key[0] for key in got} == {"control"}
    assert {key[1] for key in got} == {"treatment"}
    assert {key[2] for key in got} == {"web", "app"}
    assert {key[3] for key in got} == {"1", "2", "3"}
    named = {key[4] for key in got}
    assert named and named <= {f"query={q}" for q in DEGRADED}
    for surface in ("web", "app"):  # the top three carry most of each segment's drop
        assert sum(v for k, v in got.items() if k[2] == surface) >= 0.5


def test_a_drop_spread_evenly_names_no_query() -> None:
    _, got = served(CONFIG, events(27, spread=True))
    assert not any(key[4].startswith("query=") for key in got)


def _kind(got: Contributors, against: str, arm: str) -> dict[tuple[str, str], float]:
    return {(k[3], k[4]): v for k, v in got.items() if k[:2] == (against, arm)}


def test_a_drop_flagged_against_control_and_baseline_has_two_top_threes() -> None:
    """The treatment degrades after an hour: flagged against the control and against its own
    baseline, attributed over different windows. Each kind is its own series, equal to its own
    record, so EvaldArmDropDetected names the baseline drop's explanations, not the others."""
    engine, got = served(onset.CONFIG, onset.events(31, spread=False))
    records = served_attribution(engine)
    assert {(r["against"], r["arm"]) for r in records} == {
        ("control", "treatment"),
        ("baseline", "treatment"),
    }
    assert got == expected(records)
    vs_control, vs_baseline = (
        _kind(got, "control", "treatment"),
        _kind(got, "baseline", "treatment"),
    )
    assert vs_control and vs_baseline and vs_control != vs_baseline
    for kind in (vs_control, vs_baseline):
        assert {named for _, named in kind} <= {f"query={q}" for q in onset.DEGRADED}


def test_the_control_arms_baseline_drop_is_named() -> None:
    """The control degrades after an hour: no drop against the control (the treatment is now
    the better one), a drop of the control against its own baseline, named under arm control."""
    engine, got = served(onset.CONFIG, onset.events(31, spread=False, dropping="control"))
    records = served_attribution(engine)
    assert [(r["against"], r["arm"]) for r in records] == [("baseline", "control")]
    assert got == expected(records)
    named = _kind(got, "baseline", "control")
    assert named and {n for _, n in named} <= {f"query={q}" for q in onset.DEGRADED}


def test_the_series_are_counted_in_the_budget() -> None:
    config = load_config(CONFIG)
    # 3 contributors x (treatment against control + control and treatment against their own
    # baselines) x 1 measure, per segment
    assert per_segment(config) == 9
    without = EngineConfig.model_validate({**CONFIG, "drilldown": {"capacity": 0}})
    assert per_segment(without) == 0
    assert SeriesShape.of(config).per_segment - SeriesShape.of(without).per_segment == 9
    two = {**CONFIG["statistics"]["comparisons"][0], "treatments": ["t1", "t2"]}
    wider = EngineConfig.model_validate(
        {
            **CONFIG,
            "measures": "RR,AP",
            "statistics": {**CONFIG["statistics"], "comparisons": [two]},
        }
    )
    # 3 x (2 treatments against control + 3 arms against their baselines) x 2 measures
    assert per_segment(wider) == 30
