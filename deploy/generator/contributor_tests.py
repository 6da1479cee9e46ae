"""``promtool test rules`` scenario for the drop alerts' ``contributors`` annotation.

Two instances export ``evald_drop_contributor`` for the drop that fires the three drop
alerts, each its own top three (each attributes over the partitions it owns), plus the top
contributor of another measure and of the control arm. The annotation must name, in order,
the three values with the largest share any instance gives them, and nothing of the other
measure or arm; promtool expands the template's ``query`` against the test's series. The
other drop scenarios (deploy/generator/statistics_tests.py) export no contributor and expect
the annotation's "none attributed" text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deploy.generator.spec import Spec
from deploy.generator.statistics_tests import BELOW, COMPARISON, VS_BASELINE, VS_CONTROL

Case = dict[str, Any]
Labels = dict[str, str]
JOB = {"job": "evald"}
MINUTES = 12
#: per instance, (dimension, value, share) ranked 1 to 3
EXPORTED = (
    (("query", "running shoes", 0.5), ("query", "rain jacket", 0.25), ("query", "socks", 0.1)),
    (("query", "running shoes", 0.45), ("query", "tent", 0.2)),
)
#: the annotation's contributors: the largest share of each value, the three largest
NAMED = [("query", "running shoes", 0.5), ("query", "rain jacket", 0.25), ("query", "tent", 0.2)]


def _series(name: str, labels: Labels, value: float) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": f"{value:g}x{MINUTES}"}


def contributor_tests(spec: Spec, expect: Callable[..., dict[str, Any]]) -> list[Case]:
    measure, other = spec.measures[0], spec.measures[1]
    rest = {k: "search" for k in spec.comparison_labels}
    comp = {**JOB, "comparison": COMPARISON}
    arm = {**comp, "measure": measure, **rest, spec.arm_label: spec.treatment}
    inputs = [_series("evald_cusum_threshold", {**comp, "instance": "evald-0:9464"}, 5)]
    for n, exported in enumerate(EXPORTED):
        instance = {"instance": f"evald-{n}:9464"}
        inputs += [
            _series("evald_comparison_upper", {**arm, **instance}, -0.05),
            _series("evald_comparison_min_effect", {**comp, "measure": measure, **instance}, 0.01),
            _series("evald_cusum_vs_control", {**arm, **instance}, 9),
            _series("evald_cusum_vs_baseline", {**arm, **instance}, 9),
        ]
        for rank, (dimension, value, share) in enumerate(exported, 1):
            row = {"rank": str(rank), "dimension": dimension, "value": value}
            inputs.append(_series("evald_drop_contributor", {**arm, **instance, **row}, share))
        for elsewhere in ({"measure": other}, {spec.arm_label: spec.control}):
            row = {"rank": "1", "dimension": "query", "value": f"not this one {n}"}
            labels = {**arm, **instance, **elsewhere, **row}
            inputs.append(_series("evald_drop_contributor", labels, 0.9))
    return [
        {
            "name": "fault: a drop attributed by two instances: each drop alert names its three "
            "largest contributors, in order, and nothing of another measure or arm",
            "interval": "1m",
            "input_series": inputs,
            "alert_rule_test": [
                {
                    "eval_time": f"{MINUTES - 1}m",
                    "alertname": name,
                    "exp_alerts": [expect(name, arm, NAMED)],
                }
                for name in (BELOW, VS_CONTROL, VS_BASELINE)
            ],
        }
    ]
