"""The CUSUM against control when the measure's variance changes mid-stream (a new traffic mix,
a measure's scale): A/A stays within the run length's share (docs/statistics.md §4)."""

from __future__ import annotations

import math

import numpy as np

from evald.statistics.clustered import contrast, sums_of_rows
from evald.statistics.cusum import Cusum
from evald.statistics.simulation import Traffic, cusum_alarms, iid_alarm_share, simulate

WINDOWS = 68


def limit(rate: float, streams: int) -> float:
    return rate + 3 * math.sqrt(rate * (1 - rate) / streams)


def scaled(sums: np.ndarray, factor: float, at: int) -> np.ndarray:
    """Both arms' values times ``factor`` from window ``at`` on: sums, squares and replicate
    sums (columns 4 to 4 + B) scale, counts and weights do not."""
    out = sums.copy()
    out[..., at:, 1] *= factor
    out[..., at:, 2] *= factor * factor
    if sums.shape[-1] > 3:
        b = (sums.shape[-1] - 4) // 2
        out[..., at:, 4 : 4 + b] *= factor
    return out


def pooled_only(windows: np.ndarray) -> Cusum:
    """One stream's CUSUM against control (2 arms, windows, columns of list level) with each
    window standardized by the stream's variance pooled over every window so far and nothing
    else: the step before the pool forgot and before the window's own variance bounded it."""
    state, variance_sum, scale_sum = Cusum(), 0.0, 0.0
    for c, t in zip(sums_of_rows(windows[0]), sums_of_rows(windows[1]), strict=True):
        w = contrast(c, t)
        if min(c.n, t.n) < 30 or not (math.isfinite(w.difference) and w.variance > 0):
            continue
        scale = 1.0 / c.n + 1.0 / t.n
        variance_sum, scale_sum = variance_sum + w.variance, scale_sum + scale
        state = state.step(w.difference / math.sqrt(variance_sum / scale_sum * scale), 30)
    return state


def test_values_half_again_as_varied_half_way_hold_the_run_length_without_replicates() -> None:
    """Independent lists (~220 per arm and window) without user ids, values ×1.5 from window
    34 of 68: 5.3% of 150 A/A streams alarm (limit 12%). Standardized by a variance pooled over
    every earlier window, the z's after the change were ~1.2 SE wide: 24%."""
    sums = simulate(Traffic(strength=0.0, replicates=0, windows=WINDOWS, segments=1), 150, 5)
    changed = scaled(sums, 1.5, WINDOWS // 2)
    bound = limit(iid_alarm_share(WINDOWS, 20_000), 150)
    assert (cusum_alarms(changed) > 0).mean() <= bound
    assert np.mean([pooled_only(changed[:, i, 0]).alarmed for i in range(150)]) > bound


def test_values_twice_as_varied_half_way_hold_the_run_length_with_replicates() -> None:
    """Returning users (1,500, 2 surfaces), values ×2 from window 34 of 68: 2.5% of 200 A/A
    streams and surfaces alarm. The run's own replicates had bounded the never-forgetting
    pool here too (2.5%): this pins the window's own variance and the forgetting pool as safe
    with replicates, where the list-level test above is the one the old step failed."""
    sums = simulate(Traffic(users=1500, strength=0.2, windows=WINDOWS), 100, 9)
    changed = scaled(sums, 2.0, WINDOWS // 2)
    bound = limit(iid_alarm_share(WINDOWS, 20_000), 200)
    assert (cusum_alarms(changed) > 0).mean() <= bound
