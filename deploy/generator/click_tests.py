"""``promtool test rules`` scenarios for the examination-curve alert (the click model's
position-bias curve, docs/click-models.md).

Each scenario is five hours of one segment's curve at ranks 1-3, sampled every five minutes
with seeded noise, and the lists behind the fits: a shift of rank 3 at 4h (a page change that
moved the fold) fires by 5h; noise, the same shift at low traffic, and traffic falling ten-fold
(noisier fits) stay silent. The generator evaluates the rule's condition on the drawn values
itself and refuses a scenario whose curve does not move as stated, so noise cannot silently
turn into a fault or the reverse; promtool then checks the rules on them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from deploy.generator.spec import Spec

Case = dict[str, Any]
Labels = dict[str, str]
NAME = "EvaldExaminationCurveShifted"
JOB = {"job": "evald"}
INSTANCE = {**JOB, "instance": "evald-0:9464"}
CURVE = (1.0, 0.7, 0.5)  # examination at ranks 1-3 before any change
STEP_MIN = 5
SAMPLES = 5 * 60 // STEP_MIN + 1  # 0h to 5h
SHIFT_AT = 4 * 60 // STEP_MIN  # the sample where the fold moves (after a whole baseline)
MOVED = -0.2  # rank 3's examination after the change


def _num(value: float) -> str:
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def _curves(seed: int, noise: Callable[[int], float], shift: bool) -> list[list[float]]:
    """Per rank the curve's samples: the value, moved at rank 3 from ``SHIFT_AT`` when
    ``shift``, plus seeded Gaussian noise of standard deviation ``noise(sample)``; rank 1 is
    the scale's 1 and has no noise."""
    rng = random.Random(seed)
    out = []
    for rank, value in enumerate(CURVE):
        points = []
        for i in range(SAMPLES):
            mean = value + (MOVED if shift and rank == 2 and i >= SHIFT_AT else 0.0)
            points.append(mean if rank == 0 else mean + rng.gauss(0.0, noise(i)))
        out.append(points)
    return out


def _minutes(duration: str) -> int:
    return int(duration[:-1]) * {"m": 1, "h": 60}[duration[-1]]


def _moved(spec: Spec, points: list[float]) -> bool:
    """The rule's condition on one rank's samples, by hand: the last sample more than the
    shift away from the mean of the baseline's samples, at every sample of a span of
    ``examination_for`` ending at 5h (the scenarios' last check)."""
    th = spec.thresholds
    gap = _minutes(th.examination_gap) // STEP_MIN
    span = _minutes(th.examination_baseline) // STEP_MIN
    hold = _minutes(th.examination_for) // STEP_MIN
    end = SAMPLES - 1
    for i in range(end - hold, end + 1):
        window = points[i - gap - span + 1 : i - gap + 1]
        if abs(points[i] - sum(window) / len(window)) <= th.examination_shift:
            return False
    return True


def click_tests(spec: Spec, expect: Callable[[str, Labels], dict[str, Any]]) -> list[Case]:
    """Fault, noise, low traffic and a traffic change, by one instance."""
    th = spec.thresholds
    segment = {k: "search" for k in spec.segment_labels}
    scenarios: list[tuple[str, int, Callable[[int], float], bool, Callable[[int], float]]] = [
        (
            "fault: the fold moved: rank 3 examined 0.2 less from 4h",
            31,
            lambda i: 0.02,
            True,
            lambda i: 2000.0 + 50 * i,
        ),
        (
            "noise: the curve jitters around the same values: silent",
            32,
            lambda i: 0.02,
            False,
            lambda i: 2000.0 + 50 * i,
        ),
        (
            "low traffic: the same move behind too few lists: silent",
            33,
            lambda i: 0.02,
            True,
            lambda i: 300.0 + i,
        ),
        (
            "traffic change: traffic falls ten-fold half-way, noisier fits: silent",
            34,
            lambda i: 0.02 if i < SAMPLES // 2 else 0.035,
            False,
            lambda i: 2000.0 + (50 * i if i < SAMPLES // 2 else 25 * 60 + 5 * i),
        ),
    ]
    cases: list[Case] = []
    for title, seed, noise, shift, lists in scenarios:
        curves = _curves(seed, noise, shift)
        fires = shift and lists(SAMPLES - 1) >= th.examination_min_lists
        moved = any(_moved(spec, points) for points in curves)
        if moved != shift:
            raise AssertionError(f"scenario {title!r}: the curve moved {moved}, not {shift}")
        inputs = [
            {
                "series": "evald_click_examination{"
                + ", ".join(f'{k}="{v}"' for k, v in {**INSTANCE, **segment}.items())
                + f', rank="{rank + 1}"}}',
                "values": " ".join(_num(v) for v in points),
            }
            for rank, points in enumerate(curves)
        ]
        inputs.append(
            {
                "series": "evald_click_model_lists{"
                + ", ".join(f'{k}="{v}"' for k, v in {**INSTANCE, **segment}.items())
                + "}",
                "values": " ".join(_num(lists(i)) for i in range(SAMPLES)),
            }
        )
        alerts = [expect(NAME, {**JOB, **segment, "rank": "3"})] if fires else []
        cases.append(
            {
                "name": title,
                "interval": f"{STEP_MIN}m",
                "input_series": inputs,
                "alert_rule_test": [
                    {"eval_time": "3h55m", "alertname": NAME},
                    {"eval_time": "5h", "alertname": NAME, "exp_alerts": alerts},
                ],
            }
        )
    return cases
