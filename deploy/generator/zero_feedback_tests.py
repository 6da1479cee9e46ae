"""``promtool test rules`` scenarios for the zero-feedback alerts.

The input is only what evald exports for the served lists (``evald_zero_feedback_mean`` and
``_lists`` of the 5m window, one value per window held for its five 1-minute samples): no
measure and no feedback series at all, as in the minutes after a ranker starts serving
different lists and before any click comes. Per alert: the quantity moving by 0.5 half-way
(fires), jittering around its level (noise), the same move on too few lists (low traffic) and
the lists falling with the level unchanged (traffic change). The generator checks each
scenario's values against the rule's condition before promtool checks the rules on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from deploy.generator.rules import ZERO_FEEDBACK_ALERTS
from deploy.generator.spec import Spec
from deploy.generator.statistics_tests import WINDOW_MIN, sample_values

Case = dict[str, Any]
Labels = dict[str, str]
JOB = {"job": "evald"}
INSTANCE = {**JOB, "instance": "evald-0:9464"}
WINDOWS = 22  # 110 minutes: the trailing hour, its gap and the change's for all fit
CHANGE = 16  # the window the fault starts in (minute 80)
EVAL = 104  # the minute the alert is checked: 24 minutes into the change
#: each quantity's usual level in the scenarios, and the direction the fault moves it
LEVELS = {"rbo": (0.85, -0.5), "unjudged": (0.2, 0.5), "empty": (0.02, 0.5)}


def _points(seed: int, level: float, move: float, noise: float) -> list[float]:
    rng = np.random.default_rng(seed)
    return [
        min(1.0, max(0.0, level + (move if w >= CHANGE else 0.0) + rng.normal(0, noise)))
        for w in range(WINDOWS)
    ]


def _moved(spec: Spec, name: str, points: list[float], lists: list[int]) -> bool:
    """The rule's condition, on the 1-minute samples, held for its ``for`` up to ``EVAL``:
    the window's value against the mean of the trailing hour that ends 15 minutes earlier."""
    th = spec.thresholds
    _, sign, attribute, _ = ZERO_FEEDBACK_ALERTS[name]
    threshold = float(getattr(th, attribute))
    values = np.repeat(points, WINDOW_MIN)
    counts = np.repeat(lists, WINDOW_MIN)

    def holds(t: int) -> bool:
        usual = float(values[t - 74 : t - 14].mean())
        now = float(values[t])
        past = now < usual - threshold if sign == "<" else now > usual + threshold
        return past and counts[t] >= th.zero_min_lists

    return all(holds(t) for t in range(EVAL - 10, EVAL + 1))


def zero_feedback_tests(spec: Spec, expect: Callable[[str, Labels], dict[str, Any]]) -> list[Case]:
    """Fault, noise, low traffic and a traffic change for each zero-feedback alert."""
    segment = {k: "search" for k in spec.segment_labels}
    segment[spec.arm_label] = spec.treatment
    labels = {**INSTANCE, **segment, "window": spec.thresholds.zero_window}
    alert_labels = {**JOB, spec.arm_label: spec.treatment}
    alert_labels.update({k: "search" for k in spec.comparison_labels})
    cases: list[Case] = []
    for index, name in enumerate(ZERO_FEEDBACK_ALERTS):
        quantity = ZERO_FEEDBACK_ALERTS[name][0]
        level, move = LEVELS[quantity]
        fault = f"a list change with no feedback at all: {quantity} moves by {abs(move):g}"
        scenarios = [
            (f"fault: {fault}, fires", _points(index, level, move, 0.01), 200, True),
            (
                f"noise: {quantity} jitters around its level",
                _points(10 + index, level, 0, 0.03),
                200,
                False,
            ),
            (
                f"low traffic: {fault} on 20 lists a window",
                _points(20 + index, level, move, 0.01),
                20,
                False,
            ),
            (
                f"traffic change: the lists fall from 200 to 60 a window, {quantity} unchanged",
                _points(30 + index, level, 0, 0.01),
                -1,
                False,
            ),
        ]
        for title, points, per_window, fires in scenarios:
            lists = [
                per_window if per_window > 0 else (200 if w < CHANGE else 60)
                for w in range(WINDOWS)
            ]
            if _moved(spec, name, points, lists) != fires:
                raise AssertionError(f"scenario {name} {title!r}: the values do not do that")
            series = {**labels, "quantity": quantity}
            inner = ", ".join(f'{k}="{v}"' for k, v in series.items())
            end = f"{EVAL}m"
            before = f"{CHANGE * WINDOW_MIN - 1}m"
            checks: list[dict[str, Any]] = [{"eval_time": before, "alertname": name}]
            expected = [expect(name, {**alert_labels, "quantity": quantity})] if fires else []
            checks.append({"eval_time": end, "alertname": name, "exp_alerts": expected})
            cases.append(
                {
                    "name": f"{title} ({name})",
                    "interval": "1m",
                    "input_series": [
                        {
                            "series": f"evald_zero_feedback_mean{{{inner}}}",
                            "values": sample_values(points),
                        },
                        {
                            "series": f"evald_zero_feedback_lists{{{inner}}}",
                            "values": sample_values([float(n) for n in lists]),
                        },
                    ],
                    "alert_rule_test": checks,
                }
            )
    return cases
