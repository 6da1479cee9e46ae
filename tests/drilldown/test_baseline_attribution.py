"""`evald replay --format json`: the attribution of an arm's CUSUM against its own trailing
baseline (what EvaldArmDropDetected fires on), on a stream whose treatment degrades for a known
set of queries after an hour, and on a negative control where the same drop is spread evenly
over every query."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from ab_comparison import ab_config

from evald.cli import main
from evald.events import parse_timestamp

MIN = 60_000
ONSET = 60 * MIN
#: the degraded queries: the 2nd to 5th most frequent
DEGRADED = {f"query {i}" for i in (1, 2, 3, 4)}
CONFIG = ab_config(["5m"], baseline_windows=6)


def events(seed: int, *, spread: bool, n: int = 13_500, dropping: str = "treatment") -> list[str]:
    """``n`` lists over 90 minutes, arms alternating, one surface, queries Zipf-like among 100.
    A click at rank 1 (RR 1) with probability 0.6; from ``ONSET`` on, the ``dropping`` arm's
    lists of the degraded queries get it at rank 4 (RR 0.25). ``spread``: from ``ONSET`` on,
    every list of that arm is degraded with the probability that gives the same drop instead."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 101)
    weights /= weights.sum()
    share = float(sum(weights[i] for i in (1, 2, 3, 4)))
    lines = []
    for k in range(n):
        ts, rid = k * 400, f"r{k}"
        q = int(rng.choice(100, p=weights))
        arm = "treatment" if k % 2 else "control"
        body = {"request_id": rid, "ts": ts, "items": list("abcde"), "query": f"Query {q}"}
        lines.append(json.dumps({**body, "labels": {"arm": arm, "surface": "web"}}))
        if rng.random() < 0.6:
            late = arm == dropping and ts >= ONSET
            degraded = late and (rng.random() < share if spread else q in (1, 2, 3, 4))
            item = "d" if degraded else "a"
            click = {"request_id": rid, "ts": ts + 1_000, "item": item, "action": "click"}
            lines.append(json.dumps(click))
    return lines


def replay(tmp: Path, lines: list[str]) -> dict[str, Any]:
    stream, config, summary = tmp / "events.jsonl", tmp / "config.yaml", tmp / "summary.json"
    stream.write_text("\n".join(lines) + "\n")
    config.write_text(yaml.safe_dump(CONFIG))
    with summary.open("w") as out, contextlib.redirect_stdout(out):
        assert main(["replay", str(stream), "--config", str(config), "--format", "json"]) == 0
    doc: dict[str, Any] = json.loads(summary.read_text())
    return doc


def _treatment_baseline(summary: dict[str, Any]) -> dict[str, Any]:
    """The treatment's against-baseline record: the CUSUM's run, from about the onset to the
    window where it crossed (within 30 minutes), is what is compared with the windows before."""
    (record,) = [
        r for r in summary["attribution"] if r["against"] == "baseline" and r["arm"] == "treatment"
    ]
    assert (record["segment"], record["measure"], record["treatment"]) == (
        {"surface": "web"},
        "RR",
        "treatment",
    )
    start, end = parse_timestamp(record["window_start"]), parse_timestamp(record["window_end"])
    assert ONSET - 10 * MIN <= start <= ONSET < end <= ONSET + 30 * MIN, record
    return record


def test_the_baseline_attribution_ranks_the_degraded_queries_first(tmp_path: Path) -> None:
    summary = replay(tmp_path, events(31, spread=False))
    record = _treatment_baseline(summary)
    queries = [e for e in record["explanations"] if e["dimension"] == "query"]
    assert queries and record["explanations"][: len(queries)] == queries
    assert len(queries) >= 2 and {e["value"] for e in queries} <= DEGRADED
    assert sum(e["explanatory_power"] for e in queries) >= 0.67
    for e in queries:
        assert e["mean"] < e["baseline_mean"] - 0.3
    # the control arm did not move: no record of its own baseline drop
    assert not [r for r in summary["attribution"] if r["arm"] == "control"]


def test_a_baseline_drop_spread_evenly_is_explained_by_no_query(tmp_path: Path) -> None:
    """Negative control: the same drop over every query, detected alike, names none."""
    record = _treatment_baseline(replay(tmp_path, events(31, spread=True)))
    assert record["explanations"] == []
