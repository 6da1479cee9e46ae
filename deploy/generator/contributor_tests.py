"""``promtool test rules`` scenarios for the drop alerts' ``contributors`` annotation.

1. The treatment's drop, flagged against the control and against its own baseline (all three
   drop alerts fire): two instances export ``evald_drop_contributor`` for each kind of drop
   (``against``), each its own top three (each attributes over the partitions it owns), plus
   the top contributor of another measure and of the control arm. EvaldTreatmentBelowControl
   and EvaldTreatmentDropDetected must name, in order, the three values of the drop against
   the control with the largest share any instance gives them; EvaldArmDropDetected those of
   the drop against the baseline. Each kind is the other's decoy: it carries larger shares, so
   an annotation that ignored ``against`` would name it.
2. The control arm's drop against its own baseline (EvaldArmDropDetected on the control): its
   annotation names the control's baseline contributors, not the treatment's, nor a decoy of
   the control under ``against="control"`` with larger shares.

promtool expands the template's ``query`` against the test's series. The other drop scenarios
(deploy/generator/statistics_tests.py) export no contributor and expect the annotation's "none
attributed" text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deploy.generator.spec import Spec
from deploy.generator.statistics_tests import BELOW, COMPARISON, VS_BASELINE, VS_CONTROL

Case = dict[str, Any]
Labels = dict[str, str]
#: per instance, (dimension, value, share) ranked 1 to 3
Exported = tuple[tuple[tuple[str, str, float], ...], ...]
JOB = {"job": "evald"}
MINUTES = 12
#: the treatment's drop against the control, per instance
EXPORTED: Exported = (
    (("query", "running shoes", 0.5), ("query", "rain jacket", 0.25), ("query", "socks", 0.1)),
    (("query", "running shoes", 0.45), ("query", "tent", 0.2)),
)
#: the annotation's contributors: the largest share of each value, the three largest
NAMED = [("query", "running shoes", 0.5), ("query", "rain jacket", 0.25), ("query", "tent", 0.2)]
#: the treatment's drop against its own baseline, per instance: with the drop against the
#: control, the three largest would be hiking boots, running shoes and rain jacket
BASELINE_EXPORTED: Exported = (
    (("query", "hiking boots", 0.55), ("query", "running shoes", 0.15), ("query", "stove", 0.1)),
    (("query", "hiking boots", 0.4), ("query", "stove", 0.12), ("surface", "app", 0.05)),
)
BASELINE_NAMED = [
    ("query", "hiking boots", 0.55),
    ("query", "running shoes", 0.15),
    ("query", "stove", 0.12),
]
#: the control arm's drop against its own baseline (one instance)
CONTROL_EXPORTED: Exported = (
    (("query", "umbrella", 0.4), ("surface", "app", 0.3), ("query", "boots", 0.2)),
)
CONTROL_NAMED = list(CONTROL_EXPORTED[0])


def _series(name: str, labels: Labels, value: float) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": f"{value:g}x{MINUTES}"}


def _contributors(labels: Labels, against: str, exported: Exported) -> list[dict[str, str]]:
    """Each instance's top three of one drop (``labels``: its comparison, measure and arm)."""
    out = []
    for n, rows in enumerate(exported):
        for rank, (dimension, value, share) in enumerate(rows, 1):
            row = {"rank": str(rank), "dimension": dimension, "value": value}
            instance = {"instance": f"evald-{n}:9464", "against": against}
            out.append(_series("evald_drop_contributor", {**labels, **instance, **row}, share))
    return out


def contributor_tests(spec: Spec, expect: Callable[..., dict[str, Any]]) -> list[Case]:
    measure, other = spec.measures[0], spec.measures[1]
    rest = {k: "search" for k in spec.comparison_labels}
    comp = {**JOB, "comparison": COMPARISON}
    arm = {**comp, "measure": measure, **rest, spec.arm_label: spec.treatment}
    control = {**arm, spec.arm_label: spec.control}
    threshold = _series("evald_cusum_threshold", {**comp, "instance": "evald-0:9464"}, 5)
    inputs = [threshold]
    for n in range(len(EXPORTED)):
        instance = {"instance": f"evald-{n}:9464"}
        inputs += [
            _series("evald_comparison_upper", {**arm, **instance}, -0.05),
            _series("evald_comparison_min_effect", {**comp, "measure": measure, **instance}, 0.01),
            _series("evald_cusum_vs_control", {**arm, **instance}, 9),
            _series("evald_cusum_vs_baseline", {**arm, **instance}, 9),
        ]
        for elsewhere in ({"measure": other}, {spec.arm_label: spec.control}):
            row = {"rank": "1", "dimension": "query", "value": f"not this one {n}"}
            for against in ("control", "baseline"):
                labels = {**arm, **instance, **elsewhere, **row, "against": against}
                inputs.append(_series("evald_drop_contributor", labels, 0.9))
    inputs += _contributors(arm, "control", EXPORTED)
    inputs += _contributors(arm, "baseline", BASELINE_EXPORTED)
    named = {BELOW: NAMED, VS_CONTROL: NAMED, VS_BASELINE: BASELINE_NAMED}
    decoy = [("query", "not the control's baseline", 0.95)]
    control_inputs = [
        threshold,
        _series("evald_cusum_vs_baseline", {**control, "instance": "evald-0:9464"}, 9),
        *_contributors(control, "baseline", CONTROL_EXPORTED),
        *_contributors(control, "control", (tuple(decoy),)),
        *_contributors(arm, "baseline", BASELINE_EXPORTED),
    ]
    return [
        {
            "name": "fault: a drop attributed by two instances: each drop alert names its three "
            "largest contributors, in order, of the drop it fires on (against control or "
            "baseline), and nothing of the other drop, another measure or arm",
            "interval": "1m",
            "input_series": inputs,
            "alert_rule_test": [
                {
                    "eval_time": f"{MINUTES - 1}m",
                    "alertname": name,
                    "exp_alerts": [expect(name, arm, contributors)],
                }
                for name, contributors in named.items()
            ],
        },
        {
            "name": "fault: the control arm drops against its own baseline: its "
            "EvaldArmDropDetected names the control's baseline contributors, not the "
            "treatment's",
            "interval": "1m",
            "input_series": control_inputs,
            "alert_rule_test": [
                {
                    "eval_time": f"{MINUTES - 1}m",
                    "alertname": VS_BASELINE,
                    "exp_alerts": [expect(VS_BASELINE, control, CONTROL_NAMED)],
                }
            ],
        },
    ]
