"""The interleaving series of a scrape equal replay's records, value for value."""

from __future__ import annotations

from interleaved_stream import CONFIG, events, lines
from prometheus_client.parser import text_string_to_metric_families as parse_text

from evald.config import load_config
from evald.engine import Engine
from evald.exposition import Encoder, build_registry


def test_the_series_are_the_records() -> None:
    engine = Engine(load_config(CONFIG), clock=lambda: 0.0, global_statistics=True)
    assert engine.feed_batch(lines(events(n=1500))) == []
    engine.drain()
    records = engine.interleaving.records()
    assert len(records) == 2
    body, _ = Encoder().encode(build_registry(engine, process=False)[0])
    got: dict[tuple[str, tuple[str, ...]], float] = {}
    for family in parse_text(body.decode()):
        for sample in family.samples:
            if sample.name.startswith("evald_interleaving_"):
                labels = sample.labels
                key = (
                    labels["surface"],
                    labels["team_a"],
                    labels["team_b"],
                    labels.get("team", ""),
                )
                got[(sample.name, key)] = sample.value
    expected: dict[tuple[str, tuple[str, ...]], float] = {}
    for r in records:
        cell = (r["segment"]["surface"], r["team_a"], r["team_b"])
        for part in ("preference", "lower", "upper", "p_value", "alpha", "srm_p_value", "ties"):
            expected[(f"evald_interleaving_{part}", (*cell, ""))] = r[part]
        expected[("evald_interleaving_compared_lists", (*cell, ""))] = r["compared"]
        expected[("evald_interleaving_verdict", (*cell, ""))] = 1.0 if r["winner"] == "A" else -1.0
        for team, wins in r["wins"].items():
            expected[("evald_interleaving_wins", (*cell, team))] = wins
    assert got == expected
    assert all(r["winner"] == "A" for r in records)
