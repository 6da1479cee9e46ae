"""``promtool test rules`` scenarios for the alerts on evald's comparison statistics.

The input series are what evald exports, computed by evald's own fold
(``evald.statistics.fold``) over simulated 5-minute windows with fixed seeds: a real drop, A/A
noise, the same drop at low traffic, and A/A with a ten-fold traffic change. Each window's values
are held for its five 1-minute samples. What each scenario must do is stated here (fires on the
drop; silent on the other three) and checked twice: the generator refuses to render a scenario
whose folded values do not behave as stated, and promtool checks the rules on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from deploy.generator.spec import Spec
from evald.config import load_config
from evald.statistics.fold import ComparisonState, fold_window

Case = dict[str, Any]
Labels = dict[str, str]
WINDOW_MIN = 5  # minutes per window (one value per 1m sample, held for the window)
WINDOWS = 48
MIN_EFFECT = 0.01
COMPARISON = "ab"
JOB = {"job": "evald"}  # the job is Spec.app
INSTANCE = {**JOB, "instance": "evald-0:9464"}
#: ``evald run`` with two instances: each exports the same comparison series
TWO = ({**JOB, "instance": "evald-0:9464"}, {**JOB, "instance": "evald-1:9464"})
#: who exports a scenario's series: (instance labels, first window it no longer exports,
#: windows it lags behind the statistics topic)
Exporting = tuple[tuple[Labels, int, int], ...]
ALONE: Exporting = ((INSTANCE, WINDOWS, 0),)
BOTH: Exporting = ((TWO[0], WINDOWS, 0), (TWO[1], WINDOWS, 0))
ONE_DOWN: Exporting = ((TWO[0], WINDOWS // 2, 0), (TWO[1], WINDOWS, 0))
ONE_LAGGING: Exporting = ((TWO[0], WINDOWS, 0), (TWO[1], WINDOWS, 1))


def _settings(spec: Spec) -> Any:
    th = spec.thresholds
    return load_config(
        {
            "label_keys": list(spec.segment_labels),
            "measures": [spec.measures[0]],
            "statistics": {
                "window": "5m",
                "alpha": th.family_alpha,
                "srm_alpha": th.srm_alpha,
                "comparisons": [
                    {
                        "name": COMPARISON,
                        "label": spec.arm_label,
                        "control": spec.control,
                        "treatments": [spec.treatment],
                        "start": 0,
                        "arm_scoped_labels": list(spec.arm_scoped_labels),
                        "min_effect": {spec.measures[0]: MIN_EFFECT},
                    }
                ],
            },
        }
    )


def _segment(spec: Spec, arm: str) -> Labels:
    labels: Labels = {}
    for key in spec.segment_labels:
        if key == spec.arm_label:
            labels[key] = arm
        elif key in spec.arm_scoped_labels:
            labels[key] = "A" if arm == spec.control else "B"
        else:
            labels[key] = "search"
    return labels


def _fold(
    spec: Spec,
    seed: int,
    lists: Callable[[int], int],
    shift: Callable[[int], float],
    share: float = 1.0,
) -> list[ComparisonState]:
    """The comparison's state after each window: ``lists(w)`` lists of control and ``share``
    times as many of treatment, a measure of sd 0.3 around 0.5 (the treatment's moved by
    ``shift(w)``)."""
    config = _settings(spec)
    comp = config.statistics.comparisons[0]
    rng = np.random.default_rng(seed)
    state = ComparisonState()
    states = []
    for w in range(WINDOWS):
        segments = []
        for arm, delta, part in ((spec.control, 0.0, 1.0), (spec.treatment, shift(w), share)):
            n = round(lists(w) * part)
            y = rng.normal(0.5 + delta, 0.3, n)
            sums = np.asarray([[n, y.sum(), float(y @ y)]])
            segments.append((_segment(spec, arm), sums))
        state = fold_window(state, comp, config.statistics, [spec.measures[0]], segments)
        states.append(state)
    return states


def sample_values(points: list[float]) -> str:
    """One value per 1m sample; ``_`` (no sample) where the series is absent (NaN)."""
    out = []
    for value in points:
        text = "_" if not math.isfinite(value) else f"{value:.6g}"
        out += [text] * WINDOW_MIN
    return " ".join(out)


def _series(name: str, labels: Labels, points: list[float], until: int, lag: int) -> dict[str, str]:
    """``points`` each ``lag`` windows late, up to window ``until``, then no samples (the
    instance is down)."""
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    late = [math.nan] * lag + points[: len(points) - lag]
    kept = [v if w < until else math.nan for w, v in enumerate(late)]
    return {"series": f"{name}{{{inner}}}", "values": sample_values(kept)}


def _inputs(
    spec: Spec, states: list[ComparisonState], instance: Labels, until: int, lag: int
) -> list[dict[str, str]]:
    """The series one evald instance exports for these states (arm-scoped labels absent, as
    exported), ``lag`` windows late; from window ``until`` on it is down and exports nothing."""
    measure = spec.measures[0]
    rest = tuple((k, "search") for k in spec.comparison_labels)
    key = (spec.treatment, rest, measure)
    comp = {**instance, "comparison": COMPARISON}
    h = _settings(spec).statistics.cusum_h

    def segment(arm: str) -> Labels:
        return {**comp, "measure": measure, **dict(rest), spec.arm_label: arm}

    def series(name: str, labels: Labels, points: list[float]) -> dict[str, str]:
        return _series(name, labels, points, until, lag)

    def baseline(state: ComparisonState, arm: str) -> float:
        cusum = state.vs_baseline.get((arm, rest, measure))
        return math.nan if cusum is None else cusum.statistic

    upper = [s.bounds[key].high for s in states]
    return [
        series("evald_comparison_upper", segment(spec.treatment), upper),
        series("evald_comparison_min_effect", {**comp, "measure": measure}, [MIN_EFFECT] * WINDOWS),
        series(
            "evald_cusum_vs_control",
            segment(spec.treatment),
            [s.vs_control[key].statistic for s in states],
        ),
        *(
            series("evald_cusum_vs_baseline", segment(arm), [baseline(s, arm) for s in states])
            for arm in (spec.control, spec.treatment)
        ),
        series("evald_cusum_threshold", comp, [h] * WINDOWS),
        series(
            "evald_comparison_srm_p_value",
            {**comp, **dict(rest)},
            [s.srm_p_values()[rest] for s in states],
        ),
    ]


BELOW = "EvaldTreatmentBelowControl"
VS_CONTROL = "EvaldTreatmentDropDetected"
VS_BASELINE = "EvaldArmDropDetected"
SRM = "EvaldSampleRatioMismatch"
NAMES = (BELOW, VS_CONTROL, VS_BASELINE, SRM)


def _fired(spec: Spec, states: list[ComparisonState]) -> dict[str, set[str]]:
    """Which alerts the folded values call for at the end (arm values, per alert), by the
    rules' own conditions: the generator's check that a scenario does what it says."""
    measure = spec.measures[0]
    rest = tuple((k, "search") for k in spec.comparison_labels)
    last = states[-1]
    h = _settings(spec).statistics.cusum_h
    srm = last.srm_p_values()[rest] < spec.thresholds.srm_alpha
    out: dict[str, set[str]] = {name: set() for name in NAMES}
    if srm:
        out[SRM].add("")
        return out
    key = (spec.treatment, rest, measure)
    if last.bounds[key].high < -MIN_EFFECT:
        out[BELOW].add(spec.treatment)
    if last.vs_control[key].statistic > h:
        out[VS_CONTROL].add(spec.treatment)
    for arm in (spec.control, spec.treatment):
        cusum = last.vs_baseline.get((arm, rest, measure))
        if cusum is not None and cusum.statistic > h:
            out[VS_BASELINE].add(arm)
    return out


def statistics_tests(spec: Spec, expect: Callable[[str, Labels], dict[str, Any]]) -> list[Case]:
    """The scenarios, by one instance and by two (as under ``evald run``: the comparison alerts
    fire once, without an instance label); ``expect(alert, labels)`` gives promtool's expected
    alert."""
    drop = -0.03  # 1.4 standard errors of a window's difference at 500 lists per arm
    below = {BELOW: {spec.treatment}, VS_CONTROL: {spec.treatment}}
    scenarios: list[
        tuple[
            str,
            int,
            Callable[[int], int],
            Callable[[int], float],
            dict[str, set[str]],
            Exporting,
        ]
    ] = [
        (
            "fault: the treatment 0.03 below control from its start: below the minimum effect, and "
            "its CUSUM against control fires",
            11,
            lambda w: 500,
            lambda w: drop,
            below,
            ALONE,
        ),
        (
            "fault: the treatment drops by 0.03 after three hours: the CUSUMs against control and "
            "against its own baseline fire; the difference since the start is not yet below "
            "the minimum effect",
            12,
            lambda w: 500,
            lambda w: drop if w >= 36 else 0.0,
            {VS_CONTROL: {spec.treatment}, VS_BASELINE: {spec.treatment}},
            ALONE,
        ),
        ("noise: A/A noise stays silent", 13, lambda w: 500, lambda w: 0.0, {}, ALONE),
        (
            "low traffic: the same drop at 20 lists per arm per window stays silent",
            14,
            lambda w: 20,
            lambda w: drop,
            {},
            ALONE,
        ),
        (
            "traffic change: A/A with the traffic falling ten-fold half-way stays silent",
            15,
            lambda w: 500 if w < WINDOWS // 2 else 50,
            lambda w: 0.0,
            {},
            ALONE,
        ),
        (
            "fault: the treatment arm losing 10% of its lists: the sample-ratio guard fires "
            "and holds back the comparison's other alerts, although the treatment is also worse",
            16,
            lambda w: 500,
            lambda w: drop,
            {SRM: {""}},
            ALONE,
        ),
        (
            "fault: two instances export the same drop (evald run): each alert fires once, "
            "without an instance label",
            11,
            lambda w: 500,
            lambda w: drop,
            below,
            BOTH,
        ),
        (
            "fault: of two instances exporting the drop one goes down half-way (its series "
            "stop): the other's still fire the alerts, once",
            11,
            lambda w: 500,
            lambda w: drop,
            below,
            ONE_DOWN,
        ),
        (
            "fault: of two instances exporting the drop one lags a window behind the other "
            "(values differ): the alerts still fire once",
            11,
            lambda w: 500,
            lambda w: drop,
            below,
            ONE_LAGGING,
        ),
        (
            "fault: two instances and the treatment arm losing 10% of its lists: the guard fires "
            "once and holds back the comparison's other alerts",
            16,
            lambda w: 500,
            lambda w: drop,
            {SRM: {""}},
            BOTH,
        ),
        (
            "noise: A/A noise exported by two instances stays silent",
            13,
            lambda w: 500,
            lambda w: 0.0,
            {},
            BOTH,
        ),
    ]
    measure = spec.measures[0]
    rest = {k: "search" for k in spec.comparison_labels}
    end = f"{WINDOWS * WINDOW_MIN - 1}m"
    cases: list[Case] = []
    for title, seed, lists, shift, fires, exporting in scenarios:
        share = 0.9 if SRM in fires else 1.0
        states = _fold(spec, seed, lists, shift, share)
        got = _fired(spec, states)
        want = {name: set(fires.get(name, ())) for name in NAMES}
        if got != want:
            raise AssertionError(f"scenario {title!r}: the fold gives {got}, not {want}")
        tests: list[dict[str, Any]] = [{"eval_time": "4m", "alertname": n} for n in NAMES]
        for name in NAMES:
            alerts = []
            for arm in sorted(want[name]):
                labels = {**JOB, "comparison": COMPARISON, **rest}
                if name != SRM:
                    labels.update({"measure": measure, spec.arm_label: arm})
                alerts.append(expect(name, labels))
            tests.append({"eval_time": end, "alertname": name, "exp_alerts": alerts})
        cases.append(
            {
                "name": title,
                "interval": "1m",
                "input_series": [
                    one
                    for instance, until, lag in exporting
                    for one in _inputs(spec, states, instance, until, lag)
                ],
                "alert_rule_test": tests,
            }
        )
    return cases


def down_tests(spec: Spec, expect: Callable[[str, Labels], dict[str, Any]]) -> list[Case]:
    """evald not scraped (``up == 0``) and not scraped at all (no ``up`` series)."""
    up = f'up{{job="{spec.app}", instance="evald-0:9464"}}'
    other = 'up{job="node", instance="node-0:9100"}'
    return [
        {
            "name": "fault: evald failing its scrapes for longer than for: fires",
            "interval": "1m",
            "input_series": [{"series": up, "values": "1x10 0x20"}],
            "alert_rule_test": [
                {"eval_time": "13m", "alertname": "EvaldDown"},
                {
                    "eval_time": "20m",
                    "alertname": "EvaldDown",
                    "exp_alerts": [expect("EvaldDown", {**INSTANCE})],
                },
                {"eval_time": "20m", "alertname": "EvaldAbsent"},
            ],
        },
        {
            "name": "noise: a one-scrape failure stays silent",
            "interval": "1m",
            "input_series": [{"series": up, "values": "1x10 0 1x20"}],
            "alert_rule_test": [
                {"eval_time": t, "alertname": n}
                for t in ("12m", "20m")
                for n in ("EvaldDown", "EvaldAbsent")
            ],
        },
        {
            "name": "fault: no evald target at all (only another job is scraped): absent fires",
            "interval": "1m",
            "input_series": [{"series": other, "values": "1x30"}],
            "alert_rule_test": [
                {
                    "eval_time": "20m",
                    "alertname": "EvaldAbsent",
                    "exp_alerts": [expect("EvaldAbsent", {"job": spec.app})],
                }
            ],
        },
    ]
