"""Family-wise error control across the measures × segments that alert.

Each comparison's sequence is valid alone; m of them looked at together raise m times the false
alarms. Two rules, both keeping the family-wise error rate — the chance that *any* true null is
ever flagged, over all comparisons and all looks — at most α:

- Bonferroni: run every sequence at α/m (its bounds are then simultaneous bands).
- Holm on the always-valid p-values: step-down, never less powerful than Bonferroni. Valid
  uniformly over time because Holm only rejects a true null when some true null's p-value is
  ≤ α/m0, and each always-valid p-value crosses α/m0 ever with chance ≤ α/m0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["bonferroni_alpha", "holm_reject"]


def bonferroni_alpha(alpha: float, family_size: int) -> float:
    """α/m, the level of each of m sequences for a family-wise rate α."""
    if family_size < 1 or not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be in (0, 1) and the family non-empty")
    return alpha / family_size


def holm_reject(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down: sorted p_(i) rejected while p_(i) ≤ α/(m − i), i = 0, 1, ..."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    order = np.argsort(p, kind="stable")
    reject = np.zeros(m, dtype=bool)
    for rank, index in enumerate(order):
        if not p[index] <= alpha / (m - rank):
            break
        reject[index] = True
    return reject.tolist()
