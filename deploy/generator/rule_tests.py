"""``promtool test rules`` scenarios: every alert fires on a synthetic fault and stays silent on
noise and on low traffic.

Scenarios are built from the :class:`Spec` (label keys, arm values, thresholds) so the rendered
test file follows the rules when they are regenerated with other arm values. Expected alerts are
stated by the scenario (fires or not, with which labels); promtool does the checking.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from deploy.generator import rules
from deploy.generator.spec import Spec
from deploy.generator.statistics_tests import down_tests, statistics_tests

MINUTES_PER_WEEK = 7 * 24 * 60
DAY = 24 * 60  # minutes
Labels = dict[str, str]
Case = dict[str, Any]


def values(start: float, steps: Iterable[tuple[int, float]]) -> str:
    """promtool expanding notation for a series starting at ``start`` and then, for each
    ``(n, delta)``, moving by ``delta`` per interval for ``n`` intervals (run-length encoded)."""
    parts: list[str] = []
    current = start
    first = True
    for n, delta in steps:
        if n <= 0:
            continue
        if first:
            parts.append(_run(current, delta, n))
            current += delta * n
            first = False
        else:
            current += delta
            parts.append(_run(current, delta, n - 1))
            current += delta * (n - 1)
    if first:
        parts.append(_num(current))
    return " ".join(parts)


def _run(start: float, delta: float, n: int) -> str:
    sign = "-" if delta < 0 else "+"
    return f"{_num(start)}{sign}{_num(abs(delta))}x{n}"


def gauge(points: Sequence[float]) -> str:
    """Explicit gauge values, one per interval."""
    return " ".join(_num(v) for v in points)


def _num(value: float) -> str:
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def _selector(name: str, labels: Labels) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def _render(template: str, labels: Labels) -> str:
    """Substitute ``{{ $labels.x }}`` the way Prometheus' template engine does for our rules."""
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)


class _Alerts:
    """Index of the generated alert rules by name, to derive expected labels/annotations."""

    def __init__(self, spec: Spec) -> None:
        self.by_name = {r["alert"]: r for g in rules.alert_groups(spec) for r in g["rules"]}

    def expect(self, name: str, labels: Labels) -> dict[str, Any]:
        rule = self.by_name[name]
        exp_labels = {**labels, **rule.get("labels", {})}
        context = {**exp_labels, "alertname": name}
        annotations = {k: _render(v, context) for k, v in rule.get("annotations", {}).items()}
        return {"exp_labels": exp_labels, "exp_annotations": annotations}


def _segments(spec: Spec) -> tuple[Labels, Labels]:
    """Label values of the control and the treatment segment."""
    control: Labels = {}
    treatment: Labels = {}
    for key in spec.segment_labels:
        if key == spec.arm_label:
            control[key], treatment[key] = spec.control, spec.treatment
        elif key in spec.arm_scoped_labels:
            control[key], treatment[key] = "A", "B"
        else:
            control[key] = treatment[key] = "search"
    return control, treatment


JOB = {"job": "evald"}


def _instance(n: int) -> Labels:
    return {**JOB, "instance": f"evald-{n}:9464"}


def _quality_tests(spec: Spec, alerts: _Alerts) -> list[Case]:
    """A week of history at 1/min; the last hours carry the scenario."""
    measure = spec.measures[0]
    _, treatment = _segments(spec)
    history = MINUTES_PER_WEEK + 60  # the drop starts one week and one hour in
    tail = 120
    drop_labels = {"measure": measure, **JOB, **treatment}

    def case(
        per_min: int, tail_sums: list[float], before: list[tuple[int, float]]
    ) -> list[dict[str, str]]:
        """``before``: (minutes, mean) segments covering the history; then ``tail_sums``."""
        assert sum(minutes for minutes, _ in before) == history
        # two instances share the traffic: the rules must sum before dividing
        series = []
        for n in (0, 1):
            labels = {"measure": measure, **treatment, **_instance(n)}
            sums = [(minutes, mean * per_min / 2) for minutes, mean in before]
            sums += [(1, s / 2) for s in tail_sums]
            series.append(
                {
                    "series": _selector("evald_measure_count", labels),
                    "values": values(0, [(history + tail, per_min / 2)]),
                }
            )
            series.append(
                {"series": _selector("evald_measure_sum", labels), "values": values(0, sums)}
            )
        return series

    week_end = "1w"
    drop = [0.5 * 60.0] * tail  # mean 0.75 -> 0.5 at 60 impressions/min
    rng = random.Random(5)
    noise = [60 * (0.75 + rng.uniform(-0.06, 0.06)) for _ in range(tail)]
    low = [0.5 * 2.0] * tail  # the same drop at 2 impressions/min: 120/h, under the guard
    fired = [
        alerts.expect("EvaldQualityDropVsLastWeek", drop_labels),
        alerts.expect("EvaldQualityDropVsYesterday", drop_labels),
    ]
    names = ("EvaldQualityDropVsLastWeek", "EvaldQualityDropVsYesterday")
    return [
        {
            "name": "quality drop against last week and yesterday fires after its for: duration",
            "interval": "1m",
            "input_series": case(60, drop, [(history, 0.75)]),
            "alert_rule_test": [
                # 20m into the drop: 10% lower since ~18m, pending but not yet firing
                *({"eval_time": f"{week_end}1h20m", "alertname": n} for n in names),
                # 110m in: below the bound since ~18m, for more than 30m
                *(
                    {"eval_time": f"{week_end}2h50m", "alertname": n, "exp_alerts": [e]}
                    for n, e in zip(names, fired, strict=True)
                ),
            ],
        },
        {
            "name": "quality noise of +-8% per minute around the baseline stays silent",
            "interval": "1m",
            "input_series": case(60, noise, [(history, 0.75)]),
            "alert_rule_test": [
                {"eval_time": f"{week_end}{t}", "alertname": n}
                for t in ("1h30m", "2h", "2h50m")
                for n in names
            ],
        },
        {
            "name": "the same drop at low traffic (under the sample guard) stays silent",
            "interval": "1m",
            "input_series": case(2, low, [(history, 0.75)]),
            "alert_rule_test": [{"eval_time": f"{week_end}2h50m", "alertname": n} for n in names],
        },
        {
            # the drop happened a day ago: yesterday is no better than today, last week is
            "name": "a drop that started a day ago fires against last week only",
            "interval": "1m",
            "input_series": case(60, drop, [(history - DAY, 0.75), (DAY, 0.5)]),
            "alert_rule_test": [
                {"eval_time": f"{week_end}2h50m", "alertname": names[0], "exp_alerts": [fired[0]]},
                {"eval_time": f"{week_end}2h50m", "alertname": names[1]},
            ],
        },
    ]


def _window_series(spec: Spec, arms: dict[str, tuple[int, float, float]]) -> list[dict[str, str]]:
    """Constant 1h window gauges per arm from (n, mean, standard deviation)."""
    control, treatment = _segments(spec)
    segs = {spec.control: control, spec.treatment: treatment}
    series = []
    for arm, (n, mean, sd) in arms.items():
        total = n * mean
        squares = (n - 1) * sd**2 + n * mean**2
        labels = {"measure": spec.measures[0], "window": "1h", **segs[arm], **_instance(0)}
        for name, value in (("count", n), ("sum", total), ("sum_squares", squares)):
            series.append(
                {
                    "series": _selector(f"evald_window_{name}", labels),
                    "values": f"{_num(value)}+0x40",
                }
            )
    return series


def _watermark_tests(alerts: _Alerts) -> list[Case]:
    name = "EvaldWatermarkStalled"
    labels = {**_instance(0), "partition": "0"}
    selector = _selector("evald_watermark_timestamp_seconds", labels)
    start = 1_700_000_000
    rng = random.Random(7)
    bursty = [float(start)]
    for _ in range(60):  # irregular progress, sometimes none for a few minutes
        bursty.append(bursty[-1] + rng.choice([0, 0, 0, 30, 60, 240]))
    idle = [float(start + 600 * (i // 10)) for i in range(61)]  # idle fallback every 10 min
    return [
        {
            "name": "a watermark that stops moving fires",
            "interval": "1m",
            "input_series": [{"series": selector, "values": values(start, [(30, 60), (30, 0)])}],
            "alert_rule_test": [
                {"eval_time": "40m", "alertname": name},
                {
                    "eval_time": "55m",
                    "alertname": name,
                    "exp_alerts": [alerts.expect(name, labels)],
                },
            ],
        },
        {
            "name": "bursty watermark progress stays silent",
            "interval": "1m",
            "input_series": [{"series": selector, "values": gauge(bursty)}],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("20m", "40m", "60m")],
        },
        {
            "name": "low traffic, watermark advanced only by the idle fallback, stays silent",
            "interval": "1m",
            "input_series": [{"series": selector, "values": gauge(idle)}],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("20m", "40m", "60m")],
        },
    ]


def _finalize_tests(alerts: _Alerts) -> list[Case]:
    name = "EvaldNoImpressionsFinalized"
    inst = _instance(0)
    accepted = _selector(
        "evald_events_total", {"kind": "impression", "outcome": "accepted", **inst}
    )
    finalized = _selector("evald_impressions_finalized_total", {"reason": "window", **inst})

    def steps(times: list[int], total: int) -> str:
        per_minute = Counter(times)
        out, value = [], 0
        for minute in range(total + 1):
            value += per_minute[minute]
            out.append(value)
        return gauge(out)

    every_20 = list(range(0, 180, 20))
    return [
        {
            "name": "impressions accepted but finalization stops fires",
            "interval": "1m",
            "input_series": [
                {"series": accepted, "values": values(0, [(180, 100)])},
                {"series": finalized, "values": values(0, [(32, 0), (28, 100), (120, 0)])},
            ],
            "alert_rule_test": [
                {"eval_time": "100m", "alertname": name},
                {
                    "eval_time": "140m",
                    "alertname": name,
                    "exp_alerts": [alerts.expect(name, {**inst})],
                },
            ],
        },
        {
            "name": "finalization in bursts every 10 minutes stays silent",
            "interval": "1m",
            "input_series": [
                {"series": accepted, "values": values(0, [(180, 100)])},
                {
                    "series": finalized,
                    "values": steps([m for m in range(40, 181, 10) for _ in range(1000)], 180),
                },
            ],
            "alert_rule_test": [
                {"eval_time": t, "alertname": name} for t in ("60m", "100m", "140m", "180m")
            ],
        },
        {
            "name": "one impression every 20 minutes, each finalized 32 minutes later, is silent",
            "interval": "1m",
            "input_series": [
                {"series": accepted, "values": steps(every_20, 180)},
                {"series": finalized, "values": steps([m + 32 for m in every_20], 180)},
            ],
            "alert_rule_test": [
                {"eval_time": t, "alertname": name} for t in ("60m", "100m", "140m", "180m")
            ],
        },
    ]


def _ratio_tests(alerts: _Alerts) -> list[Case]:
    inst = _instance(0)
    names = ("EvaldHighRejectedRate", "EvaldHighLateFeedbackRate", "EvaldHighOrphanedFeedbackRate")

    def series(imp: float, fb: float, rejected: list[float], late: list[float]) -> list[dict]:
        def ev(kind: str, outcome: str) -> str:
            return _selector("evald_events_total", {"kind": kind, "outcome": outcome, **inst})

        def un(reason: str) -> str:
            return _selector("evald_feedback_unattributed_total", {"reason": reason, **inst})

        return [
            {"series": ev("impression", "accepted"), "values": values(0, [(40, imp)])},
            {"series": ev("feedback", "accepted"), "values": values(0, [(40, fb)])},
            {"series": ev("unknown", "rejected"), "values": values(0, [(1, r) for r in rejected])},
            {"series": un("late"), "values": values(0, [(1, x) for x in late])},
            {"series": un("orphaned"), "values": values(0, [(1, x) for x in late])},
        ]

    rng = random.Random(11)
    return [
        {
            # 100 of 1100 events rejected (9%), 60 of 600 feedback late and orphaned (10%)
            "name": "high rejected, late and orphaned rates fire",
            "interval": "1m",
            "input_series": series(400, 600, [100] * 40, [60] * 40),
            "alert_rule_test": [
                *({"eval_time": "8m", "alertname": n} for n in names),
                *(
                    {"eval_time": "35m", "alertname": n, "exp_alerts": [alerts.expect(n, JOB)]}
                    for n in names
                ),
            ],
        },
        {
            "name": "noisy rates under the thresholds stay silent",
            "interval": "1m",
            "input_series": series(
                400,
                600,
                [rng.choice([5, 15, 40]) for _ in range(40)],
                [rng.choice([0, 10, 40]) for _ in range(40)],
            ),
            "alert_rule_test": [
                {"eval_time": t, "alertname": n} for t in ("20m", "35m") for n in names
            ],
        },
        {
            # 20% rejected and late, but only 200 events in 10 minutes (guard: 500)
            "name": "high ratios at low traffic stay silent",
            "interval": "1m",
            "input_series": series(8, 8, [4] * 40, [2] * 40),
            "alert_rule_test": [
                {"eval_time": t, "alertname": n} for t in ("20m", "35m") for n in names
            ],
        },
    ]


def _lag_tests(alerts: _Alerts) -> list[Case]:
    name = "EvaldConsumerLagHigh"
    inst = _instance(0)
    topic = "impressions"

    def lag(partition: int) -> str:
        return _selector(
            "evald_consumer_lag", {"topic": topic, "partition": str(partition), **inst}
        )

    rng = random.Random(13)
    return [
        {
            "name": "lag growing past the threshold fires",
            "interval": "1m",
            "input_series": [{"series": lag(p), "values": values(0, [(60, 2500)])} for p in (0, 1)],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": name},
                {
                    "eval_time": "45m",
                    "alertname": name,
                    "exp_alerts": [alerts.expect(name, {**JOB, "topic": topic})],
                },
            ],
        },
        {
            "name": "noisy lag under the threshold stays silent",
            "interval": "1m",
            "input_series": [
                {"series": lag(p), "values": gauge([rng.uniform(0, 20000) for _ in range(61)])}
                for p in (0, 1)
            ],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("30m", "60m")],
        },
        {
            "name": "high lag that is shrinking (catching up) stays silent",
            "interval": "1m",
            "input_series": [
                {"series": lag(p), "values": values(200_000, [(60, -1500)])} for p in (0, 1)
            ],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("30m", "60m")],
        },
    ]


def _ready_tests(alerts: _Alerts) -> list[Case]:
    name = "EvaldNotReady"
    inst = _instance(0)
    ready = _selector("evald_ready", inst)
    return [
        {
            "name": "not ready for longer than for: fires",
            "interval": "1m",
            "input_series": [{"series": ready, "values": values(1, [(10, 0), (1, -1), (30, 0)])}],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": name},
                {"eval_time": "25m", "alertname": name, "exp_alerts": [alerts.expect(name, inst)]},
            ],
        },
        {
            "name": "a short not-ready blip (restart, rebalance) stays silent",
            "interval": "1m",
            "input_series": [
                {"series": ready, "values": values(1, [(10, 0), (1, -1), (5, 0), (1, 1), (20, 0)])}
            ],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("15m", "30m")],
        },
    ]


RULE_FILES = ["../rules/evald-recording.rules.yml", "../rules/evald-alerts.rules.yml"]


def build_quality(spec: Spec) -> dict[str, Any]:
    """Week-long scenarios, evaluated every 5m: 1m evaluation over a week is needlessly slow (and
    10m would leave recorded series older than the 5m lookback when alerts read them)."""
    return {
        "rule_files": RULE_FILES,
        "evaluation_interval": "5m",
        "tests": _quality_tests(spec, _Alerts(spec)),
    }


def build_pipeline(spec: Spec) -> dict[str, Any]:
    """Short scenarios (an hour or three) for every other alert, evaluated every minute."""
    alerts = _Alerts(spec)
    return {
        "rule_files": RULE_FILES,
        "evaluation_interval": "1m",
        "tests": [
            *_watermark_tests(alerts),
            *_finalize_tests(alerts),
            *_ratio_tests(alerts),
            *_lag_tests(alerts),
            *_ready_tests(alerts),
            *statistics_tests(spec, alerts.expect),
            *down_tests(spec, alerts.expect),
        ],
    }
