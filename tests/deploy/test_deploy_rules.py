"""Prometheus rules: promtool validates them and runs the alert scenarios; names match the
exposition contract in docs/architecture.md."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from deploy_support import DEPLOY, REPO, load_yaml

from deploy.generator import render
from deploy.generator.spec import Spec, Thresholds
from deploy.generator.yamlout import dump

RULE_FILES = [DEPLOY / render.RECORDING_RULES, DEPLOY / render.ALERT_RULES]
TEST_FILES = [DEPLOY / render.ALERT_TESTS]

pytestmark = pytest.mark.prometheus


#: promtool's rule unit tests allocate fast: Go's default GOGC=100 collected 802 times in one
#: run of the scenarios, 160 at 400, for a heap peak of 125 MB instead of 70 MB; the run's CPU
#: time, in alternating runs on a busy machine, 38-39 s before and 30-32 s after (with more
#: scatter through pytest). The results do not depend on it.
GOGC = "400"


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GOGC": GOGC}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


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


#: alerts whose input does not depend on traffic (the scrape's ``up``, ``evald_ready``): a
#: real fault fires and a short blip ("noise") stays silent; low traffic and a traffic change
#: give them no different input
TRAFFIC_FREE = {"EvaldDown", "EvaldAbsent", "EvaldNotReady", "EvaldTLSCertificateExpiresSoon"}
#: a scenario's name starts with what it shows: the alert fires on a real fault, or stays
#: silent on noise, at low traffic, and when the traffic changes with nothing wrong
KINDS = ("fault", "noise", "low traffic", "traffic change")


def scenario_checks() -> dict[str, dict[str, set[str]]]:
    """alert -> {"fires" | "silent": the kinds of scenario checking it so}."""
    out: dict[str, dict[str, set[str]]] = {}
    for path in TEST_FILES:
        for case in load_yaml(path)["tests"]:
            kind, _, _ = case["name"].partition(": ")
            assert kind in KINDS, f"scenario {case['name']!r} does not start with one of {KINDS}"
            for check in case["alert_rule_test"]:
                outcome = "fires" if check.get("exp_alerts") else "silent"
                alert = out.setdefault(check["alertname"], {"fires": set(), "silent": set()})
                alert[outcome].add(kind)
    return out


def test_every_alert_fires_on_a_fault_and_is_silent_on_noise_low_traffic_and_a_change() -> None:
    alerts = {r["alert"] for g in load_yaml(RULE_FILES[1])["groups"] for r in g["rules"]}
    checks = scenario_checks()
    assert set(checks) == alerts
    for alert in sorted(alerts):
        assert checks[alert]["fires"] == {"fault"}, alert
        wanted = {"noise"} if alert in TRAFFIC_FREE else {"noise", "low traffic", "traffic change"}
        assert wanted <= checks[alert]["silent"], (alert, checks[alert]["silent"])


def test_the_treatment_below_control_alert_states_its_family_wise_error_rate() -> None:
    from deploy.generator import rules

    for alpha, text in ((0.05, "rate 5% over"), (0.01, "rate 1% over"), (0.005, "rate 0.5% over")):
        spec = replace(Spec(), thresholds=Thresholds(family_alpha=alpha))
        (rule,) = [
            r
            for g in rules.alert_groups(spec)
            for r in g["rules"]
            if r["alert"] == "EvaldTreatmentBelowControl"
        ]
        assert text in rule["annotations"]["description"]
    committed = {r["alert"]: r for g in load_yaml(RULE_FILES[1])["groups"] for r in g["rules"]}
    description = committed["EvaldTreatmentBelowControl"]["annotations"]["description"]
    assert "Family-wise error rate 5% over every treatment, alerting measure and segment" in (
        " ".join(description.split())
    )


def _mutated_scenarios_fail(promtool: str, tmp_path: Path, spec: Spec) -> str:
    """Render rules with ``spec`` but keep the committed scenarios; promtool must object."""
    files = render.render_sources(spec)
    for name in (render.RECORDING_RULES, render.ALERT_RULES):
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(files[name])
    tests = tmp_path / render.ALERT_TESTS
    tests.parent.mkdir(parents=True, exist_ok=True)
    tests.write_text((DEPLOY / render.ALERT_TESTS).read_text())
    proc = _run([promtool, "test", "rules", str(tests)])
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


@pytest.mark.long
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


@pytest.mark.long
def test_scenarios_catch_a_missing_sample_guard(promtool: str, tmp_path: Path) -> None:
    out = _mutated_scenarios_fail(
        promtool, tmp_path, replace(Spec(), thresholds=Thresholds(ratio_min_events=0))
    )
    assert "EvaldHighRejectedRate" in out or "EvaldHighLateFeedbackRate" in out


#: EvaldTreatmentBelowControl as it was while it joined per instance (before issue #14)
PER_INSTANCE_BELOW = """(
  evald_comparison_upper
  + on (job, instance, comparison, measure) group_left ()
  evald_comparison_min_effect
) < 0
unless on (job, instance, comparison, surface)
(evald_comparison_srm_p_value < 0.001)"""


def _two_instance_scenario() -> dict:
    (case,) = [
        c
        for c in load_yaml(TEST_FILES[0])["tests"]
        if c["name"].startswith("fault: two instances export the same drop")
    ]
    return case


def test_the_two_instance_scenario_expects_each_comparison_alert_once_without_instance() -> None:
    case = _two_instance_scenario()
    instances = {
        re.search(r'instance="([^"]+)"', s["series"]).group(1) for s in case["input_series"]
    }
    assert len(instances) == 2
    firing = [c for c in case["alert_rule_test"] if c.get("exp_alerts")]
    assert {c["alertname"] for c in firing} >= {
        "EvaldTreatmentBelowControl",
        "EvaldTreatmentDropDetected",
    }
    for check in firing:
        (alert,) = check["exp_alerts"]
        assert "instance" not in alert["exp_labels"]


def test_negative_control_a_per_instance_alert_fires_once_per_instance(
    promtool: str, tmp_path: Path
) -> None:
    """The two-instance scenario's inputs are not vacuous: the expression that joined per
    instance fires on them twice, one alert series per instance."""
    case = _two_instance_scenario()
    name = "EvaldTreatmentBelowControl"
    committed = {r["alert"]: r for g in load_yaml(RULE_FILES[1])["groups"] for r in g["rules"]}
    rule = {**committed[name], "expr": PER_INSTANCE_BELOW}
    (rules_path := tmp_path / "per-instance.rules.yml").write_text(
        dump({"groups": [{"name": "per-instance", "rules": [rule]}]})
    )
    (check,) = [
        c for c in case["alert_rule_test"] if c["alertname"] == name and c.get("exp_alerts")
    ]
    (once,) = check["exp_alerts"]
    instances = sorted(
        {re.search(r'instance="([^"]+)"', s["series"]).group(1) for s in case["input_series"]}
    )
    twice = [{**once, "exp_labels": {**once["exp_labels"], "instance": i}} for i in instances]
    scenario = {
        "rule_files": [rules_path.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                **case,
                "alert_rule_test": [{**check, "exp_alerts": twice}],
            }
        ],
    }
    (test_path := tmp_path / "per-instance.test.yml").write_text(dump(scenario))
    proc = _run([promtool, "test", "rules", str(test_path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: the drop alerts, whose ``contributors`` annotation names the drop's top three
DROP_ALERTS = ("EvaldTreatmentBelowControl", "EvaldTreatmentDropDetected", "EvaldArmDropDetected")
#: the contributor scenarios, by the start of their name
TWO_DROPS, CONTROL_ARM = "fault: a drop attributed by two", "fault: the control arm drops"


def _contributor_scenario(name: str = TWO_DROPS) -> dict:
    (case,) = [c for c in load_yaml(TEST_FILES[0])["tests"] if c["name"].startswith(name)]
    return case


def _named(case: dict) -> dict[tuple[str, str], str]:
    """(alert, arm) -> the contributors annotation the scenario expects."""
    out = {}
    for check in case["alert_rule_test"]:
        (alert,) = check["exp_alerts"]
        key = (check["alertname"], alert["exp_labels"]["arm"])
        out[key] = alert["exp_annotations"]["contributors"]
    return out


def test_the_contributor_scenarios_expect_the_three_largest_of_each_drop_in_order() -> None:
    against_control = (
        "query=running shoes (50% of the drop); query=rain jacket (25% of the drop); "
        "query=tent (20% of the drop)"
    )
    assert _named(_contributor_scenario()) == {
        ("EvaldTreatmentBelowControl", "treatment"): against_control,
        ("EvaldTreatmentDropDetected", "treatment"): against_control,
        ("EvaldArmDropDetected", "treatment"): "query=hiking boots (55% of the drop); "
        "query=running shoes (15% of the drop); query=stove (12% of the drop)",
    }
    assert _named(_contributor_scenario(CONTROL_ARM)) == {
        ("EvaldArmDropDetected", "control"): "query=umbrella (40% of the drop); "
        "surface=app (30% of the drop); query=boots (20% of the drop)",
    }


def test_each_drop_alert_reads_the_contributors_of_the_drop_it_fires_on() -> None:
    against = {"EvaldArmDropDetected": "baseline"}
    for rule in load_yaml(RULE_FILES[1])["groups"][0]["rules"]:
        if rule.get("alert") in DROP_ALERTS:
            kind = against.get(rule["alert"], "control")
            assert f"against='{kind}'" in rule["annotations"]["contributors"], rule["alert"]


#: the rules' matchers, in the order of the annotation's printf arguments, without ``against``
_MATCHERS = "job=%q, comparison=%q, measure=%q, arm=%q, surface=%q"
_TOP = "sort_desc(topk(3, max without (instance, pod, rank) (evald_drop_contributor{"


def _swap(query: str) -> str:
    """The query of the other kind of drop."""
    kinds = {"'control'": "'baseline'", "'baseline'": "'control'"}
    return re.sub("'control'|'baseline'", lambda m: kinds[m.group()], query)


_EVERY_ROW = "every instance's rows, not the top three"
_MEASURE = "another measure's contributors"
_BOTH = "both kinds of drop, against not matched"
_OTHER = "the other kind of drop"
_CONTROL = "the control arm: both kinds of drop, against not matched"


@pytest.mark.parametrize(
    ("what", "scenario", "rewrite"),
    [
        (_EVERY_ROW, TWO_DROPS, lambda q: f"evald_drop_contributor{{{_MATCHERS}}}"),
        (_MEASURE, TWO_DROPS, lambda q: q.replace("measure=%q", "measure!=%q")),
        (_BOTH, TWO_DROPS, lambda q: f"{_TOP}{_MATCHERS}}})))"),
        (_OTHER, TWO_DROPS, _swap),
        (_CONTROL, CONTROL_ARM, lambda q: f"{_TOP}{_MATCHERS}}})))"),
    ],
    ids=(_EVERY_ROW, _MEASURE, _BOTH, _OTHER, _CONTROL),
)
def test_negative_control_an_annotation_not_naming_the_top_three_fails(
    promtool: str, tmp_path: Path, what: str, scenario: str, rewrite: Callable[[str], str]
) -> None:
    """The contributor scenarios are not vacuous: promtool expands the annotation's query
    against their series, and an annotation reading them otherwise is refused."""
    committed = load_yaml(RULE_FILES[1])
    for group in committed["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in DROP_ALERTS:
                template = rule["annotations"]["contributors"]
                start, end = template.index('printf "') + 8, template.index('" $labels.job ')
                query = rewrite(template[start:end])
                rule["annotations"]["contributors"] = template[:start] + query + template[end:]
    (rules_path := tmp_path / "alerts.rules.yml").write_text(dump(committed))
    case = _contributor_scenario(scenario)
    scenario_file = {"rule_files": [rules_path.name], "evaluation_interval": "1m", "tests": [case]}
    (test_path := tmp_path / "contributors.test.yml").write_text(dump(scenario_file))
    proc = _run([promtool, "test", "rules", str(test_path)])
    assert proc.returncode != 0, what
    assert "contributors=" in proc.stdout + proc.stderr


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
