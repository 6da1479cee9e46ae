"""`evald replay`'s summary: overall and per-segment means with 95% intervals, text and JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evald.cli import main
from evald.demo.simulator import Simulator
from evald.stats import Z95


def _traffic(path: Path, n: int = 6000) -> Path:
    from itertools import islice

    with path.open("wb") as fh:
        for event in islice(Simulator(5, run_id="sum").events(), n):
            fh.write(event.value + b"\n")
    return path


def test_json_summary_intervals_equal_the_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Computed independently from the per-impression results: numpy over the results file."""
    events, results = _traffic(tmp_path / "events.jsonl"), tmp_path / "results.jsonl"
    argv = ["replay", str(events), "--results", str(results), "--format", "json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    by_segment: dict[tuple[str, ...], list[float]] = {}
    for line in results.read_text().splitlines():
        result = json.loads(line)
        labels = result["labels"]
        key = tuple(labels.get(k, "__none__") for k in ("model", "arm", "surface"))
        by_segment.setdefault(key, []).append(result["measures"]["nDCG@10"])
    assert len(doc["segments"]) == len(by_segment) >= 4
    for row in doc["segments"]:
        values = np.asarray(by_segment[tuple(row["labels"].values())])
        got = row["measures"]["nDCG@10"]
        assert row["n"] == got["n"] == len(values)
        assert got["mean"] == pytest.approx(values.mean())
        assert got["ci95_halfwidth"] == pytest.approx(
            Z95 * values.std(ddof=1) / math.sqrt(len(values))
        )
    everything = np.concatenate([np.asarray(v) for v in by_segment.values()])
    assert doc["means"]["nDCG@10"]["mean"] == pytest.approx(everything.mean())
    assert doc["lines"] == 6000 and doc["abandoned"] > 0 and "invalid_json" in doc["rejected"]


def test_text_summary_lists_segments_with_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(_traffic(tmp_path / "e.jsonl", 3000))]) == 0
    text = capsys.readouterr().out
    assert "means (± 95% interval):" in text and "per segment (mean ± 95% interval):" in text
    lines = text.splitlines()
    heads = [line for line in lines if line.startswith("  model=")]
    assert any("arm=control" in h for h in heads) and any("arm=treatment" in h for h in heads)
    first = lines.index(heads[0])
    assert lines[first + 1].startswith("    nDCG@10") and " ± " in lines[first + 1]


def test_json_summary_goes_to_stderr_when_stdout_carries_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = _traffic(tmp_path / "e.jsonl", 1000)
    assert main(["replay", str(events), "--results", "-", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.err)["lines"] == 1000
    assert all(json.loads(line)["request_id"] for line in captured.out.splitlines())


def test_replay_folds_the_configured_comparison_from_the_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The comparison's arm counts and difference equal numpy over the results file (every
    complete 5-minute window since the start is folded; a drain completes the last one)."""
    events, results = _traffic(tmp_path / "events.jsonl", 20_000), tmp_path / "results.jsonl"
    config = tmp_path / "engine.yaml"
    config.write_text(
        "statistics:\n"
        "  window: 5m\n"
        "  min_n: 30\n"
        "  comparisons:\n"
        "    - {name: ab, label: arm, control: control, treatments: [treatment],\n"
        "       start: 2026-01-01, arm_scoped_labels: [model], min_effect: {nDCG@10: 0.01}}\n"
    )
    argv = ["replay", str(events), "--results", str(results), "--config", str(config)]
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    values: dict[tuple[str, str], list[float]] = {}
    for line in results.read_text().splitlines():
        result = json.loads(line)
        key = (result["labels"]["arm"], result["labels"]["surface"])
        values.setdefault(key, []).append(result["measures"]["nDCG@10"])
    records = [r for r in doc["comparisons"] if r["measure"] == "nDCG@10"]
    assert {r["segment"]["surface"] for r in records} == {"web", "app"}
    for r in records:
        surface = r["segment"]["surface"]
        control, treatment = values[("control", surface)], values[("treatment", surface)]
        assert (r["n_control"], r["n_treatment"]) == (len(control), len(treatment))
        assert r["difference"] == pytest.approx(np.mean(treatment) - np.mean(control))
        assert r["lower"] < r["difference"] < r["upper"]
        assert not r["intersection_empty"]  # the difference is the same all along
        assert r["lower"] <= r["intersection_lower"] < r["intersection_upper"] <= r["upper"]
        assert r["alpha"] == pytest.approx(0.05 / 2)  # one alerting measure x two surfaces
    assert main(["replay", str(events), "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert "comparisons (always-valid 95% confidence sequence" in text
    assert "ab treatment vs control surface=web nDCG@10: Δ" in text
    assert "running intersection [" in text
