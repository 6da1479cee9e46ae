"""Prometheus rules: promtool validates them and runs the alert scenarios; names match the
exposition contract in docs/architecture.md."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from deploy_support import DEPLOY, REPO, load_yaml

from deploy.generator import render
from deploy.generator.spec import Spec, Thresholds
from deploy.generator.yamlout import dump

RULE_FILES = [DEPLOY / render.RECORDING_RULES, DEPLOY / render.ALERT_RULES]
TEST_FILES = [DEPLOY / render.QUALITY_TESTS, DEPLOY / render.PIPELINE_TESTS]

pytestmark = pytest.mark.prometheus


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_promtool_check_rules(promtool: str) -> None:
    proc = _run([promtool, "check", "rules", *map(str, RULE_FILES)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_check_config_loads_the_rules(promtool: str) -> None:
    proc = _run([promtool, "check", "config", str(DEPLOY / "prometheus/prometheus.yml")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for path in RULE_FILES:
        assert path.name in proc.stdout  # the glob in rule_files picked every file up


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_rule_unit_tests_pass(promtool: str, test_file: Path) -> None:
    proc = _run([promtool, "test", "rules", str(test_file)], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_silent_scenarios() -> None:
    alerts = {r["alert"] for g in load_yaml(RULE_FILES[1])["groups"] for r in g["rules"]}
    fired: dict[str, int] = {}
    silent: dict[str, int] = {}
    for path in TEST_FILES:
        for case in load_yaml(path)["tests"]:
            for check in case["alert_rule_test"]:
                target = fired if check.get("exp_alerts") else silent
                target[check["alertname"]] = target.get(check["alertname"], 0) + 1
    assert set(fired) == alerts
    assert set(silent) == alerts
    # besides its pending phase, every alert is checked silent on noise and on low traffic
    assert all(silent[a] >= 3 for a in alerts), silent


def _mutated_scenarios_fail(promtool: str, tmp_path: Path, spec: Spec) -> str:
    """Render rules with ``spec`` but keep the committed scenarios; promtool must object."""
    files = render.render_sources(spec)
    for name in (render.RECORDING_RULES, render.ALERT_RULES):
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(files[name])
    tests = tmp_path / render.PIPELINE_TESTS
    tests.parent.mkdir(parents=True, exist_ok=True)
    tests.write_text((DEPLOY / render.PIPELINE_TESTS).read_text())
    proc = _run([promtool, "test", "rules", str(tests)])
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("thresholds", "alert"),
    [
        (Thresholds(sequence_for="6h"), "EvaldTreatmentBelowControl"),
        (Thresholds(cusum_for="6h"), "EvaldTreatmentDropDetected"),
    ],
)
def test_scenarios_catch_comparison_alerts_that_do_not_fire(
    promtool: str, tmp_path: Path, thresholds: Thresholds, alert: str
) -> None:
    out = _mutated_scenarios_fail(promtool, tmp_path, replace(Spec(), thresholds=thresholds))
    assert alert in out


def test_scenarios_catch_a_missing_sample_guard(promtool: str, tmp_path: Path) -> None:
    out = _mutated_scenarios_fail(
        promtool, tmp_path, replace(Spec(), thresholds=Thresholds(ratio_min_events=0))
    )
    assert "EvaldHighRejectedRate" in out or "EvaldHighLateFeedbackRate" in out


# -- names ---------------------------------------------------------------------------------

_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_RECORDED = re.compile(r"\b[a-z]+:[a-z0-9_]+:[a-z0-9_]+\b")
_METRIC = re.compile(r"\bevald_[a-z0-9_]+\b")


def expressions(rules_files: list[Path]) -> list[str]:
    return [r["expr"] for p in rules_files for g in load_yaml(p)["groups"] for r in g["rules"]]


def names_in(expr: str) -> tuple[set[str], set[str]]:
    """(evald_* metric names, recorded series names) referenced by a PromQL expression."""
    bare = _QUOTED.sub('""', expr)
    recordings = set(_RECORDED.findall(bare))
    return set(_METRIC.findall(_RECORDED.sub(" ", bare))), recordings


def contract_series() -> set[str]:
    """Series names of the exposition table in docs/architecture.md, histograms expanded."""
    text = (REPO / "docs/architecture.md").read_text(encoding="utf-8")
    names: set[str] = set()
    for match in re.finditer(r"^\| `(evald_[a-z0-9_]+)` \| ([a-z]+)", text, re.MULTILINE):
        name, kind = match.groups()
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


def test_rules_use_only_contract_names_and_defined_recordings() -> None:
    recorded = {r["record"] for g in load_yaml(RULE_FILES[0])["groups"] for r in g["rules"]}
    contract = contract_series()
    assert "evald_window_sum_squares" in contract and "evald_measure_bucket" in contract
    for expr in expressions(RULE_FILES):
        metrics, recordings = names_in(expr)
        assert metrics <= contract, f"not in docs/architecture.md: {metrics - contract}"
        assert recordings <= recorded, f"not recorded: {recordings - recorded}"


def test_recording_rules_are_defined_before_use_within_their_group() -> None:
    """Prometheus evaluates a group in order: a rule reading a later rule sees stale data."""
    for group in load_yaml(RULE_FILES[0])["groups"]:
        seen: set[str] = set()
        defined_here = {r["record"] for r in group["rules"]}
        for rule in group["rules"]:
            _, recordings = names_in(rule["expr"])
            assert recordings & defined_here <= seen, rule["record"]
            seen.add(rule["record"])


def test_dashboard_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    """Grafana variables substituted, every dashboard query must parse in Prometheus."""
    from test_deploy_grafana import dashboard_queries, substitute_variables

    rules = [
        {"record": f"dashboard:query:q{i}", "expr": substitute_variables(expr)}
        for i, expr in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = _run([promtool, "check", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
