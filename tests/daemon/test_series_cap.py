"""`evald run` on a real broker fed 10,000 distinct label combinations: the exposition stays at
the segment cap and the folded impressions are counted (issue: hostile input, label combinations).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable

import pytest
from child_processes import die_with_parent
from kafka_harness import ENGINE, KafkaTools, free_port, wait_until
from kafka_instances import Instance

from evald.config import EngineConfig

pytestmark = pytest.mark.kafka

COMBINATIONS = 10_000
KEPT = 200  # the default max_segments
BASE_MS = 1_763_683_200_000


def labels_of(i: int) -> dict[str, str]:
    """10,000 distinct (model, arm, surface) combinations, every key within its 50-value cap."""
    return {"model": f"m{i % 50}", "arm": f"a{i // 50 % 50}", "surface": f"s{i // 2500}"}


def impression(request_id: str, i: int, ts: int) -> bytes:
    """An impression with the labels of combination ``i``."""
    doc = {"request_id": request_id, "ts": ts, "items": ["x", "y", "z"], "labels": labels_of(i)}
    return json.dumps(doc).encode()


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample line of a text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        assert match, line
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', match[2] or ""))
        out.append((match[1], labels, float(match[3])))
    return out


def scrape(run: Instance) -> list[tuple[str, dict[str, str], float]] | None:
    """The parsed /metrics of a running ``evald run``; None while it does not answer."""
    assert run.proc.poll() is None, "evald run exited"
    status, text = run.get("/metrics", timeout=30)
    return parse(text) if status == 200 else None


def total(samples: list[tuple[str, dict[str, str], float]], name: str) -> float:
    return sum(value for sample, _, value in samples if sample == name)


def test_ten_thousand_label_combinations_stay_at_the_segment_cap(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    run = instances()
    kafka_tools.create({f"imp-{unique}": 1, f"fb-{unique}": 1})
    records = [impression(f"r{i}", i, BASE_MS + 6 * i) for i in range(COMBINATIONS)]
    # later impressions of a kept combination move the watermark past every window above: a
    # time moves it once a whole block of events has reached it, which two blocks' worth of
    # events always hold (watermark_quorum: docs/semantics.md §3)
    quorum = EngineConfig.model_fields["watermark_quorum"].default
    records += [impression(f"push{k}", 0, BASE_MS + 2 * 3_600_000 + k) for k in range(2 * quorum)]
    kafka_tools.produce_raw(f"imp-{unique}", records)

    def finalized() -> list[tuple[str, dict[str, str], float]] | None:
        samples = scrape(run)
        done = samples and total(samples, "evald_impressions_finalized_total") == COMBINATIONS
        return samples if done else None

    samples = wait_until(finalized, 180, f"{COMBINATIONS} impressions finalized")

    kept = KEPT
    overflow = {"model": "__other__", "arm": "__other__", "surface": "__other__"}
    counts = [labels for name, labels, _ in samples if name == "evald_measure_count"]
    segments = {tuple(sorted((k, v) for k, v in lab.items() if k != "measure")) for lab in counts}
    assert len(segments) == kept + 1
    # first come, first kept: one partition, so the first 200 combinations in offset order
    assert {dict(s)["model"] + dict(s)["arm"] for s in segments} - {"__other____other__"} == {
        labels_of(i)["model"] + labels_of(i)["arm"] for i in range(kept)
    }
    assert total(samples, "evald_segments_overflow_total") == COMBINATIONS - kept
    folded = [
        value
        for name, labels, value in samples
        if name == "evald_measure_count" and labels.items() >= overflow.items()
    ]
    assert folded and all(value == COMBINATIONS - kept for value in folded)

    from evald.config import load_config
    from evald.exposition import SeriesShape

    config = load_config(ENGINE)
    assert config.max_segments == KEPT
    engine_series = [s for s in samples if s[0].startswith("evald_") and s[0] not in DAEMON]
    shape = SeriesShape.of(config)
    # one watermark series for the one input partition comes on top of the settings' bound
    assert len(engine_series) <= shape.worst_case(kept) + 1
    assert len(samples) < 2 * shape.worst_case(kept)
    assert run.terminate() == 0


#: series of the daemon's own collector (not bounded by the engine's settings)
DAEMON = {
    "evald_ready",
    "evald_consumer_lag",
    "evald_backpressure_pauses_total",
    "evald_dlq_records_total",
    "evald_results_produced_total",
}


def test_a_segment_cap_over_the_series_budget_exits_2_naming_the_field() -> None:
    """Refused before any broker is contacted (the bootstrap address is never reached)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evald",
            "run",
            "--bootstrap-servers",
            f"127.0.0.1:{free_port()}",
            "--impressions-topic",
            "i",
            "--feedback-topic",
            "f",
            "--results-topic",
            "r",
            "--dlq-topic",
            "d",
            "--group-id",
            "g",
            "--set",
            "engine.max_segments=100000",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=die_with_parent,
    )
    assert proc.returncode == 2, proc.stderr
    assert "engine.max_segments: " in proc.stderr
    assert "over max_series" in proc.stderr and "lower max_segments to" in proc.stderr
