"""`evald replay --format json`: the drop attribution over the labels that are not segment keys,
on a stream whose treatment is degraded only on one device (the segments are arm and surface),
and on a negative control whose degradation is spread evenly over the devices."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ab_comparison import ab_config
from label_stream import events

from evald.cli import main
from evald.config import load_config
from evald.drilldown.outputs import served_attribution
from evald.engine import Engine

CONFIG = ab_config()


def replay(tmp: Path, lines: list[str], config: dict[str, Any] = CONFIG) -> dict[str, Any]:
    stream, path, summary = tmp / "events.jsonl", tmp / "config.yaml", tmp / "summary.json"
    stream.write_text("\n".join(lines) + "\n")
    path.write_text(yaml.safe_dump(config))
    with summary.open("w") as out, contextlib.redirect_stdout(out):
        assert main(["replay", str(stream), "--config", str(path), "--format", "json"]) == 0
    doc: dict[str, Any] = json.loads(summary.read_text())
    return doc


def _drops(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The treatment-against-control attribution of each comparison segment (web and app)."""
    records = [r for r in summary["attribution"] if r["against"] == "control"]
    assert sorted(r["segment"]["surface"] for r in records) == ["app", "web"]
    return records


@pytest.fixture(scope="module")
def degraded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return replay(tmp_path_factory.mktemp("degraded"), events(27, spread=False))


def test_the_label_value_carrying_the_drop_is_ranked_first(degraded: Any) -> None:
    for record in _drops(degraded):
        first = record["explanations"][0]
        assert (first["dimension"], first["value"]) == ("device", "android"), record
        assert first["explanatory_power"] > 0.8
        assert first["mean"] < first["baseline_mean"] - 0.3
        # nothing else carries it: no other device, browser, session or query is named
        assert [(e["dimension"], e["value"]) for e in record["explanations"]] == [
            ("device", "android")
        ]


def test_a_drop_spread_evenly_over_the_devices_names_none(tmp_path: Path) -> None:
    """Negative control: the same overall drop on every device names no label value."""
    summary = replay(tmp_path, events(27, spread=True))
    for record in _drops(summary):
        assert record["explanations"] == [], record


def test_without_label_summaries_the_label_is_not_seen(tmp_path: Path) -> None:
    """``drilldown.label_keys: 0``: no label summaries, so the device cannot be named (what
    the attribution did before the labels reached it)."""
    lines = events(27, spread=False, n=4_000)
    config = {**CONFIG, "drilldown": {"label_keys": 0}}
    for record in _drops(replay(tmp_path, lines, config)):
        assert not [e for e in record["explanations"] if e["dimension"] == "device"]
    (tmp_path / "on").mkdir()
    for record in _drops(replay(tmp_path / "on", lines)):  # the same lines, summarised
        assert record["explanations"][0]["value"] == "android"


def _without_queries(lines: list[str]) -> list[str]:
    return [json.dumps({k: v for k, v in json.loads(x).items() if k != "query"}) for x in lines]


def test_a_stream_without_queries_has_its_drop_named_by_the_label(tmp_path: Path) -> None:
    """A recommender's lists carry no query: the windows of the drop are those holding lists,
    not those holding queries (there are none), so the device is still named, in the replay's
    summary and in what a running engine serves (only complete windows)."""
    lines = _without_queries(events(27, spread=False))
    summary = replay(tmp_path, lines)
    assert summary["queries"] == []
    for record in _drops(summary):
        named = [(e["dimension"], e["value"]) for e in record["explanations"]]
        assert named == [("device", "android")], record
    engine = Engine(load_config(CONFIG), clock=lambda: 0.0, global_statistics=True)
    for line in lines:
        engine.feed(line.encode())
    engine.tick()
    served = [r for r in served_attribution(engine) if r["against"] == "control"]
    assert served and all(
        [(e["dimension"], e["value"]) for e in r["explanations"]] == [("device", "android")]
        for r in served
    )
