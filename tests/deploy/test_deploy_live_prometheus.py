"""A real Prometheus server (Debian's package) scrapes `evald demo` with the compose scrape
config and the generated rules: every recording rule returns values, every rule evaluates
without error, and every dashboard query runs."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_support import DEPLOY, load_yaml
from live_support import SCRAPE_INTERVAL_S, http_get, query, start_prometheus, wait_until
from test_deploy_grafana import dashboard_queries, substitute_variables

from deploy.generator import render
from deploy.generator.spec import DEFAULT_MEASURES, Spec
from evald.demo.simulator import INTERLEAVED

pytestmark = pytest.mark.prometheus

RECORDED = [
    r["record"] for g in load_yaml(DEPLOY / render.RECORDING_RULES)["groups"] for r in g["rules"]
]


@pytest.fixture(scope="module")
def prometheus(
    prometheus_bin: str, demo_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("prometheus")
    target = demo_url.removeprefix("http://")
    proc, base = start_prometheus(prometheus_bin, tmp, target)
    try:
        yield base
    finally:
        proc.stop()


def _values(base: str, expr: str) -> list[tuple[dict[str, str], float]]:
    return [(r["metric"], float(r["value"][1])) for r in query(base, expr)]


def test_prometheus_scrapes_evald(prometheus: str) -> None:
    up = wait_until(lambda: _values(prometheus, 'up{job="evald"} == 1'), 60, "target up")
    assert len(up) == 1


def test_every_recording_rule_returns_values(prometheus: str) -> None:
    pending = set(RECORDED)

    def done() -> bool:
        for name in sorted(pending):
            if query(prometheus, name):
                pending.discard(name)
        return not pending

    try:
        wait_until(done, 90, "values for every recording rule", step=1.0)
    except TimeoutError:
        pytest.fail(f"recording rules without values: {sorted(pending)}")


def test_recorded_means_are_per_measure_and_arm_and_plausible(prometheus: str) -> None:
    spec = Spec()
    for name in (
        "segment:evald_measure:mean5m",
        "arm:evald_measure:mean1h",
        "segment:evald_window:mean",
        "arm:evald_window:mean",
    ):
        rows = wait_until(lambda n=name: _values(prometheus, n), 60, name)
        assert {m["measure"] for m, _ in rows} == set(DEFAULT_MEASURES), name
        # the demo's interleaved lists are a segment of their own (evald/demo/simulator.py)
        arms = {spec.control, spec.treatment, INTERLEAVED[0]}
        assert {m[spec.arm_label] for m, _ in rows} == arms, name
        assert all(0.0 <= v <= 1.0 for _, v in rows), name
    ratios = _values(prometheus, "arms:evald_measure:treatment_control_ratio5m")
    assert {m["measure"] for m, _ in ratios} == set(DEFAULT_MEASURES)
    assert all(spec.arm_label not in m and 0 < v < 10 for m, v in ratios)
    bounds = _values(prometheus, "arms:evald_window:treatment_minus_control_ci_bound")
    assert bounds and all(0 < v < 1 and math.isfinite(v) for _, v in bounds)


def _by_segment(base: str, expr: str, at: float) -> dict[tuple[str, ...], float]:
    keys = ("measure", "arm", "surface")
    return {
        tuple(m[k] for k in keys): float(v)
        for m, v in ((r["metric"], r["value"][1]) for r in query(base, expr, at))
    }


def test_window_mean_rule_equals_the_sums_at_its_evaluation_time(prometheus: str) -> None:
    """Recomputed from the raw window gauges at the rule's own evaluation timestamp (or one
    scrape earlier, if a scrape landed while the rule ran), the recorded mean is exact."""
    stamped = wait_until(
        lambda: query(prometheus, 'timestamp(arm:evald_window:mean{window="1h"})'),
        60,
        "a recorded 1h window mean",
    )
    at = float(stamped[0]["value"][1])
    recorded = _by_segment(prometheus, 'arm:evald_window:mean{window="1h"}', at)
    candidates = []
    for t in (at, at - SCRAPE_INTERVAL_S):
        sums = _by_segment(
            prometheus, 'sum by (measure, arm, surface) (evald_window_sum{window="1h"})', t
        )
        counts = _by_segment(
            prometheus, 'sum by (measure, arm, surface) (evald_window_count{window="1h"})', t
        )
        candidates.append({k: sums[k] / counts[k] for k in sums if counts.get(k)})
    assert len(recorded) >= len(DEFAULT_MEASURES) * 2
    for key, value in recorded.items():
        assert any(key in c and math.isclose(value, c[key], rel_tol=1e-9) for c in candidates), (
            key,
            value,
            [c.get(key) for c in candidates],
        )


def test_every_rule_evaluates_without_error(prometheus: str) -> None:
    def evaluated() -> list[dict] | None:
        status, body = http_get(f"{prometheus}/api/v1/rules")
        groups = json.loads(body)["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        ready = all(not r["lastEvaluation"].startswith("0001") for r in rules)
        return rules if status == 200 and ready else None

    rules = wait_until(evaluated, 60, "every rule evaluated once")
    assert len(rules) == len(RECORDED) + sum(
        len(g["rules"]) for g in load_yaml(DEPLOY / render.ALERT_RULES)["groups"]
    )
    broken = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not broken


def test_the_treatment_alert_condition_catches_the_demo_regression(prometheus: str) -> None:
    """The demo degrades the treatment ranker mid-run; the alert's own expression, unchanged,
    must flag it on real evald data: the always-valid band on treatment − control since the
    start falls below minus the minimum effect for every alerting measure (the demo's
    nDCG@10 and RR) on every surface. Before the regression the treatment is better, so the
    band is above zero and nothing is flagged."""
    rules = load_yaml(DEPLOY / render.ALERT_RULES)["groups"][0]["rules"]
    (alert,) = [r for r in rules if r["alert"] == "EvaldTreatmentBelowControl"]
    seen: list[tuple[set[tuple[str, str]], set[tuple[str, str]]]] = []

    def flagged_everywhere() -> list[dict] | None:
        # the surfaces the comparison has seen, read on every poll: the first window can lack
        # a rare surface
        compared = query(prometheus, "evald_comparison_difference")
        surfaces = {r["metric"]["surface"] for r in compared}
        everywhere = {(m, s) for m in ("nDCG@10", "RR") for s in surfaces}
        rows = query(prometheus, alert["expr"])
        seen.append(({(r["metric"]["measure"], r["metric"]["surface"]) for r in rows}, everywhere))
        return rows if len(surfaces) >= 2 and seen[-1][0] == everywhere else None

    try:
        flagged = wait_until(flagged_everywhere, 90, "every alerting measure flagged everywhere")
    except TimeoutError:
        pytest.fail(f"flagged, wanted: {seen[-1] if seen else None}")
    assert {r["metric"]["comparison"] for r in flagged} == {"demo"}
    assert {r["metric"]["arm"] for r in flagged} == {"treatment"}


def test_dashboard_band_equals_the_engines_own_confidence_interval(prometheus: str) -> None:
    """Bound to one segment, the dashboard's band (from the exported sums of squares) has the
    half-width evald itself exports as evald_window_ci95_halfwidth."""
    from test_deploy_grafana import panels

    rows = wait_until(
        lambda: query(prometheus, 'evald_window_ci95_halfwidth{measure="nDCG@10", window="5m"}'),
        60,
        "exported half-widths",
    )
    segment = rows[0]["metric"]
    selector = ", ".join(f'{k}="{v}"' for k, v in segment.items() if k != "__name__")
    # the time of the scrape that wrote this series: every series below comes from it
    (stamp,) = query(prometheus, f"timestamp(evald_window_ci95_halfwidth{{{selector}}})")
    at = float(stamp["value"][1])
    (panel,) = [p for p in panels() if p["title"] == "nDCG@10"]
    bound = {}
    for target in panel["targets"]:
        if "ci95" in target["legendFormat"]:
            expr = target["expr"].replace("$window", "5m")
            for label in ("job", *Spec().segment_labels):
                expr = expr.replace(f"${label}", segment[label])
            (row,) = query(prometheus, expr, at)
            bound[target["legendFormat"].rsplit(" ", 1)[1]] = float(row["value"][1])
    (exported,) = query(prometheus, f"evald_window_ci95_halfwidth{{{selector}}}", at)
    half = (bound["upper"] - bound["lower"]) / 2
    assert half > 0
    assert math.isclose(half, float(exported["value"][1]), rel_tol=1e-9)


def test_every_dashboard_query_runs_and_quality_panels_have_data(prometheus: str) -> None:
    wait_until(lambda: _values(prometheus, "evald_window_sum"), 60, "window series")
    empty_quality = []
    for expr in dashboard_queries():
        rows = query(prometheus, substitute_variables(expr).replace('window="1h"', 'window="5m"'))
        if "evald_window_sum{" in expr and "offset" not in expr and not rows:
            empty_quality.append(expr)
    assert not empty_quality
