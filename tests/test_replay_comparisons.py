"""`evald replay` answers the incident questions of a comparison: when the band first excluded
0, when each CUSUM (against control, against each arm's baseline) first crossed its threshold,
in event time with the values at that look; ``--looks`` writes every look; ``--help`` shows how
to configure a comparison, and a misplaced or misspelt setting gets a "did you mean"."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from evald.cli import main
from evald.config import load_config
from evald.demo.simulator import DEFAULT_START_MS, Faults, Simulator

HALF = 20 * 60_000
CONFIG = {
    "window": "5m",
    "lateness": "2m",
    "statistics": {
        "window": "5m",
        "comparisons": [
            {
                "name": "ab",
                "label": "arm",
                "control": "control",
                "treatments": ["treatment"],
                "start": 0,
                "arm_scoped_labels": ["model"],
                "min_effect": {"nDCG@10": 0.01},
            }
        ],
    },
}


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """40 minutes of the demo's traffic, the treatment worse after 20: replayed once with
    ``--looks`` and the JSON summary."""
    tmp = tmp_path_factory.mktemp("replay")
    sim = Simulator(
        21,
        rate=1500,
        speed=60,
        stop_ms=DEFAULT_START_MS + 2 * HALF,
        regress_at_ms=DEFAULT_START_MS + HALF,
        noise=(1.0, 0.7),
        faults=Faults(malformed=0.0),
    )
    events = tmp / "events.jsonl"
    events.write_bytes(b"".join(e.value + b"\n" for e in sim))
    config = tmp / "ab.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    looks = tmp / "looks.jsonl"
    summary = tmp / "summary.json"
    argv = ["replay", str(events), "--config", str(config), "--looks", str(looks)]
    with summary.open("w") as out, contextlib.redirect_stdout(out):
        assert main([*argv, "--format", "json"]) == 0
    return {
        "events": events,
        "config": config,
        "summary": json.loads(summary.read_text()),
        "looks": [json.loads(line) for line in looks.read_text().splitlines()],
    }


def _key(record: dict[str, Any]) -> tuple[str, str, str]:
    return (record["treatment"], json.dumps(record["segment"]), record["measure"])


def test_every_look_is_written_and_the_last_is_the_summary(replayed: dict[str, Any]) -> None:
    looks, records = replayed["looks"], replayed["summary"]["comparisons"]
    keys = {_key(r) for r in records}
    windows = max(r["window"] for r in looks)
    assert windows == records[0]["window"] >= 8
    assert len(looks) == windows * len(keys)  # one line per look and sequence
    last = {_key(r): r for r in looks if r["window"] == windows}
    for record in records:
        assert last[_key(record)] == record


def test_the_first_looks_agree_with_the_looks_file(replayed: dict[str, Any]) -> None:
    """Each "first" is the first look where the signal holds, read back from --looks."""
    looks, records = replayed["looks"], replayed["summary"]["comparisons"]
    h = load_config(CONFIG).statistics.cusum_h
    fired = 0
    for record in records:
        mine = [r for r in looks if _key(r) == _key(record)]
        first = record["first"]

        def first_where(holds: Any, mine: list[dict[str, Any]] = mine) -> int | None:
            return next((r["window"] for r in mine if holds(r)), None)

        excluded = first_where(
            lambda r: r["lower"] is not None and not r["lower"] <= 0 <= r["upper"]
        )
        assert (first["excluded"] or {}).get("window") == excluded
        crossed = first_where(lambda r: r["cusum_vs_control"] > h)
        assert (first["cusum_vs_control"] or {}).get("window") == crossed
        for arm in ("control", "treatment"):
            baseline = first_where(lambda r, a=arm: (r["cusum_vs_baseline"][a] or 0) > h)
            assert (first["cusum_vs_baseline"][arm] or {}).get("window") == baseline
        if first["cusum_vs_control"] is not None:
            fired += 1
            look = next(r for r in mine if r["window"] == crossed)
            assert first["cusum_vs_control"]["statistic"] == look["cusum_vs_control"]
            end = first["cusum_vs_control"]["end"]
            assert end == look["end"] and end.endswith("Z")
        if first["excluded"] is not None:
            look = next(r for r in mine if r["window"] == excluded)
            assert first["excluded"]["lower"] == look["lower"]
            assert first["excluded"]["n_treatment"] == look["n_treatment"]
    assert fired >= 1  # the injected regression is crossed


def test_the_regression_is_answered_in_event_time(replayed: dict[str, Any]) -> None:
    """The CUSUM against control crosses within three windows of the change; the control's
    own baseline CUSUM never does; the variance is clustered by user (the simulator's users)."""
    records = replayed["summary"]["comparisons"]
    ndcg = [r for r in records if r["measure"] == "nDCG@10"]
    assert ndcg and all(r["variance"] == "user" for r in records)
    for r in ndcg:
        crossed = r["first"]["cusum_vs_control"]
        assert crossed is not None
        assert 0 <= crossed["end_ms"] - (DEFAULT_START_MS + HALF) <= 15 * 60_000
        assert r["first"]["cusum_vs_baseline"]["control"] is None
        assert r["first"]["below"] is not None


def test_the_text_summary_says_when(
    replayed: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", str(replayed["events"]), "--config", str(replayed["config"])]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "band first excluded 0: window" in text
    assert re.search(r"CUSUM vs control [0-9.]+: crossed at window \d+ \(to 2026-", text)
    assert "CUSUM vs baseline, control" in text and "never crossed" in text
    assert "variance clustered by user" in text
    assert "band first below −0.01: window" in text


def test_looks_without_a_comparison_and_misplaced_settings_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "e.jsonl"
    events.write_text("")
    names = ("looks", "results", "windows", "queries", "rejected")
    outputs = {name: tmp_path / f"{name}.jsonl" for name in names}
    argv = [f"--{name}={path}" for name, path in outputs.items()]
    assert main(["replay", str(events), *argv]) == 2
    assert capsys.readouterr().err == (
        "evald replay: --looks: no comparison is configured (a statistics block with "
        "comparisons in --config; see evald replay --help)\n"
    )
    # refused before any output is opened: no empty file left to mistake for a replay's
    assert [path for path in outputs.values() if path.exists()] == []
    wrong = {
        "comparisons": CONFIG["statistics"]["comparisons"],  # type: ignore[index]
        "statistics": {"window": "5m", "alpah": 0.1},
    }
    config = tmp_path / "wrong.yaml"
    config.write_text(yaml.safe_dump(wrong))
    assert main(["replay", str(events), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "comparisons: unknown setting (did you mean statistics.comparisons?" in err
    assert "statistics.alpah: unknown setting (did you mean statistics.alpha?)" in err


def test_help_shows_a_comparison_that_is_valid_as_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What `evald replay --help` shows is enough: its statistics block loads as it is."""
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = capsys.readouterr().out
    start = text.index("  label_keys:")
    block = text[start : text.index("  evald replay events.jsonl --config", start)]
    config = load_config(yaml.safe_load(block))
    (comparison,) = config.statistics.comparisons
    assert comparison.treatments == ["treatment"] and comparison.min_effect == {"nDCG@10": 0.01}
    assert "--looks" in text


def test_the_help_comparison_compares_the_arms_of_the_traffic_evald_produce_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Copied onto the demo's traffic, where each arm has its own model, the help's block
    must compare the arms: with `model` a segment key not summed away, every comparison
    segment held one arm only (n 0/881, SRM p 1e-209)."""
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = capsys.readouterr().out
    start = text.index("  label_keys:")
    block = yaml.safe_load(text[start : text.index("  evald replay events.jsonl --config", start)])
    block["statistics"]["window"] = "5m"
    block["statistics"]["comparisons"][0]["start"] = 0
    sim = Simulator(3, rate=1500, speed=60, stop_ms=DEFAULT_START_MS + 8 * 60_000)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(e.value + b"\n" for e in sim))
    config = tmp_path / "ab.yaml"
    config.write_text(yaml.safe_dump(block))
    assert main(["replay", str(events), "--config", str(config), "--format", "json"]) == 0
    looks = json.loads(capsys.readouterr().out)["comparisons"]
    assert looks and all(look["n_control"] > 0 and look["n_treatment"] > 0 for look in looks)


def test_a_segment_with_one_arm_is_list_level_for_too_few_lists_not_for_user_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each arm of the demo's traffic has its own model: with `model` a segment key, each
    comparison segment holds one arm. Its lists have user ids; the text must not say they
    have none (it did: "variance list level (no user ids)" beside 881 lists with a user)."""
    comparison = {"name": "ab", "label": "arm", "control": "control", "treatments": ["treatment"]}
    config = {
        "label_keys": ["arm", "model", "surface"],
        "statistics": {"window": "5m", "comparisons": [{**comparison, "start": 0}]},
    }
    sim = Simulator(3, rate=1500, speed=60, stop_ms=DEFAULT_START_MS + 8 * 60_000)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(e.value + b"\n" for e in sim))
    path = tmp_path / "ab.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["replay", str(events), "--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert "variance list level (too few lists in an arm)" in text, text
    assert "no user ids" not in text
    # a band is also held back for lists worth too few users and for SE² 0: not "n too small"
    assert " no band yet (too few lists or users, or no variance)" in text, text
