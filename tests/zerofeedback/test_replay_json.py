"""`evald replay --format json`: the zero-feedback values per window and segment, equal to the
series ``evald_zero_feedback_mean`` / ``_lists`` of the same engine drained."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_engine_signals import SETTINGS, make, stream

from evald.cli import main
from evald.exposition.collector import EngineCollector


def summary(tmp: Path, events: list[tuple[str, int, dict]], settings: dict[str, Any]) -> Any:
    path, config, out = tmp / "events.jsonl", tmp / "config.yaml", tmp / "summary.json"
    path.write_text("".join(json.dumps(body) + "\n" for _, _, body in events))
    config.write_text(yaml.safe_dump(settings))
    with out.open("w") as f, contextlib.redirect_stdout(f):
        assert main(["replay", str(path), "--config", str(config), "--format", "json"]) == 0
    return json.loads(out.read_text())


def series(events: list[tuple[str, int, dict]]) -> dict[tuple[str, str, str, str], float]:
    """(name, arm, quantity, window) -> value scraped from an engine fed the same events."""
    engine, _ = make()
    for kind, offset, body in events:  # one tick at the end: a tick per event takes seconds
        engine.feed(json.dumps(body).encode(), kind=kind, offset=offset)
    engine.drain()
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))  # type: ignore[arg-type]
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith("evald_zero_feedback_"):
                key = (s.name, s.labels["arm"], s.labels["quantity"], s.labels["window"])
                out[key] = s.value
    return out


def test_the_summary_holds_the_series_values_per_window_and_segment(tmp_path: Path) -> None:
    events = stream(3)
    doc = summary(tmp_path, events, SETTINGS)
    want = series(events)
    got = {}
    for entry in doc["zero_feedback"]:
        assert entry["end_ms"] - entry["start_ms"] in (5 * 60_000, 10 * 60_000)
        arm, window = entry["labels"]["arm"], entry["window"]
        for quantity, mean in entry["mean"].items():
            got[("evald_zero_feedback_lists", arm, quantity, window)] = entry["lists"][quantity]
            if mean is not None:
                got[("evald_zero_feedback_mean", arm, quantity, window)] = mean
    assert want and got == want
    arms = {(e["labels"]["arm"], e["window"]) for e in doc["zero_feedback"]}
    assert arms == {(a, w) for a in ("control", "treatment") for w in ("5m", "10m")}
    # the stream's treatment changed its lists: its RBO with control is low, control's absent
    treatment = next(
        e for e in doc["zero_feedback"] if e["labels"]["arm"] == "treatment" and e["window"] == "5m"
    )
    assert treatment["mean"]["rbo"] < 0.5 and treatment["lists"]["rbo"] > 0


def test_no_key_with_the_signals_off(tmp_path: Path) -> None:
    doc = summary(tmp_path, stream(3, n=100), {**SETTINGS, "zero_feedback": {"depth": 0}})
    assert "zero_feedback" not in doc
