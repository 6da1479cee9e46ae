"""``evald_drop_contributor``: the top three explanations of the served attribution as series,
scraped from an engine fed the seeded stream whose treatment is degraded for four known
queries (and the negative control, the same drop spread evenly)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from test_queries_replay import CONFIG, DEGRADED, events

from evald.config import EngineConfig, load_config
from evald.drilldown.contributors import per_segment
from evald.drilldown.outputs import served_attribution
from evald.engine import Engine
from evald.exposition.budget import SeriesShape
from evald.exposition.collector import EngineCollector

LABELS = ("comparison", "measure", "rank", "dimension", "value")
Contributors = dict[tuple[str, str, str, str], float]


def served(seed: int, *, spread: bool) -> tuple[Engine, Contributors]:
    """The engine fed the stream (not drained: what `evald run` serves) and its scraped
    contributors, (arm, surface, rank, dimension=value) -> share."""
    engine = Engine(load_config(CONFIG), clock=lambda: 0.0, global_statistics=True)
    for line in events(seed, spread=spread):
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
                key = (s.labels["arm"], s.labels["surface"], s.labels["rank"], named)
                out[key] = s.value
    return engine, out


@pytest.fixture(scope="module")
def degraded() -> tuple[Engine, Contributors]:
    return served(27, spread=False)


def test_the_series_name_the_degraded_queries_with_their_share(degraded: Any) -> None:
    engine, got = degraded
    records = served_attribution(engine)
    assert records, "the drop is flagged and attributed"
    want = {
        (r["treatment"], r["segment"]["surface"], str(rank), f"{e['dimension']}={e['value']}"): e[
            "explanatory_power"
        ]
        for r in records
        for rank, e in enumerate(r["explanations"][:3], 1)
    }
    assert got == want
    assert {key[0] for key in got} == {"treatment"}
    assert {key[1] for key in got} == {"web", "app"}
    assert {key[2] for key in got} == {"1", "2", "3"}
    named = {key[3] for key in got}
    assert named and named <= {f"query={q}" for q in DEGRADED}
    for surface in ("web", "app"):  # the top three carry most of each segment's drop
        assert sum(v for k, v in got.items() if k[1] == surface) >= 0.5


def test_a_drop_spread_evenly_names_no_query() -> None:
    _, got = served(27, spread=True)
    assert not any(key[3].startswith("query=") for key in got)


def test_the_series_are_counted_in_the_budget() -> None:
    config = load_config(CONFIG)
    # 3 contributors x (control + treatment) x 1 measure, per segment
    assert per_segment(config) == 6
    without = EngineConfig.model_validate({**CONFIG, "drilldown": {"capacity": 0}})
    assert per_segment(without) == 0
    assert SeriesShape.of(config).per_segment - SeriesShape.of(without).per_segment == 6
