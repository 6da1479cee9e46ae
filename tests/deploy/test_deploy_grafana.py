"""The Grafana dashboard and its provisioning files."""

from __future__ import annotations

import json
import re
from typing import Any

from deploy_support import DEPLOY, load_yaml

from deploy.generator import render
from deploy.generator.spec import DEFAULT_MEASURES, Spec
from evald.exposition.series import COMPARISON_SERIES, SEGMENT

DASHBOARD_PATH = DEPLOY / render.DASHBOARD


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_PATH.read_text(encoding="utf-8"))


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_queries() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def substitute_variables(expr: str) -> str:
    """Grafana's template variables replaced by values Prometheus accepts."""
    expr = expr.replace("$__rate_interval", "1m").replace("$window", "1h")
    return re.sub(r"\$[a-z_]+", ".*", expr)


def test_uid_is_fixed_and_the_json_is_stable() -> None:
    board = dashboard()
    assert board["uid"] == Spec().dashboard_uid == "evald-quality"
    assert "id" not in board  # provisioning assigns it; a fixed id would clash across Grafanas


def test_datasource_is_a_variable_used_by_every_panel_and_query() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ds = {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels():
        assert panel["datasource"] == ds, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == ds, panel["title"]
    text = DASHBOARD_PATH.read_text()
    # no hard-coded data source uid anywhere
    assert set(re.findall(r'"uid": "([^"]*)"', text)) == {"${datasource}", "evald-quality"}


def test_a_label_values_variable_per_segment_label_and_every_query_filters_on_it() -> None:
    spec = Spec()
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    for label in spec.segment_labels:
        var = variables[label]
        assert var["type"] == "query"
        assert var["query"]["query"] == f"label_values(evald_measure_count, {label})"
        assert var["includeAll"] and var["multi"]
    measure_queries = [q for q in dashboard_queries() if "evald_window_sum{" in q]
    assert measure_queries
    for query in measure_queries:
        for label in spec.segment_labels:
            assert f'{label}=~"${label}"' in query


def test_a_panel_per_default_measure_with_last_week_and_a_confidence_band() -> None:
    by_title = {p["title"]: p for p in panels()}
    for measure in DEFAULT_MEASURES:
        panel = by_title[measure]
        exprs = {t["legendFormat"]: t["expr"] for t in panel["targets"]}
        assert set(exprs) == {
            "{{arm}}",
            "{{arm}} last week",
            "{{arm}} ci95 lower",
            "{{arm}} ci95 upper",
        }
        assert f'measure="{measure}"' in exprs["{{arm}}"]
        assert "offset 1w" in exprs["{{arm}} last week"]
        assert "offset" not in exprs["{{arm}}"]
        for side in ("lower", "upper"):
            assert "evald_window_sum_squares{" in exprs[f"{{{{arm}}}} ci95 {side}"]
        fills = {
            o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
            for o in panel["fieldConfig"]["overrides"]
        }
        for arm in (Spec().control, Spec().treatment):
            assert fills[f"{arm} ci95 upper"]["custom.fillBelowTo"] == f"{arm} ci95 lower"


def test_health_panels_cover_counts_abandonment_join_lag_and_watermark() -> None:
    queries = "\n".join(dashboard_queries())
    for name in (
        "evald_window_count",
        "evald_measure_count",
        "evald_impressions_abandoned_total",
        "evald_feedback_unattributed_total",
        "evald_rejected_total",
        "evald_events_total",
        "evald_consumer_lag",
        "evald_watermark_timestamp_seconds",
        "evald_pending_impressions",
        "evald_finalize_lag_seconds_bucket",
    ):
        assert name in queries, name


def test_panel_ids_are_unique_and_the_grid_has_no_overlap() -> None:
    all_panels = dashboard()["panels"]
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in all_panels:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))


def test_provisioning_points_at_the_dashboards_and_the_prometheus_datasource() -> None:
    datasources = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")
    (ds,) = datasources["datasources"]
    assert ds["type"] == "prometheus" and ds["isDefault"] is True
    providers = load_yaml(DEPLOY / "grafana/provisioning/dashboards/evald.yml")
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")


def test_every_query_of_a_panel_has_its_own_ref_id() -> None:
    """Grafana keeps one query per refId: a repeated id silently drops a series."""
    for panel in panels():
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), (panel["title"], refs)


_BY = re.compile(r"\b(?:sum|min|max|avg|count) by \(([^)]*)\)")
_IGNORING = re.compile(r"\bignoring \(([^)]*)\)")
_NAME = re.compile(r"[a-zA-Z_:][\w:]*")


def _recorded() -> dict[str, str]:
    """record name -> expression, from the generated recording rules."""
    rules = load_yaml(DEPLOY / "prometheus/rules/evald-recording.rules.yml")
    return {r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "record" in r}


def _comparison_labels() -> dict[str, set[str]]:
    """evald's comparison series (queried raw, not recorded) -> their labels; a comparison's
    segment is the arm plus the segment labels the arm does not fix (docs/statistics.md)."""
    spec = Spec()
    segment = set(spec.segment_labels) - set(spec.arm_scoped_labels)
    return {
        series.name: {label for label in series.labels if label != SEGMENT}
        | (segment if SEGMENT in series.labels else set())
        for series in COMPARISON_SERIES
    }


def output_labels(expr: str, recorded: dict[str, str]) -> set[str]:
    """The labels a dashboard query's series differ by: the outermost aggregation's grouping,
    or for a recorded series its rule's (minus what ``ignoring`` drops); ``le`` is consumed by
    histogram_quantile and ``job`` is one value per deployment."""
    text = expr.strip()
    match = _BY.search(text)
    if match:
        labels = {part.strip() for part in match.group(1).split(",")}
    elif re.match(r"(?:sum|min|max|avg|count) \(", text):
        labels = set()  # aggregated over everything: one series
    elif raw := [n for n in _NAME.findall(text) if n in _comparison_labels()]:
        labels = _comparison_labels()[raw[0]]
    else:
        names = [name for name in _NAME.findall(text) if name in recorded]
        assert names, f"cannot tell the labels of {expr!r}"
        rule = recorded[names[0]]
        labels = output_labels(rule, recorded)
        for dropped in _IGNORING.findall(rule):
            labels -= {part.strip() for part in dropped.split(",")}
    return labels - {"le", "job"}


def test_legends_name_every_label_the_series_differ_by() -> None:
    """A legend that leaves out a varying label shows the same entry once per value of it."""
    recorded = _recorded()
    for panel in panels():
        legends = [t["legendFormat"] for t in panel["targets"]]
        assert len(legends) == len(set(legends)), (panel["title"], legends)
        for target in panel["targets"]:
            # a label matched with = (not =~) has one value in the result
            fixed = set(re.findall(r'(\w+)="', target["expr"]))
            for label in output_labels(target["expr"], recorded) - fixed:
                assert f"{{{{{label}}}}}" in target["legendFormat"], (panel["title"], label)


def test_titles_say_what_is_plotted() -> None:
    """A ratio of means is not a rate; a /s unit goes with a rate()."""
    for panel in panels():
        exprs = " ".join(t["expr"] for t in panel["targets"])
        if "treatment_control_ratio" in exprs:
            assert "mean" in panel["title"] and "rate" not in panel["title"], panel["title"]
        if "/s" in panel["title"]:
            assert "rate(" in exprs, panel["title"]


def test_firing_alerts_are_annotated_on_every_panel() -> None:
    (annotation,) = dashboard()["annotations"]["list"]
    assert annotation["enable"] and annotation["datasource"]["uid"] == "${datasource}"
    match = re.search(r'alertname=~"([^"]+)"', annotation["expr"])
    assert annotation["expr"].startswith("ALERTS{") and match
    assert 'alertstate="firing"' in annotation["expr"]
    alerts = load_yaml(DEPLOY / "prometheus/rules/evald-alerts.rules.yml")
    names = [r["alert"] for g in alerts["groups"] for r in g["rules"] if "alert" in r]
    assert names and all(re.fullmatch(match.group(1), name) for name in names)


def test_the_comparison_panel_draws_the_latest_band_and_the_running_intersection() -> None:
    """The alert reads the latest look's band; the intersection is drawn beside it, in its own
    line style (docs/statistics.md, "What is exported")."""
    (panel,) = [
        p for p in panels() if any("evald_comparison_upper" in t["expr"] for t in p["targets"])
    ]
    exprs = [_NAME.findall(t["expr"].split("{")[0])[-1] for t in panel["targets"]]
    assert {
        "evald_comparison_lower",
        "evald_comparison_upper",
        "evald_comparison_intersection_lower",
        "evald_comparison_intersection_upper",
    } <= set(exprs)
    styled = {o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]}
    for target in panel["targets"]:
        if "intersection" in target["expr"]:
            assert target["legendFormat"].endswith(("intersection lower", "intersection upper"))
    assert "/ intersection (lower|upper)$/" in styled
    assert "running intersection" in panel["description"]


def test_comparison_queries_draw_one_line_whatever_the_number_of_instances() -> None:
    """Every ``evald run`` instance exports the same comparison and CUSUM values: a query that
    kept the instance would draw one identical line per instance (docs/metrics-reference.md)."""
    names = {series.name for series in COMPARISON_SERIES}
    aggregated = re.compile(r"(?:max|min) without \(instance, pod\) \((evald_\w+)\{[^}]*\}\)")
    seen = set()
    for expr in dashboard_queries():
        used = set(re.findall(r"\bevald_\w+", expr)) & names
        assert set(aggregated.findall(expr)) == used, expr
        seen |= used
    assert {"evald_comparison_upper", "evald_cusum_vs_control", "evald_cusum_threshold"} <= seen
