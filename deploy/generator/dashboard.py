"""The Grafana dashboard for evald, rendered from a :class:`Spec` as stable JSON.

Every query goes through the ``$datasource`` variable and filters on ``$job`` and one
``label_values`` variable per segment label, so the same JSON works in compose, in Kubernetes
and in any Grafana with a Prometheus data source.
"""

from __future__ import annotations

import json
from typing import Any

from deploy.generator.rules import JOB, across_instances
from deploy.generator.spec import Spec

Panel = dict[str, Any]
DS = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24
RATE = "$__rate_interval"


def _bounded(measure: str) -> bool:
    """All measures but the unnormalised gains (DCG, CG) live in [0, 1]."""
    return not measure.startswith(("DCG", "CG"))


class _Queries:
    """PromQL builders sharing the variable filters of the dashboard."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.filters = ['job=~"$job"'] + [f'{k}=~"${k}"' for k in spec.segment_labels]

    def sel(self, name: str, *extra: str, offset: str = "", rng: str = "") -> str:
        inner = ", ".join([*extra, *self.filters])
        window = f"[{rng}]" if rng else ""
        shift = f" offset {offset}" if offset else ""
        return f"{name}{{{inner}}}{window}{shift}"

    def job_sel(self, name: str, *extra: str, rng: str = "") -> str:
        inner = ", ".join([*extra, 'job=~"$job"'])
        return f"{name}{{{inner}}}" + (f"[{rng}]" if rng else "")

    def window_part(self, part: str, measure: str, offset: str = "") -> str:
        arm = self.spec.arm_label
        sel = self.sel(
            f"evald_window_{part}", f'measure="{measure}"', 'window="$window"', offset=offset
        )
        return f"sum by ({arm}) ({sel})"

    def window_mean(self, measure: str, offset: str = "") -> str:
        s = self.window_part("sum", measure, offset)
        n = self.window_part("count", measure, offset)
        return f"{s}\n/ ({n} > 0)"

    def window_bound(self, measure: str, sign: str) -> str:
        s = self.window_part("sum", measure)
        n = self.window_part("count", measure)
        q = self.window_part("sum_squares", measure)
        stderr2 = f"clamp_min({q} - {s} ^ 2 / {n}, 0)\n  / (({n} > 1) - 1)\n  / {n}"
        z = self.spec.thresholds.ci_z
        return f"({s} / ({n} > 0))\n{sign} {z} * sqrt(\n  {stderr2}\n)"


def _target(ref: str, expr: str, legend: str) -> dict[str, Any]:
    return {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend, "range": True}


def _table_target(expr: str, legend: str) -> dict[str, Any]:
    """A table panel's one target: the query's value now, one row per series."""
    return {**_target("A", expr, legend), "range": False, "instant": True, "format": "table"}


def _timeseries(
    title: str,
    targets: list[dict[str, Any]],
    *,
    unit: str = "short",
    description: str = "",
    overrides: list[dict[str, Any]] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
) -> Panel:
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {"lineWidth": 2, "fillOpacity": 0, "spanNulls": True, "showPoints": "never"},
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def _override(matcher: str, options: str, props: dict[str, Any]) -> dict[str, Any]:
    return {
        "matcher": {"id": matcher, "options": options},
        "properties": [{"id": k, "value": v} for k, v in props.items()],
    }


ARM_COLOURS = ("blue", "orange", "green", "purple", "red")


def _measure_panel(spec: Spec, q: _Queries, measure: str) -> Panel:
    arms = (spec.control, spec.treatment)
    overrides = [
        _override(
            "byRegexp",
            "/last week$/",
            {"custom.lineStyle": {"fill": "dash", "dash": [8, 8]}, "custom.lineWidth": 1},
        ),
        _override(
            "byRegexp",
            "/ci95/",
            {
                "custom.lineWidth": 0,
                "custom.hideFrom": {"legend": True, "tooltip": False, "viz": False},
            },
        ),
    ]
    for arm, colour in zip(arms, ARM_COLOURS, strict=False):
        overrides.append(
            _override(
                "byRegexp", f"/^{arm}( |$)/", {"color": {"mode": "fixed", "fixedColor": colour}}
            )
        )
        overrides.append(
            _override(
                "byName",
                f"{arm} ci95 upper",
                {"custom.fillBelowTo": f"{arm} ci95 lower", "custom.fillOpacity": 20},
            )
        )
    a = spec.arm_label
    return _timeseries(
        measure,
        [
            _target("A", q.window_mean(measure), f"{{{{{a}}}}}"),
            _target("B", q.window_mean(measure, offset="1w"), f"{{{{{a}}}}} last week"),
            _target("C", q.window_bound(measure, "-"), f"{{{{{a}}}}} ci95 lower"),
            _target("D", q.window_bound(measure, "+"), f"{{{{{a}}}}} ci95 upper"),
        ],
        unit="none",
        description=f"Mean {measure} per arm over the last complete $window event-time window "
        "(sums merged across instances), the same window a week earlier (dashed), and the "
        f"{spec.thresholds.ci_z:.2f}-standard-error band from the exported sums of squares.",
        overrides=overrides,
        minimum=0,
        maximum=1 if _bounded(measure) else None,
    )


def _quality_panels(spec: Spec, q: _Queries) -> list[Panel]:
    panels = [_measure_panel(spec, q, m) for m in spec.measures]
    comp = ", ".join(['job=~"$job"'] + [f'{k}=~"${k}"' for k in spec.comparison_labels])
    # the compared series keep the comparison labels (e.g. surface): name them in the legend, or
    # each measure's entry repeats once per surface
    legend = " ".join(["{{measure}}", *(f"{{{{{k}}}}}" for k in spec.comparison_labels)])
    panels.append(
        _timeseries(
            f"{spec.treatment} / {spec.control}: ratio of the 1h mean quality",
            [_target("A", f"arms:evald_measure:treatment_control_ratio1h{{{comp}}}", legend)],
            unit="percentunit",
            description="Ratio of the arms' means from the histogram sums and counts (recording "
            "rule); 100% means no difference.",
        )
    )
    panels.append(_sequence_panel(spec, comp))
    panels.append(_cusum_panel(spec, comp))
    return panels


def _one(series: str, how: str = "max") -> str:
    """A comparison series once, not once per ``evald run`` instance (they export the same
    values): one line per comparison segment, whatever the number of instances. ``how`` is the
    aggregation the alert reading that series uses, so the panel draws what the alert sees."""
    return across_instances(how, series)


def _sequence_panel(spec: Spec, comp: str) -> Panel:
    """The comparison's difference since its start inside its confidence-sequence band, and
    minus the minimum effect: EvaldTreatmentBelowControl fires when the band's top is below."""
    a = spec.arm_label
    legend = " ".join(
        ["{{comparison}} {{measure}}", *(f"{{{{{k}}}}}" for k in spec.comparison_labels)]
    )
    legend = f"{legend} {{{{{a}}}}}"
    return _timeseries(
        f"{spec.treatment} − {spec.control} since the comparison start, always-valid band",
        [
            _target("A", _one(f"evald_comparison_difference{{{comp}}}"), legend),
            _target("B", _one(f"evald_comparison_lower{{{comp}}}"), f"{legend} lower"),
            _target("C", _one(f"evald_comparison_upper{{{comp}}}"), f"{legend} upper"),
            _target(
                "D",
                "-" + _one('evald_comparison_min_effect{job=~"$job"}'),
                "{{comparison}} {{measure}} minus the minimum effect",
            ),
            _target(
                "E",
                _one(f"evald_comparison_intersection_lower{{{comp}}}"),
                f"{legend} intersection lower",
            ),
            _target(
                "F",
                _one(f"evald_comparison_intersection_upper{{{comp}}}"),
                f"{legend} intersection upper",
            ),
        ],
        unit="none",
        description="Treatment mean minus control mean over every complete window since the "
        "declared start, with its confidence sequence (valid however often it is looked at; "
        f"family-wise rate {spec.thresholds.family_alpha * 100:g}%). EvaldTreatmentBelowControl "
        "fires when the upper bound is below minus the minimum effect (dashed). Thin solid: "
        "the running intersection of every look's band, tighter but valid only while the "
        "difference is constant; it vanishes once empty (the difference changed: "
        "evald_comparison_intersection_empty = 1), which the CUSUMs alert on.",
        overrides=[
            _override(
                "byRegexp",
                "/ (lower|upper)$/",
                {"custom.lineStyle": {"fill": "dot", "dash": [2, 4]}, "custom.lineWidth": 1},
            ),
            _override(
                "byRegexp",
                "/ intersection (lower|upper)$/",
                {"custom.lineStyle": {"fill": "solid"}, "custom.lineWidth": 1},
            ),
            _override(
                "byRegexp",
                "/minimum effect$/",
                {"custom.lineStyle": {"fill": "dash", "dash": [4, 4]}, "custom.lineWidth": 1},
            ),
        ],
    )


def _cusum_panel(spec: Spec, comp: str) -> Panel:
    """Both CUSUMs against their threshold h: the drop alerts fire above it."""
    a = spec.arm_label
    where = " ".join(
        ["{{comparison}} {{measure}}", *(f"{{{{{k}}}}}" for k in spec.comparison_labels)]
    )
    return _timeseries(
        "Drop detection: CUSUM statistics",
        [
            _target(
                "A",
                _one(f"evald_cusum_vs_control{{{comp}}}", "min"),
                f"{where} {{{{{a}}}}} vs control",
            ),
            _target(
                "B",
                _one(f"evald_cusum_vs_baseline{{{comp}}}", "min"),
                f"{where} {{{{{a}}}}} vs baseline",
            ),
            _target("C", _one('evald_cusum_threshold{job=~"$job"}'), "threshold h {{comparison}}"),
        ],
        unit="none",
        description="One-sided CUSUM of standardized window means: treatment − control, and "
        "each arm against its trailing baseline. EvaldTreatmentDropDetected and "
        "EvaldArmDropDetected fire above h (dashed); about one false alarm per 930 windows.",
        overrides=[
            _override(
                "byRegexp",
                "/^threshold/",
                {"custom.lineStyle": {"fill": "dash", "dash": [4, 4]}, "custom.lineWidth": 1},
            )
        ],
        minimum=0,
    )


def _traffic_panels(spec: Spec, q: _Queries) -> list[Panel]:
    first = spec.measures[0]
    seg = ", ".join(spec.segment_labels)
    legend = " ".join(f"{{{{{k}}}}}" for k in spec.segment_labels)
    a = spec.arm_label
    scored = q.sel("evald_measure_count", f'measure="{first}"', rng=RATE)
    return [
        _timeseries(
            "Scored impressions /s by segment",
            [_target("A", f"sum by ({seg}) (rate({scored}))", legend)],
            unit="reqps",
            description="Every finalized impression is scored once per measure; counted on "
            f"{first}.",
        ),
        _timeseries(
            "Samples in the $window window",
            [
                _target("A", q.window_part("count", first), f"{{{{{a}}}}}"),
                _target("B", q.window_part("count", first, "1w"), f"{{{{{a}}}}} last week"),
            ],
            description="Impressions behind each window mean; the alerts need "
            f"{spec.thresholds.ci_min_samples} per arm.",
        ),
        _timeseries(
            "Abandonment (no positive feedback)",
            [
                _target(
                    "A",
                    f"sum by ({a}) (rate({q.sel('evald_impressions_abandoned_total', rng=RATE)}))\n"
                    f"/ (sum by ({a}) (rate({scored})) > 0)",
                    f"{{{{{a}}}}}",
                )
            ],
            unit="percentunit",
            minimum=0,
            maximum=1,
        ),
        _timeseries(
            "Events /s by kind and outcome",
            [
                _target(
                    "A",
                    f"sum by (kind, outcome) (rate({q.job_sel('evald_events_total', rng=RATE)}))",
                    "{{kind}} {{outcome}}",
                )
            ],
            unit="reqps",
        ),
    ]


def _health_panels(spec: Spec, q: _Queries) -> list[Panel]:
    th = spec.thresholds
    feedback = q.job_sel("evald_events_total", 'kind="feedback"', rng=RATE)
    events = q.job_sel("evald_events_total", rng=RATE)
    rejected = q.job_sel("evald_events_total", 'outcome="rejected"', rng=RATE)
    unattributed = q.job_sel("evald_feedback_unattributed_total", rng=RATE)
    return [
        _timeseries(
            "Join health: late, orphaned, rejected share",
            [
                _target(
                    "A",
                    f"sum by (reason) (rate({unattributed}))\n"
                    f"/ ignoring (reason) group_left sum (rate({feedback}))",
                    "{{reason}} / feedback",
                ),
                _target("B", f"sum (rate({rejected})) / sum (rate({events}))", "rejected / events"),
            ],
            unit="percentunit",
            description=f"Alerts at {th.late_ratio:.0%} late, {th.orphaned_ratio:.0%} orphaned, "
            f"{th.rejected_ratio:.0%} rejected.",
            minimum=0,
        ),
        _timeseries(
            "Rejected events /s by reason",
            [
                _target(
                    "A",
                    f"sum by (reason) (rate({q.job_sel('evald_rejected_total', rng=RATE)}))",
                    "{{reason}}",
                )
            ],
            unit="reqps",
        ),
        _timeseries(
            "Finalized impressions /s by reason",
            [
                _target(
                    "A",
                    "sum by (reason) (rate("
                    f"{q.job_sel('evald_impressions_finalized_total', rng=RATE)}))",
                    "{{reason}}",
                )
            ],
            unit="reqps",
        ),
        _timeseries(
            "Pending state",
            [
                _target(
                    "A",
                    f"sum by (instance) ({q.job_sel('evald_pending_impressions')})",
                    "impressions {{instance}}",
                ),
                _target(
                    "B",
                    f"sum by (instance) ({q.job_sel('evald_pending_feedback')})",
                    "feedback {{instance}}",
                ),
            ],
        ),
    ]


def _lag_panels(spec: Spec, q: _Queries) -> list[Panel]:
    return [
        _timeseries(
            "Kafka consumer lag (records)",
            [_target("A", f"sum by (topic) ({q.job_sel('evald_consumer_lag')})", "{{topic}}")],
            description=f"EvaldConsumerLagHigh fires above {spec.thresholds.lag_records} records "
            "when the lag is not shrinking.",
        ),
        _timeseries(
            "Watermark and last complete window, behind wall clock",
            [
                _target(
                    "A",
                    "time() - max by (instance, partition) "
                    f"({q.job_sel('evald_watermark_timestamp_seconds')})",
                    "watermark {{instance}} p{{partition}}",
                ),
                _target(
                    "B",
                    f"time() - max by (window) ({q.job_sel('evald_window_end_timestamp_seconds')})",
                    "end of last {{window}} window",
                ),
            ],
            unit="s",
            description="Event time can lead wall time in the demo (simulated clock): only "
            "the trend matters there. A flat watermark fires EvaldWatermarkStalled.",
        ),
        _timeseries(
            "Finalize lag (window close to scored)",
            [
                _target(
                    ref,
                    f"histogram_quantile({p}, sum by (le) (rate("
                    f"{q.job_sel('evald_finalize_lag_seconds_bucket', rng=RATE)})))",
                    f"p{int(p * 100)}",
                )
                for ref, p in (("A", 0.5), ("B", 0.99))
            ],
            unit="s",
        ),
        _timeseries(
            "Daemon: results, dead letters, backpressure",
            [
                _target(
                    "A",
                    f"sum (rate({q.job_sel('evald_results_produced_total', rng=RATE)}))",
                    "results /s",
                ),
                _target(
                    "B",
                    f"sum by (reason) (rate({q.job_sel('evald_dlq_records_total', rng=RATE)}))",
                    "DLQ {{reason}} /s",
                ),
                _target(
                    "C",
                    f"sum (rate({q.job_sel('evald_backpressure_pauses_total', rng=RATE)}))",
                    "pauses /s",
                ),
                _target(
                    "D", f"min by (instance) ({q.job_sel('evald_ready')})", "ready {{instance}}"
                ),
            ],
        ),
    ]


def _layout(rows: list[tuple[str, list[Panel]]], per_row: int = 2) -> list[Panel]:
    """Place rows and their panels on Grafana's 24-column grid, with stable ids."""
    out: list[Panel] = []
    y = 0
    next_id = 1
    width = GRID_WIDTH // per_row
    for title, panels in rows:
        out.append(
            {
                "type": "row",
                "title": title,
                "id": next_id,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        for i, panel in enumerate(panels):
            panel["id"] = next_id
            next_id += 1
            panel["gridPos"] = {
                "h": 8,
                "w": width,
                "x": (i % per_row) * width,
                "y": y + (i // per_row) * 8,
            }
            out.append(panel)
        y += ((len(panels) + per_row - 1) // per_row) * 8
    return out


def _zero_feedback_panels(spec: Spec, q: _Queries) -> list[Panel]:
    """A table of each arm's zero-feedback values in the last complete $window window: fed
    from evald's bounded series (segments x 3 quantities x windows, under the series budget),
    not the /queries JSON endpoint, so it needs nothing but the Prometheus data source and
    keeps its history for the alert annotations."""
    a = spec.arm_label
    window = 'window="$window"'
    weight = q.sel("evald_zero_feedback_lists", window)
    mean = q.sel("evald_zero_feedback_mean", window)
    expr = f"sum by ({a}, quantity) ({mean} * {weight})\n/ sum by ({a}, quantity) ({weight})"
    target = _table_target(expr, f"{{{{{a}}}}} {{{{quantity}}}}")
    return [
        {
            "type": "table",
            "title": "Zero-feedback signals by arm, last complete $window window (mean)",
            "description": "Needs no click: rbo = rank-biased overlap with the reference arm's "
            "lists for the same query (1: the same lists), unjudged = share of the top items "
            "never judged for the query, empty = share of empty lists. Empty with "
            "zero_feedback.depth 0 (docs/drilldown.md, Zero-feedback signals).",
            "datasource": DS,
            "targets": [target],
            "fieldConfig": {"defaults": {"unit": "percentunit", "decimals": 3}, "overrides": []},
            "options": {"showHeader": True, "sortBy": [{"displayName": a, "desc": False}]},
            "transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True}}}],
        }
    ]


def _contributor_panels(spec: Spec, q: _Queries) -> list[Panel]:
    """A table of the top three contributors of each drop a comparison flags (the queries or
    label values carrying it, with their share), the ones the drop alerts name. Fed from
    evald's bounded ``evald_drop_contributor`` series, not the /queries JSON endpoint: Grafana
    reads JSON only through a plugin, and the series need nothing but the Prometheus data
    source (docs/drilldown.md). Instances aggregated away as the alerts do."""
    a = spec.arm_label
    keys = ("comparison", "measure", "against", a, *spec.comparison_labels)
    keys += ("rank", "dimension", "value")
    filters = ['job=~"$job"'] + [f'{k}=~"${k}"' for k in (a, *spec.comparison_labels)]
    series = f"evald_drop_contributor{{{', '.join(filters)}}}"
    # max by every label but the instance's: the instances aggregated away, as the alerts do
    expr = f"sort_desc(max by ({', '.join((JOB, *keys))}) ({series}))"
    target = _table_target(expr, " ".join(f"{{{{{k}}}}}" for k in keys))
    return [
        {
            "type": "table",
            "title": "Drop contributors: share of each flagged drop (top three per drop)",
            "description": "Per drop a comparison flags: against control (band below 0 or "
            "the minimum effect, or the CUSUM against control crossed) or against the arm's "
            "own baseline (its baseline CUSUM crossed; the control arm too), the against "
            "column. The three queries or label values that carry most of it, best first "
            "(rank), with their share of the drop (Adtributor's explanatory power, "
            "docs/drilldown.md, Drop attribution). Empty while nothing is flagged. GET /queries "
            "on the metrics port has the full list.",
            "datasource": DS,
            "targets": [target],
            "fieldConfig": {"defaults": {"unit": "percentunit", "decimals": 1}, "overrides": []},
            "options": {"showHeader": True, "sortBy": [{"displayName": "Value", "desc": True}]},
            "transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True}}}],
        }
    ]


def _variables(spec: Spec) -> list[dict[str, Any]]:
    def query_var(name: str, label: str) -> dict[str, Any]:
        query = f"label_values(evald_measure_count, {label})"
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS,
            "definition": query,
            "query": {"query": query, "refId": f"{name}-values"},
            "refresh": 2,
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1,
        }

    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "refresh": 1,
        },
        query_var("job", "job"),
        *(query_var(label, label) for label in spec.segment_labels),
        {
            "name": "window",
            "label": "event-time window",
            "type": "custom",
            "query": "5m,1h",
            "current": {"selected": True, "text": "1h", "value": "1h"},
            "options": [
                {"selected": False, "text": "5m", "value": "5m"},
                {"selected": True, "text": "1h", "value": "1h"},
            ],
        },
    ]


def _alert_annotation(spec: Spec) -> dict[str, Any]:
    """A marker on every panel while one of evald's alerts fires (Prometheus' ALERTS series)."""
    return {
        "name": "evald alerts",
        "datasource": DS,
        "enable": True,
        "iconColor": "red",
        "expr": 'ALERTS{alertname=~"Evald.*", alertstate="firing"}',
        "step": "60s",
        "titleFormat": "{{alertname}}",
        "textFormat": "{{comparison}} {{measure}} {{" + spec.arm_label + "}} {{severity}}",
        "useValueForTime": False,
    }


def build(spec: Spec) -> dict[str, Any]:
    """The dashboard as a JSON-ready dict (fixed uid, so links and provisioning are stable)."""
    q = _Queries(spec)
    return {
        "uid": spec.dashboard_uid,
        "title": "evald: ranking quality",
        "description": "Online ranking quality per segment with last-week overlays and "
        "confidence bands, join health, lag and watermark.",
        "tags": ["evald", "ranking", "quality"],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": _variables(spec)},
        "annotations": {"list": [_alert_annotation(spec)]},
        "links": [],
        "panels": _layout(
            [
                ("Quality by arm (event-time windows)", _quality_panels(spec, q)),
                ("Traffic and abandonment", _traffic_panels(spec, q)),
                ("Join health", _health_panels(spec, q)),
                ("Lag and watermark", _lag_panels(spec, q)),
                ("Before any feedback", _zero_feedback_panels(spec, q)),
                ("Why it dropped", _contributor_panels(spec, q)),
            ]
        ),
    }


def render(spec: Spec) -> str:
    """Stable JSON text of the dashboard."""
    return json.dumps(build(spec), indent=2, ensure_ascii=False) + "\n"
