"""A/A streams where users come back: every user has a click propensity of their own (none,
mild, strong), a heavy-tailed number of lists (a few with hundreds) in sessions spread over the
stream, and lists on two surfaces. Looked at after every one of 34 windows, the comparison's
sequence flags at most α of them and the CUSUMs alarm no more often than their stated run
length says, pooled over the surfaces and split by surface; the same folds with the variance
of independent lists (what evald did before) fail both as soon as users have an effect of their
own (the negative control). docs/statistics.md §3-§4 has the figures at scale
(``python -m benchmarks.clustered_bench``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evald.config import load_config
from evald.statistics.fold import ComparisonState, fold_window
from evald.statistics.simulation import (
    STRENGTHS,
    Traffic,
    baseline_alarms,
    cusum_alarms,
    iid_alarm_share,
    sequence_flags,
    simulate,
    with_pooled,
)

STREAMS = 150
ALPHA = 0.05
TUNING_N = 5000.0
WINDOWS = Traffic().windows


def limit(rate: float) -> float:
    """The rate plus three standard errors of a share over STREAMS streams."""
    return rate + 3 * math.sqrt(rate * (1 - rate) / STREAMS)


def false_alarms(sums: np.ndarray, list_level: bool) -> dict[str, float]:
    """Share of A/A streams flagged, per check: ``pooled`` is one sequence or CUSUM over both
    surfaces, ``split`` one per surface (any of them; the sequences at α/2, Bonferroni)."""
    pooled, split = sums[:, :, -1:], sums[:, :, :-1]
    out = {
        "sequence pooled": sequence_flags(pooled, ALPHA, TUNING_N, list_level=list_level)[:, 0],
        "sequence split": sequence_flags(split, ALPHA / 2, TUNING_N, list_level=list_level),
        "cusum pooled": cusum_alarms(pooled, list_level=list_level)[:, 0],
        "cusum split": cusum_alarms(split, list_level=list_level),
    }
    for arm in (0, 1):
        alarms = baseline_alarms(sums, arm, list_level=list_level)
        out[f"baseline {arm} pooled"] = alarms[:, -1]
        out[f"baseline {arm} split"] = alarms[:, :-1]
    return {k: float((v > 0).reshape(STREAMS, -1).any(axis=1).mean()) for k, v in out.items()}


@pytest.fixture(scope="module")
def limits() -> dict[str, float]:
    """Per check, the share it may reach: α (sequences) or the chance that independent N(0, 1)
    windows alarm within the stream (the CUSUMs' stated run length; of either surface when
    split), plus three standard errors."""
    one = iid_alarm_share(WINDOWS)
    either = 1 - (1 - one) ** 2
    out = {"sequence pooled": limit(ALPHA), "sequence split": limit(ALPHA)}
    for name in ("cusum", "baseline 0", "baseline 1"):
        out[f"{name} pooled"], out[f"{name} split"] = limit(one), limit(either)
    return out


@pytest.mark.parametrize("name", list(STRENGTHS))
def test_aa_with_returning_users_stays_within_alpha_and_the_run_length(
    name: str, limits: dict[str, float]
) -> None:
    strength = STRENGTHS[name]
    seed = 24_000 + list(STRENGTHS).index(name)
    sums = with_pooled(simulate(Traffic(strength=strength), STREAMS, seed))
    clustered = false_alarms(sums, list_level=False)
    old = false_alarms(sums, list_level=True)
    checked = set(clustered)
    if name == "strong":
        # an arm's window against its own baseline: windows of a few hundred lists hold a few
        # dozen users' worth of information here, too few for the normal approximation, and the
        # benchmark's 1000 streams put these CUSUMs a little over their run length (docs/
        # statistics.md, "Returning users"; within it at 4x the traffic); they are still far
        # below what the list-level variance gives
        baseline = {f"baseline {arm} {how}" for arm in (0, 1) for how in ("pooled", "split")}
        checked -= baseline
        for check in baseline:
            assert clustered[check] < old[check] / 1.5, (check, clustered, old)
    over = {k: clustered[k] for k in checked if clustered[k] > limits[k]}
    assert not over, f"{name}: {over} (limits {limits})"
    if strength == 0:
        return  # independent lists: the list-level variance is right, nothing to show
    # the negative control: the variance of independent lists on the same streams
    failed = {k for k, v in old.items() if v > limits[k]}
    want = {"sequence pooled", "cusum pooled", "cusum split"}
    if name == "strong":
        want |= {"sequence split", "baseline 0 split", "baseline 1 split"}
    assert want <= failed, f"{name}: list level {old}, limits {limits}"


def test_a_surface_with_a_tenth_of_the_lists_keeps_the_family_within_alpha(
    limits: dict[str, float],
) -> None:
    """Skewed surfaces: 10% of the lists on one (about 45 per arm and window, worth about 34
    users). The sequences and the CUSUMs against control stay within their limits pooled and
    per surface; the list-level ones do not. The baseline CUSUMs of windows that small run over
    their run length (docs/statistics.md, "Heavy users", "Known limits"): left out here."""
    traffic = Traffic(strength=STRENGTHS["mild"], first_segment_share=0.1)
    sums = with_pooled(simulate(traffic, STREAMS, 24_100))
    assert np.median(sums[:, :, 0, :, 0]) < 0.15 * np.median(sums[:, :, 1, :, 0])
    checked = ("sequence pooled", "sequence split", "cusum pooled", "cusum split")
    clustered = false_alarms(sums, list_level=False)
    assert all(clustered[k] <= limits[k] for k in checked), (clustered, limits)
    old = false_alarms(sums, list_level=True)
    assert old["sequence pooled"] > limits["sequence pooled"], old
    assert old["cusum pooled"] > limits["cusum pooled"], old


def _fold(sums: np.ndarray, pooled: bool) -> ComparisonState:
    """The engine's fold of one stream's window sums (arms × surfaces × windows × columns)."""
    config = load_config(
        measures=["RR"],
        label_keys=["arm", "surface"],
        statistics={
            "alpha": ALPHA,
            "tuning_n": TUNING_N,
            "comparisons": [
                {
                    "name": "aa",
                    "label": "arm",
                    "control": "c",
                    "treatments": ["t"],
                    "start": 0,
                    "arm_scoped_labels": ["surface"] if pooled else [],
                }
            ],
        },
    )
    (comparison,) = config.statistics.comparisons
    state = ComparisonState()
    for t in range(sums.shape[2]):
        segments = [
            ({"arm": arm, "surface": f"s{s}"}, sums[a, s, t][None, :])
            for a, arm in enumerate(("c", "t"))
            for s in range(sums.shape[1])
        ]
        state = fold_window(state, comparison, config.statistics, ["RR"], segments)
    return state


@pytest.mark.parametrize("pooled", [True, False], ids=["pooled", "split"])
def test_the_array_forms_are_the_engine_fold(pooled: bool) -> None:
    """The simulations above fold with array forms for speed; on these streams they flag and
    alarm exactly where ``fold_window`` (what the engine runs) does, sequence by sequence."""
    sums = simulate(Traffic(strength=0.35, users=1500), 8, seed=5)
    whole = with_pooled(sums)[:, :, -1:] if pooled else sums
    alpha = ALPHA if pooled else ALPHA / 2
    flags = sequence_flags(whole, alpha, TUNING_N) > 0
    alarms = cusum_alarms(whole) > 0
    base = [baseline_alarms(whole, arm) > 0 for arm in (0, 1)]
    seen = {"flags": 0, "alarms": 0}
    for i in range(sums.shape[1]):
        state = _fold(sums[:, i], pooled)
        for s in range(whole.shape[2]):
            rest = () if pooled else (("surface", f"s{s}"),)
            key = ("t", rest, "RR")
            assert state.sequences[key].excludes(0.0) == flags[i, s]
            assert state.bounds[key].clustered
            assert state.vs_control[key].alarmed == alarms[i, s]
            for arm, name in enumerate(("c", "t")):
                assert state.vs_baseline[(name, rest, "RR")].alarmed == base[arm][i, s]
            seen["flags"] += flags[i, s]
            seen["alarms"] += alarms[i, s] + base[0][i, s] + base[1][i, s]
    assert seen["flags"] + seen["alarms"] > 0  # some of them fire: the check compares something
