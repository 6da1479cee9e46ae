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
from deploy.generator.click_tests import click_tests
from deploy.generator.contributor_tests import contributor_tests
from deploy.generator.interleaving_tests import interleaving_tests
from deploy.generator.spec import Spec
from deploy.generator.statistics_tests import down_tests, statistics_tests
from deploy.generator.zero_feedback_tests import zero_feedback_tests

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

    def expect(
        self, name: str, labels: Labels, contributors: Sequence[tuple[str, str, float]] = ()
    ) -> dict[str, Any]:
        """The alert promtool must see; a drop alert's ``contributors`` annotation names
        ``contributors`` (dimension, value, share; none: no ``evald_drop_contributor``)."""
        rule = self.by_name[name]
        exp_labels = {**labels, **rule.get("labels", {})}
        context = {**exp_labels, "alertname": name}
        annotations = {k: _render(v, context) for k, v in rule.get("annotations", {}).items()}
        if "contributors" in annotations:
            annotations["contributors"] = rules.contributors_text(list(contributors))
        return {"exp_labels": exp_labels, "exp_annotations": annotations}


JOB = {"job": "evald"}


def _instance(n: int) -> Labels:
    return {**JOB, "instance": f"evald-{n}:9464"}


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
    busy_then_sparse = [float(start + 60 * i) for i in range(31)]
    busy_then_sparse += [busy_then_sparse[-1] + 600 * (i // 10) for i in range(1, 61)]
    return [
        {
            "name": "fault: a watermark that stops moving fires",
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
            "name": "noise: bursty watermark progress stays silent",
            "interval": "1m",
            "input_series": [{"series": selector, "values": gauge(bursty)}],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("20m", "40m", "60m")],
        },
        {
            "name": "low traffic: a watermark advanced only by the idle fallback stays silent",
            "interval": "1m",
            "input_series": [{"series": selector, "values": gauge(idle)}],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("20m", "40m", "60m")],
        },
        {
            # every minute's events move it a minute; then an event (or the idle fallback)
            # only every ten minutes moves it ten
            "name": "traffic change: a watermark slowing down as traffic falls ten-fold stays "
            "silent",
            "interval": "1m",
            "input_series": [
                {"series": selector, "values": gauge(busy_then_sparse)},
            ],
            "alert_rule_test": [
                {"eval_time": t, "alertname": name} for t in ("40m", "60m", "75m", "90m")
            ],
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
            "name": "fault: impressions accepted but finalization stops fires",
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
            "name": "noise: finalization in bursts every 10 minutes stays silent",
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
            "name": "low traffic: one impression every 20 minutes, each finalized 32 minutes "
            "later, is silent",
            "interval": "1m",
            "input_series": [
                {"series": accepted, "values": steps(every_20, 180)},
                {"series": finalized, "values": steps([m + 32 for m in every_20], 180)},
            ],
            "alert_rule_test": [
                {"eval_time": t, "alertname": name} for t in ("60m", "100m", "140m", "180m")
            ],
        },
        {
            "name": "traffic change: impressions falling fifty-fold, each finalized 32 minutes "
            "later, is silent",
            "interval": "1m",
            "input_series": [
                {"series": accepted, "values": values(0, [(60, 100), (120, 2)])},
                {"series": finalized, "values": values(0, [(32, 0), (60, 100), (88, 2)])},
            ],
            "alert_rule_test": [
                {"eval_time": t, "alertname": name} for t in ("60m", "100m", "140m", "180m")
            ],
        },
    ]


def _ratio_tests(alerts: _Alerts) -> list[Case]:
    inst = _instance(0)
    names = ("EvaldHighRejectedRate", "EvaldHighLateFeedbackRate", "EvaldHighOrphanedFeedbackRate")

    def series(
        imp: float, fb: float, rejected: list[float], late: list[float], fall_at: int = 40
    ) -> list[dict]:
        """Per-minute increments; impressions and feedback fall ten-fold from ``fall_at``."""

        def ev(kind: str, outcome: str) -> str:
            return _selector("evald_events_total", {"kind": kind, "outcome": outcome, **inst})

        def un(reason: str) -> str:
            return _selector("evald_feedback_unattributed_total", {"reason": reason, **inst})

        return [
            {
                "series": ev("impression", "accepted"),
                "values": values(0, [(fall_at, imp), (40 - fall_at, imp / 10)]),
            },
            {
                "series": ev("feedback", "accepted"),
                "values": values(0, [(fall_at, fb), (40 - fall_at, fb / 10)]),
            },
            {"series": ev("unknown", "rejected"), "values": values(0, [(1, r) for r in rejected])},
            {"series": un("late"), "values": values(0, [(1, x) for x in late])},
            {"series": un("orphaned"), "values": values(0, [(1, x) for x in late])},
        ]

    rng = random.Random(11)
    return [
        {
            # 100 of 1100 events rejected (9%), 60 of 600 feedback late and orphaned (10%)
            "name": "fault: high rejected, late and orphaned rates fire",
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
            "name": "noise: noisy rates under the thresholds stay silent",
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
            "name": "low traffic: high ratios at low traffic stay silent",
            "interval": "1m",
            "input_series": series(8, 8, [4] * 40, [2] * 40),
            "alert_rule_test": [
                {"eval_time": t, "alertname": n} for t in ("20m", "35m") for n in names
            ],
        },
        {
            # 3% of events rejected, 3% of feedback late and orphaned, before and after traffic
            # falls ten-fold at minute 20 (still above the guard)
            "name": "traffic change: ratios under the thresholds as traffic falls ten-fold "
            "stay silent",
            "interval": "1m",
            "input_series": series(
                400,
                600,
                [rng.choice([20, 30, 40]) for _ in range(20)]
                + [rng.choice([2, 3, 4]) for _ in range(20)],
                [rng.choice([12, 18, 24]) for _ in range(20)]
                + [rng.choice([1, 2, 3]) for _ in range(20)],
                fall_at=20,
            ),
            "alert_rule_test": [
                {"eval_time": t, "alertname": n} for t in ("20m", "28m", "35m") for n in names
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
            "name": "fault: lag growing past the threshold fires",
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
            "name": "noise: noisy lag under the threshold stays silent",
            "interval": "1m",
            "input_series": [
                {"series": lag(p), "values": gauge([rng.uniform(0, 20000) for _ in range(61)])}
                for p in (0, 1)
            ],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("30m", "60m")],
        },
        {
            "name": "noise: high lag that is shrinking (catching up) stays silent",
            "interval": "1m",
            "input_series": [
                {"series": lag(p), "values": values(200_000, [(60, -1500)])} for p in (0, 1)
            ],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("30m", "60m")],
        },
        {
            "name": "low traffic: an idle partition's lag of a few records, never consumed, "
            "stays silent",
            "interval": "1m",
            "input_series": [{"series": lag(p), "values": "3x60"} for p in (0, 1)],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("30m", "60m")],
        },
        {
            # 80 000 records behind at the peak, above the threshold for about eleven minutes
            "name": "traffic change: a ten-fold burst lifts the lag past the threshold, then it "
            "is consumed: silent",
            "interval": "1m",
            "input_series": [
                {"series": lag(p), "values": values(0, [(10, 4000), (20, -2000), (30, 0)])}
                for p in (0, 1)
            ],
            "alert_rule_test": [
                {"eval_time": t, "alertname": name} for t in ("15m", "20m", "30m", "60m")
            ],
        },
    ]


def _ready_tests(alerts: _Alerts) -> list[Case]:
    name = "EvaldNotReady"
    inst = _instance(0)
    ready = _selector("evald_ready", inst)
    return [
        {
            "name": "fault: not ready for longer than for: fires",
            "interval": "1m",
            "input_series": [{"series": ready, "values": values(1, [(10, 0), (1, -1), (30, 0)])}],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": name},
                {"eval_time": "25m", "alertname": name, "exp_alerts": [alerts.expect(name, inst)]},
            ],
        },
        {
            "name": "noise: a short not-ready blip (restart, rebalance) stays silent",
            "interval": "1m",
            "input_series": [
                {"series": ready, "values": values(1, [(10, 0), (1, -1), (5, 0), (1, 1), (20, 0)])}
            ],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("15m", "30m")],
        },
    ]


def _certificate_tests(alerts: _Alerts) -> list[Case]:
    """Times are seconds from the start of the test (promtool's time() starts at 0)."""
    name = "EvaldTLSCertificateExpiresSoon"
    inst = _instance(0)
    expiry = _selector("evald_tls_certificate_expiry_timestamp_seconds", inst)
    day = 86_400
    month = values(30 * day, [(20, 0)])
    return [
        {
            "name": "fault: a certificate 10 days from expiry fires",
            "interval": "1m",
            "input_series": [{"series": expiry, "values": values(10 * day, [(60, 0)])}],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": name},
                {"eval_time": "30m", "alertname": name, "exp_alerts": [alerts.expect(name, inst)]},
            ],
        },
        {
            "name": "noise: a certificate 30 days from expiry, scrapes missing over a restart, "
            "stays silent",
            "interval": "1m",
            "input_series": [{"series": expiry, "values": f"{month} _x10 {month}"}],
            "alert_rule_test": [{"eval_time": t, "alertname": name} for t in ("15m", "45m")],
        },
    ]


RULE_FILES = ["../rules/evald-recording.rules.yml", "../rules/evald-alerts.rules.yml"]


def build(spec: Spec) -> dict[str, Any]:
    """Every alert's scenarios (an hour or four each), evaluated every minute."""
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
            *_certificate_tests(alerts),
            *statistics_tests(spec, alerts.expect),
            *contributor_tests(spec, alerts.expect),
            *interleaving_tests(spec, alerts.expect),
            *zero_feedback_tests(spec, alerts.expect),
            *click_tests(spec, alerts.expect),
            *down_tests(spec, alerts.expect),
        ],
    }
