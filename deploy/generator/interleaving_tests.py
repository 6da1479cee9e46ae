"""``promtool test rules`` scenarios for the interleaving alerts.

The input series are what evald exports, computed by evald's own fold
(``evald.interleaving.fold``) over simulated 5-minute windows with fixed seeds: team B better
(a win), team B worse (a loss), no preference (noise), a preference at low traffic, and a biased
draft coin. Each window's values are held for its five 1-minute samples. What each scenario must
do is stated here and checked twice: the generator refuses to render a scenario whose folded
values do not behave as stated, and promtool checks the rules on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from deploy.generator.spec import Spec
from deploy.generator.statistics_tests import WINDOW_MIN, WINDOWS, sample_values
from evald.interleaving.fold import PreferenceState, Settings, fold_window
from evald.interleaving.sums import PairSums

Case = dict[str, Any]
Labels = dict[str, str]
JOB = {"job": "evald"}
INSTANCE = {**JOB, "instance": "evald-0:9464"}
TIES = 0.2  # share of compared lists that are ties

SECOND = "EvaldInterleavingSecondTeamWins"
FIRST = "EvaldInterleavingFirstTeamWins"
COIN = "EvaldInterleavingCoinBiased"
NAMES = (SECOND, FIRST, COIN)


def _cell(spec: Spec) -> tuple[tuple[str, ...], str, str]:
    return (tuple("search" for _ in spec.segment_labels), "A", "B")


def _fold(
    spec: Spec, seed: int, compared: Callable[[int], int], edge: float, coin: float
) -> list[PreferenceState]:
    """The test's state after each window: ``compared(w)`` lists in window w where either team
    earned credit (a wins a non-tie with probability (1 + edge)/2), as many again where
    nobody clicked, and team a leading each list with probability ``coin``."""
    th = spec.thresholds
    settings = Settings(alpha=th.family_alpha, srm_alpha=th.srm_alpha)
    rng = np.random.default_rng(seed)
    state = PreferenceState()
    states = []
    for w in range(WINDOWS):
        n = compared(w)
        ties = int(rng.binomial(n, TIES))
        wins_a = int(rng.binomial(n - ties, (1 + edge) / 2))
        sums = PairSums(2 * n, int(rng.binomial(2 * n, coin)), wins_a, n - ties - wins_a, ties)
        state = fold_window(state, (w + 1) * WINDOW_MIN * 60_000, {_cell(spec): sums}, settings)
        states.append(state)
    return states


def _fired(spec: Spec, last: PreferenceState) -> set[str]:
    """The alerts the final values call for, by the rules' own conditions."""
    cell = _cell(spec)
    if last.srm_p_value(cell) < spec.thresholds.srm_alpha:
        return {COIN}
    bound = last.pairs[cell].bound
    out = set()
    if bound.high < 0:
        out.add(SECOND)
    if bound.low > 0:
        out.add(FIRST)
    return out


def _inputs(spec: Spec, states: list[PreferenceState]) -> list[dict[str, str]]:
    cell = _cell(spec)
    labels = {**INSTANCE, **dict(zip(spec.segment_labels, cell[0], strict=True))}
    labels.update(team_a="A", team_b="B")
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    parts: dict[str, Callable[[PreferenceState], float]] = {
        "upper": lambda s: s.pairs[cell].bound.high,
        "lower": lambda s: s.pairs[cell].bound.low,
        "srm_p_value": lambda s: s.srm_p_value(cell),
    }
    return [
        {
            "series": f"evald_interleaving_{part}{{{inner}}}",
            "values": sample_values([read(s) for s in states]),
        }
        for part, read in parts.items()
    ]


def interleaving_tests(spec: Spec, expect: Callable[[str, Labels], dict[str, Any]]) -> list[Case]:
    """Win, loss, noise, low traffic and a biased coin, by one instance."""

    def steady(w: int) -> int:
        return 200

    scenarios: list[tuple[str, int, Callable[[int], int], float, float, set[str]]] = [
        (
            "fault: team B wins 55% of the non-tied lists: B beats A",
            21,
            steady,
            -0.1,
            0.5,
            {SECOND},
        ),
        ("fault: team B wins 45%: B loses to A (A beats B)", 22, steady, 0.1, 0.5, {FIRST}),
        ("noise: no preference stays silent", 23, steady, 0.0, 0.5, set()),
        ("low traffic: B wins 55% of 5 lists a window: silent", 24, lambda w: 5, -0.1, 0.5, set()),
        (
            "traffic change: no preference, the traffic falling ten-fold half-way: silent",
            26,
            lambda w: 200 if w < WINDOWS // 2 else 20,
            0.0,
            0.5,
            set(),
        ),
        (
            "fault: team A leads 45% of the lists: the coin guard fires and holds back B's win",
            25,
            steady,
            -0.1,
            0.45,
            {COIN},
        ),
    ]
    cell = _cell(spec)
    labels = {**JOB, **dict(zip(spec.segment_labels, cell[0], strict=True))}
    labels.update(team_a="A", team_b="B")
    end = f"{WINDOWS * WINDOW_MIN - 1}m"
    cases: list[Case] = []
    for title, seed, compared, edge, coin, fires in scenarios:
        states = _fold(spec, seed, compared, edge, coin)
        got = _fired(spec, states[-1])
        if got != fires:
            raise AssertionError(f"scenario {title!r}: the fold gives {got}, not {fires}")
        tests: list[dict[str, Any]] = [{"eval_time": "4m", "alertname": n} for n in NAMES]
        for name in NAMES:
            alerts = [expect(name, labels)] if name in fires else []
            tests.append({"eval_time": end, "alertname": name, "exp_alerts": alerts})
        cases.append(
            {
                "name": title,
                "interval": "1m",
                "input_series": _inputs(spec, states),
                "alert_rule_test": tests,
            }
        )
    return cases
